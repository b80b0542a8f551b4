"""Method: the troubleshooting method as data, and what is built from it.

Phase first (prefill or decode), then layer (compute, memory, scheduling, system), against a
baseline: thresholds, signals, alerts with their runbooks and promtool scenarios, recording
and SLO rules, and the same conditions evaluated locally over an exporter's pages.
"""
