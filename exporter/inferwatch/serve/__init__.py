"""Serve: the sidecar's HTTP side (``/metrics``, ``/healthz``, the verdict and runbook pages,
TLS and basic auth). Nothing here imports the tools or the dashboard builder.
"""
