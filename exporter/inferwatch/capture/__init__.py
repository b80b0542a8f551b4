"""Evidence capture: a profiler trace, the server's stacks and the pages around a cause.

When a cause named by ``--capture-on`` holds (or on ``POST /capture``), the exporter records
for a few seconds what the runbook's deep step needs (:mod:`.evidence`); :mod:`.capturer`
decides when, :mod:`.store` keeps the archives within a disk bound.
"""
