"""``inferwatch serve``'s settings once resolved: checked as a whole (what no single flag can
check alone), and turned into the parts' settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from inferwatch.capture.capturer import CaptureSettings
from inferwatch.capture.store import CaptureStore
from inferwatch.collect.canary import CanarySettings
from inferwatch.collect.derive import weights_bytes_in
from inferwatch.collect.upstream import Upstream
from inferwatch.serve.otlp import DEFAULT_MAX_BYTES, OtlpSettings
from inferwatch.serve.slow_requests import DEFAULT_MOST
from inferwatch.settings import (
    ConfigError,
    read_secret,
)


def _has_credentials(url: str) -> bool:
    """Whether ``url`` carries a ``user:password@`` (sent as basic auth)."""
    return urlsplit(url).username is not None


def _one_authorization(header: str, *sources: tuple[str, bool]) -> None:
    """ConfigError when more than one of the ``(flag, given)`` sources sets ``header``."""
    given = [flag for flag, on in sources if on]
    if len(given) > 1:
        raise ConfigError(f"{header} is set by {' and '.join(given)}; give one")


@dataclass(frozen=True)
class ServeConfig:
    backend: str
    backend_url: str
    backend_timeout: float
    backend_bearer_token_file: Path | None
    backend_header: tuple[str, str] | None = field(repr=False)  # may hold a secret
    backend_max_bytes: int
    backend_max_series: int
    backend_max_label_bytes: int
    web_listen_address: tuple[str, int]
    web_config_file: Path | None
    poll_interval: float
    gpu: str
    server_cpu: str
    idle_threshold: float
    engine_step_seconds: float
    model_weights_bytes: int | None
    model_path: Path | None
    peak_memory_bandwidth: float | None
    tensor_parallel_size: int | None
    baseline: Path | None
    log_level: str
    canary: str = "off"
    canary_url: str | None = None
    canary_interval: float = 15.0
    canary_model: str | None = None
    canary_prompt_tokens: int = 8
    canary_output_tokens: int = 8
    canary_api: str = "completions"
    canary_timeout: float = 10.0
    canary_bearer_token_file: Path | None = None
    capture_dir: Path | None = None
    capture_on: tuple[str, ...] | None = None
    capture_seconds: float = 10.0
    capture_min_interval: float = 600.0
    capture_max_bytes: int = 1024**3
    capture_profiler_dir: Path | None = None
    capture_profiler_steps: int = 100
    capture_pid: int | None = None
    web_allowed_host: tuple[str, ...] | None = None
    otlp_traces: str = "off"
    role: str = "auto"
    otlp_slowest: int = DEFAULT_MOST
    otlp_max_bytes: int = DEFAULT_MAX_BYTES

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> ServeConfig:
        config = cls(**values)
        if config.model_weights_bytes and config.model_path:
            raise ConfigError("give --model-weights-bytes or --model-path, not both")
        _one_authorization(
            "the Authorization header",
            ("--backend-url user:password@", _has_credentials(config.backend_url)),
            ("--backend-bearer-token-file", config.backend_bearer_token_file is not None),
            (
                "--backend-header Authorization",
                config.backend_header is not None
                and config.backend_header[0].lower() == "authorization",
            ),
        )
        if config.canary != "off":  # its default URL keeps the backend URL's user:password@
            _one_authorization(
                "the canary's Authorization header",
                (
                    f"{'--canary-url' if config.canary_url else '--backend-url'} user:password@",
                    _has_credentials(config.canary_url or config.backend_url),
                ),
                ("--canary-bearer-token-file", config.canary_bearer_token_file is not None),
            )
        if config.capture_dir is None and (config.capture_on or config.capture_profiler_dir):
            raise ConfigError("--capture-on and --capture-profiler-dir need --capture-dir")
        if config.capture_dir is not None:  # the folder must be usable before anything starts
            try:
                CaptureStore(config.capture_dir, config.capture_max_bytes).open()
            except OSError as exc:
                raise ConfigError(f"--capture-dir {config.capture_dir}: {exc.strerror}") from None
            except ValueError as exc:
                raise ConfigError(f"--capture-dir {config.capture_dir}: {exc}") from None
        return config

    def capture_settings(self) -> CaptureSettings | None:
        """The captures' settings (None when off)."""
        if self.capture_dir is None:
            return None
        return CaptureSettings(
            directory=self.capture_dir,
            on=self.capture_on or (),
            seconds=self.capture_seconds,
            min_interval=self.capture_min_interval,
            max_bytes=self.capture_max_bytes,
            profiler_dir=self.capture_profiler_dir,
            profiler_steps=self.capture_profiler_steps,
            pid=self.capture_pid,
        )

    def otlp_settings(self) -> OtlpSettings | None:
        """The OTLP trace receiver's settings (None when off)."""
        if self.otlp_traces != "on":
            return None
        return OtlpSettings(most=self.otlp_slowest, max_bytes=self.otlp_max_bytes)

    def backend_headers(self) -> dict[str, str]:
        """Extra headers for every backend request; reads the token file (ConfigError)."""
        headers = {}
        if self.backend_bearer_token_file is not None:
            headers["Authorization"] = f"Bearer {read_secret(self.backend_bearer_token_file)}"
        if self.backend_header is not None:
            name, value = self.backend_header
            headers[name] = value
        return headers

    def canary_settings(self, gap_window: float | None = None) -> CanarySettings | None:
        """The canary's settings (None when off); reads its token file (ConfigError).

        ``gap_window``: seconds the TTFT gap is measured over (the rules' rate window)."""
        if self.canary == "off":
            return None
        token = None
        if self.canary_bearer_token_file is not None:
            token = read_secret(self.canary_bearer_token_file)
        url = self.canary_url or Upstream(self.backend_url, timeout=1, max_bytes=1).origin()
        return CanarySettings(
            url=url,
            api=self.canary_api,
            model=self.canary_model or None,
            interval=self.canary_interval,
            timeout=self.canary_timeout,
            prompt_tokens=self.canary_prompt_tokens,
            output_tokens=self.canary_output_tokens,
            api_key=token,
            gap_window=gap_window,
            only_without_ttft=self.canary == "auto",
        )

    def weight_bytes(self) -> int | None:
        if self.model_path is not None:
            try:
                return weights_bytes_in(self.model_path)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        return self.model_weights_bytes
