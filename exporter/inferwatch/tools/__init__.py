"""Tools: the operator's subcommands besides ``serve``.

``sweep/`` (``inferwatch baseline``: the load sweep), ``calibrate`` (sweep -> config),
``diagnose`` (the method walked over live data), ``generate`` (rules, runbooks, dashboards),
``readme`` (the README's metric table from the contract).
"""
