"""The one shape every reported metric takes, so a missing model never reads as a score of zero.

A metric is ``{"value": float, "available": True}`` or ``{"value": None, "available": False,
"reason": "..."}``. Model-based metrics (CLIP, DreamSim) are unavailable when their local weights
are missing; the report prints them as ``n/a (reason)``. Plain numbers are accepted wherever a
metric is read (``metric_value``, ``as_metric``): flow- and state-based metrics never need weights.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

Metric = dict  # {"value": float | None, "available": bool, ["reason": str]}


def available(value: float) -> Metric:
    """A measured value. Non-finite values are refused: NaN is not valid JSON and hides bugs."""
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"metric value must be finite, got {value!r}; use unavailable(reason) instead")
    return {"value": v, "available": True}


def unavailable(reason: str) -> Metric:
    """A metric that could not be measured: value None (never 0), with the reason shown to the reader."""
    if not str(reason).strip():
        raise ValueError("an unavailable metric needs a reason")
    return {"value": None, "available": False, "reason": str(reason)}


def is_metric(x: Any) -> bool:
    return isinstance(x, Mapping) and "available" in x and "value" in x


def as_metric(x: Any) -> Metric:
    """Number -> available(x); metric dict -> itself (checked); None -> unavailable("not measured")."""
    if x is None:
        return unavailable("not measured")
    if is_metric(x):
        if x["available"]:
            return available(x["value"])
        return unavailable(x.get("reason") or "unavailable")
    if isinstance(x, bool) or not isinstance(x, (int, float)) and not hasattr(x, "__float__"):
        raise TypeError(f"not a metric: {x!r}")
    return available(float(x))


def metric_value(x: Any) -> float | None:
    """The float of a number or an available metric; None for unavailable / missing ones."""
    if x is None:
        return None
    if is_metric(x):
        return float(x["value"]) if x["available"] else None
    return float(x)


def mean_metric(items: Iterable[Any], empty_reason: str = "no samples") -> Metric:
    """Mean of per-sample metrics: unavailable (with the first reason) if any sample is unavailable."""
    values = []
    for item in items:
        m = as_metric(item)
        if not m["available"]:
            return unavailable(m["reason"])
        values.append(m["value"])
    if not values:
        return unavailable(empty_reason)
    return available(sum(values) / len(values))


def format_metric(x: Any, digits: int = 4) -> str:
    """"0.8132" for a value, "n/a (reason)" for an unavailable metric."""
    if x is None:
        return "not measured"
    m = as_metric(x)
    if not m["available"]:
        return f"n/a ({m['reason']})"
    return f"{m['value']:.{digits}f}"
