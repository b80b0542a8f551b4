"""Serve: the sidecar's HTTP side.

``command`` assembles ``inferwatch serve`` from its options; ``web`` answers ``/metrics``,
``/healthz`` and the landing page; ``exposition`` renders a snapshot once per poll;
``webconfig`` reads the exporter-toolkit web config (TLS, basic auth). Nothing here imports
the tools or the dashboard builder.
"""
