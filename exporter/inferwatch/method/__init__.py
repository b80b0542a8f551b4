"""Method: the troubleshooting method as data, and what is built from it.

Phase first (prefill or decode), then layer (compute, memory, scheduling, system), against a
baseline. ``thresholds`` (where a threshold lives), ``spec`` (thresholds + timing + labels from
the config), ``signals`` (each quantity in PromQL and as a local recipe), ``recording`` (the
recording rules), ``alerts`` (the alert table: one module per layer, each alert with its
runbook template and its promtool scenarios), ``scenario`` (those scenarios' series
builder), ``slo`` (objectives, burn-rate alerts), ``runbooks`` (the templates' loader),
``rules`` (rules file, Alertmanager example, runbook pages) and ``local`` (the signals and
alert conditions evaluated from an exporter's own pages).
"""
