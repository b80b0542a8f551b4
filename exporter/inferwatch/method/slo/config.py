"""The config's ``slos:`` section, parsed strictly into :class:`SLOs`.

A latency bound must be a bucket bound of the server's histogram (:mod:`.buckets`), and a
target must leave a budget the fastest burn can spend.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from inferwatch.method.durations import hours, is_duration
from inferwatch.method.slo.buckets import BUCKET_BOUNDS
from inferwatch.method.slo.burns import BURNS
from inferwatch.method.slo.objectives import KINDS, SCOPES, ModelObjectives, Objective, SLOs
from inferwatch.settings import ConfigError, check_keys

# Without `objectives:` every model keeps these; `objectives: {}` has none.
_DEFAULT_OBJECTIVES = {"errors": {"target": 0.999}}


def slos_from_config(section: Any, backend: str = "auto") -> SLOs:
    """The ``slos:`` section; ``backend`` (the config's) says whose bucket bounds to check."""
    if section is None:
        return SLOs()
    if not isinstance(section, Mapping):
        raise ConfigError("slos: expected a mapping")
    check_keys(section, ("window", "scope", "objectives", "models"), "slos")
    window = str(section.get("window", SLOs.window))
    if not is_duration(window, ("m", "h", "d")) or hours(window) < hours("3d"):
        raise ConfigError(f"slos.window: {window!r} is not a duration like 28d of 3d or more")
    scope = section.get("scope", SLOs.scope)
    if scope not in SCOPES:
        raise ConfigError(f"slos.scope: {scope!r} is not one of {', '.join(SCOPES)}")
    models = section.get("models") or {}
    if not isinstance(models, Mapping):
        raise ConfigError("slos.models: expected a mapping of model names to objectives")
    sections = [((), "slos.objectives", section.get("objectives", _DEFAULT_OBJECTIVES))]
    sections += [((str(m),), f"slos.models.{m}", v) for m, v in models.items()]
    groups = []
    for chosen, where, value in sections:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping of objectives")
        objectives = tuple(_objective(k, v, where, backend) for k, v in value.items())
        _check_reachable(objectives, window, where)
        if objectives:
            groups.append(ModelObjectives(models=chosen, objectives=objectives))
    return SLOs(window=window, scope=scope, groups=tuple(groups))


def _objective(kind: str, value: Any, where: str, backend: str) -> Objective:
    """One objective, ``ttft: {target: 0.99, seconds: 0.5}``, at ``where`` in the config."""
    if kind not in KINDS:
        raise ConfigError(f"{where}: unknown objective {kind!r} (known: {', '.join(KINDS)})")
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}.{kind}: expected a mapping with target (and seconds)")
    latency = KINDS[kind].histogram is not None
    check_keys(value, ("target", "seconds") if latency else ("target",), f"{where}.{kind}")
    target = value.get("target")
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target < 1:
        raise ConfigError(f"{where}.{kind}.target: {target!r} is not a share between 0 and 1")
    seconds = value.get("seconds")
    if latency:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not math.isfinite(seconds)
            or seconds <= 0
        ):
            raise ConfigError(f"{where}.{kind}.seconds: {seconds!r} is not a positive number")
        _check_bound(kind, float(seconds), backend, f"{where}.{kind}.seconds")
    return Objective(
        kind=kind, target=float(target), seconds=None if seconds is None else float(seconds)
    )


def _check_bound(kind: str, seconds: float, backend: str, where: str) -> None:
    """``seconds`` must be a bucket bound of every known layout of the backend(s) served."""
    backends = [backend] if backend in BUCKET_BOUNDS else list(BUCKET_BOUNDS)
    if backend not in BUCKET_BOUNDS and backend != "auto":
        return  # no known layout (TGI, Triton, llama.cpp): InferenceSLOUnmeasured watches it
    missing = {
        name: layouts
        for name in backends
        for layouts in [BUCKET_BOUNDS[name].get(kind, ())]
        if any(seconds not in layout for layout in layouts)
    }
    if missing:
        listed = "; ".join(
            f"{name}: " + " | ".join(" ".join(f"{b:g}" for b in layout) for layout in layouts)
            for name, layouts in missing.items()
        )
        hint = "" if backend != "auto" else " (set `backend:` to check one server's)"
        raise ConfigError(
            f"{where}: {seconds:g} is not a bucket bound of the server's {KINDS[kind].title} "
            f"histogram{hint}; bounds {listed}"
        )


def _check_reachable(objectives: tuple[Objective, ...], window: str, where: str) -> None:
    """Each target must leave a budget the fastest burn's factor can spend within ``window``."""
    factor = max(burn.factor(window) for burn in BURNS)
    for objective in objectives:
        if factor * objective.budget > 1:
            raise ConfigError(
                f"{where}.{objective.kind}.target: {objective.target:g} leaves a budget the "
                f"fastest burn ({factor:.3g}x over {BURNS[0].long}) cannot reach; use at least "
                f"{1 - 1 / factor:.4g}"
            )


def slos_document(slos: SLOs) -> dict[str, Any]:
    """The ``slos:`` section :func:`slos_from_config` reads back to ``slos``."""

    def objectives(group: ModelObjectives) -> dict[str, Any]:
        return {
            o.kind: {"target": o.target, **({} if o.seconds is None else {"seconds": o.seconds})}
            for o in group.objectives
        }

    default = [g for g in slos.groups if not g.models]
    return {
        "window": slos.window,
        "scope": slos.scope,
        "objectives": objectives(default[0]) if default else {},
        "models": {m: objectives(g) for g in slos.groups for m in g.models},
    }
