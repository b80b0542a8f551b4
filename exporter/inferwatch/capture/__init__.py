"""Evidence capture: a profiler trace, the server's stacks and the pages around a cause.

When a cause named by ``--capture-on`` has held on the verdict for its ``for`` (or on
``POST /capture``), the exporter records, for a few seconds, what the runbook's deep step
needs: the server's own profiler trace (:mod:`.trace`), py-spy stack samples of the
server's processes (:mod:`.stacks`), the server's and the exporter's pages before and after,
the verdict at the trigger and a manifest (each a part, :mod:`.evidence`). :mod:`.capturer`
decides when (one at a time, a minimum interval); :mod:`.store` keeps the archives within a
disk bound.
"""
