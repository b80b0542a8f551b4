"""The dashboards' data source and variables: cluster, namespace, backend, model, instance.

Each query variable is multi-select with All by default (All = ``.*``, so series without the
label match too); ad-hoc filters come last.
"""

from __future__ import annotations

from grafanalib.core import Template, Templating

from inferwatch.metrics import ALL

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
_BACKEND_UP = ALL["backend_up"].name
_BACKEND_INFO = ALL["backend_info"].name
# The query variables, in their order on the dashboard: (name, label, query).
QUERY_VARIABLES = [
    ("cluster", "Cluster", f"label_values({_BACKEND_UP}, cluster)"),
    (
        "namespace",
        "Namespace",
        f'label_values({_BACKEND_UP}{{cluster=~"$cluster"}}, namespace)',
    ),
    (
        "backend",
        "Backend",
        f'label_values({_BACKEND_INFO}{{namespace=~"$namespace", cluster=~"$cluster"}}, backend)',
    ),
    (
        "model",
        "Model",
        f'label_values({_BACKEND_INFO}{{backend=~"$backend", namespace=~"$namespace", '
        'cluster=~"$cluster"}, model)',
    ),
    (
        "instance",
        "Instance",
        f'label_values({_BACKEND_UP}{{backend=~"$backend", namespace=~"$namespace", '
        'cluster=~"$cluster"}, instance)',
    ),
]
ADHOC = "filters"


def variables() -> Templating:
    """Data source, then cluster, namespace, backend, model, instance, then ad-hoc filters."""

    def query(name: str, label: str, expr: str) -> Template:
        return Template(
            name=name,
            label=label,
            query={"query": expr, "refId": name},
            dataSource=DATASOURCE,
            includeAll=True,
            multi=True,
            allValue=".*",
            default="$__all",
            refresh=2,  # on time-range change: new replicas appear
        )

    return Templating(
        list=[
            Template(
                name="datasource",
                label="Data source",
                query="prometheus",
                type="datasource",
                default="Prometheus",
            ),
            *(query(*v) for v in QUERY_VARIABLES),
            {"name": ADHOC, "label": "Filters", "type": "adhoc", "datasource": DATASOURCE},
        ]
    )
