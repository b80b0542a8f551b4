"""Collect: scrape -> normalize -> derive -> snapshot.

``upstream`` reads the server's ``/metrics`` (bounded, with timeouts); ``textparse`` scans the
families a backend maps; ``backends/`` map each server onto the metric contract; ``gpu``
samples NVML; ``derive`` computes queued-while-idle and the decode floor; ``poller`` runs the
loop and publishes immutable :class:`~inferwatch.model.Snapshot` s that ``serve`` renders.
"""
