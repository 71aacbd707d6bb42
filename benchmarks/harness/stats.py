"""Pure statistics of the harness: medians, spread, ratios to the floor, calibration, the JSON merge.

No GPU, no JAX: ``tests/benchmarks/test_benchmarks.py`` checks every function here on
synthetic numbers. The workers record raw samples; :func:`merge` (run by the
driver) summarizes each process and computes its ratios to its own floor.
"""

from __future__ import annotations

import copy
import math
import re
import statistics
from typing import Any

from .config import FLOOR

__all__ = [
    "calls_for_target", "device_slug", "jax_calls_skip_reason", "json_ready", "merge", "paired_ratios",
    "quantile", "summarize", "summarize_process",
]


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) with linear interpolation, as numpy's default."""
    if not values:
        raise ValueError("quantile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(samples: list[float]) -> dict:
    """Median and spread (min, max, quartiles, max/min - 1) of one mode's samples."""
    if not samples:
        raise ValueError("no samples to summarize")
    lo, hi = min(samples), max(samples)
    return {
        "median": statistics.median(samples),
        "min": lo,
        "max": hi,
        "q1": quantile(samples, 0.25),
        "q3": quantile(samples, 0.75),
        "spread": hi / lo - 1.0 if lo > 0 else math.inf,
        "count": len(samples),
    }


def paired_ratios(samples: list[float], floor: list[float]) -> list[float]:
    """Per-round ratios: sample i of a mode over sample i of the floor (taken in the same round)."""
    return [s / f for s, f in zip(samples, floor) if f > 0]


def summarize_process(proc: dict) -> dict:
    """A copy of one worker's record with ``stats`` and ``ratio`` added to every measured entry.

    ``ratio`` is the mode's median over the floor's median at the same N in the
    same process; ``ratio_min``/``ratio_max`` span the per-round paired ratios;
    ``steady_ratio``, where the mode recorded ``steady_samples``, is theirs.
    """
    out = copy.deepcopy(proc)
    modes = out.get("modes", {})
    floor = modes.get(FLOOR, {}).get("by_n", {})
    for key, mode in modes.items():
        for n, entry in mode.get("by_n", {}).items():
            if not entry.get("samples"):
                continue
            entry["stats"] = summarize(entry["samples"])
            base = floor.get(n, {})
            if mode.get("unit") != "us_per_kernel" or not base.get("samples"):
                continue
            entry["ratio"] = entry["stats"]["median"] / statistics.median(base["samples"])
            pairs = paired_ratios(entry["samples"], base["samples"])
            if pairs:
                entry["ratio_min"], entry["ratio_max"] = min(pairs), max(pairs)
            if entry.get("steady_samples"):  # harness.Mode.steady: streaming calls, the burst's ends left out
                entry["steady_stats"] = summarize(entry["steady_samples"])
                entry["steady_ratio"] = entry["steady_stats"]["median"] / statistics.median(base["samples"])
    for entry in out.get("scalars", {}).values():
        if entry.get("samples"):
            entry["stats"] = summarize(entry["samples"])
    return out


def merge(meta: dict, processes: dict[str, dict]) -> dict:
    """The results document: ``meta`` plus each process summarized, device and failures lifted up.

    ``processes`` maps a setting to its worker record, or to
    ``{"setting": ..., "failed": "why"}`` when the worker produced none.
    """
    results = dict(meta)
    results["processes"] = {}
    results["failures"] = {}
    device = None
    for key, proc in processes.items():
        if proc.get("failed"):
            results["failures"][key] = proc["failed"]
        if device is None and proc.get("device"):
            device = proc["device"]
        results["processes"][key] = summarize_process(proc)
    results["device"] = {**(device or {"name": "unknown device"}), **meta.get("device", {})}
    results["device"]["slug"] = device_slug(results["device"].get("name", ""))
    return results


def calls_for_target(seconds: float, calls: int, target_s: float, max_calls: int) -> int:
    """Calls per sample so that one sample lasts about ``target_s``, given ``calls`` took ``seconds``."""
    if seconds <= 0:
        return max_calls
    return max(1, min(max_calls, math.ceil(calls * target_s / seconds)))


def jax_calls_skip_reason(n: int, previous: tuple[int, float] | None, budget_s: float) -> str | None:
    """Why the ``jax_calls`` mode skips chain length ``n``, or ``None`` to run it.

    ``previous`` is (N, setup seconds) of the last length built. Compiling N
    FFI calls grows at least linearly with N, so the estimate scales the last
    setup time linearly and skips when it exceeds ``budget_s``.
    """
    if previous is None or n <= previous[0]:
        return None
    prev_n, prev_s = previous
    estimate = prev_s * n / prev_n
    if estimate <= budget_s:
        return None
    return (f"compiling {n} jax_calls in one jit is estimated at {estimate:.0f} s (N={prev_n} took "
            f"{prev_s:.1f} s), over the {budget_s:.0f} s budget; raise --jax-calls-budget-s to run it")


def device_slug(name: str) -> str:
    """A file-name-safe slug of a device name: ``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "unknown-device"


def json_ready(value: Any) -> Any:
    """Replace non-finite floats (JSON has none) with None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value
