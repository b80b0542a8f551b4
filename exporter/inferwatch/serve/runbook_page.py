"""``GET /runbooks/<Alert>``: an alert's runbook, served by the sidecar itself.

The very text ``inferwatch generate`` writes to ``alerts/runbooks/<Alert>.md``
(:func:`~inferwatch.method.rules.runbook_markdown`), with the thresholds of the spec the
exporter judges with, rendered as HTML (Python-Markdown, raw HTML escaped): on-call opens it from the verdict
page, ``diagnose`` or an alert's ``runbook_url`` on a cluster without internet. Behind the
web config's auth, as every page but ``/healthz``.
"""

from __future__ import annotations

import html

import markdown

from inferwatch.method.alerts import ALERTS
from inferwatch.method.rules import runbook_markdown, slo_runbook_markdown
from inferwatch.method.slo import ALERT_NAMES as SLO_ALERTS
from inferwatch.method.spec import Spec

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}: inferwatch runbook</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 60em; margin: 2em auto; padding: 0 1em;
  line-height: 1.45; color: #1d1d1f; }}
pre {{ background: #f4f4f6; padding: .8em; overflow-x: auto; }}
code {{ font-size: .92em; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: .25em .5em; }}
</style></head>
<body><p><a href="../">&larr; the verdict</a></p>
{body}
</body></html>
"""


class RunbookPages:
    """The runbook pages under one spec, each rendered on first request."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self._pages: dict[str, str] = {}

    def page(self, name: str) -> str | None:
        """The runbook page of alert ``name``; None for no alert of ours."""
        if name not in self._pages:
            if name in ALERTS:
                text = runbook_markdown(self.spec, ALERTS[name])
            elif name in SLO_ALERTS:
                text = slo_runbook_markdown(self.spec, name)
            else:
                return None
            body = _markdown().convert(text)
            self._pages[name] = _PAGE.format(title=html.escape(name), body=body)
        return self._pages[name]


def _markdown() -> markdown.Markdown:
    """Python-Markdown with raw HTML escaped, not passed through: a runbook quotes config
    values (the exporter's selector), and no value may become markup."""
    md = markdown.Markdown(extensions=["tables", "fenced_code"])
    md.preprocessors.deregister("html_block")
    md.inlinePatterns.deregister("html")
    return md
