"""Serve: the sidecar's HTTP side.

``command`` assembles ``inferwatch serve`` from its options; ``web`` answers ``/metrics``,
``/healthz`` and the landing page; ``exposition`` renders a snapshot once per poll, ending
with ``selfmetrics`` (the exporter's own ``process_*``/``python_*``); ``webconfig`` reads the
exporter-toolkit web config (TLS, headers, and the users ``basic_auth`` checks);
``request_checks`` refuses what a browser may be made to send; ``listener`` serves the app
on the listening sockets, connections capped below the open-file limit. Nothing here
imports the tools or the dashboard builder.
"""
