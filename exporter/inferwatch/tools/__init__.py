"""Tools: the operator's subcommands besides ``serve``.

``sweep/`` (``inferwatch baseline``: the load sweep), ``calibrate`` (sweep -> config),
``diagnose`` (the method walked over live data), ``generate`` (rules, runbooks, dashboards),
``docs`` (the docs pages' generated tables: flags, metrics, alerts, the backends matrix).
"""
