"""inferwatch: a sidecar Prometheus exporter for LLM inference servers."""

__version__ = "0.1.0"
