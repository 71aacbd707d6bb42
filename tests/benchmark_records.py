"""Synthetic benchmark records, shaped as the workers write them, for the test_benchmarks*.py files.

``worker_record`` makes one worker's JSON with given times per mode;
``synthetic_results`` merges a few of them (a skipped mode, a failed setting)
as ``benchmarks/run.py`` does.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `benchmarks` is a package at the repository root

from benchmarks import config, stats  # noqa: E402

__all__ = ["synthetic_results", "worker_record"]


def worker_record(setting, floor, factors, ns=("1", "100"), skipped=()):
    """A worker record whose mode ``m`` takes ``floor * factors[m]`` us per kernel in every round."""
    modes = {}
    for mode, factor in {"raw": 1.0, **factors}.items():
        unit = "us_per_call" if mode == "trivial_jit" else "us_per_kernel"
        by_n = {}
        for n in ns:
            if (mode, n) in skipped:
                by_n[n] = {"skipped": "too slow to compile"}
                continue
            base = floor[n] if isinstance(floor, dict) else floor
            by_n[n] = {"samples": [base * factor * d for d in (1.0, 1.2, 0.9)], "calls": 10, "per_call": int(n),
                       "check": "ok"}
        modes[mode] = {"unit": unit, "clock": "wall", "by_n": by_n}
    return {"setting": setting, "xla_flags": config.SETTINGS[setting].xla_flags, "modes": modes,
            "scalars": {}, "errors": [], "device": {"name": "NVIDIA H100 80GB HBM3", "ordinal": 0}}


def synthetic_results():
    nojax = worker_record("nojax", 1.0, {"replay": 1.0, "torch_cupy": 1.2, "torch_add": 1.15})
    nojax["scalars"] = {"capture_1000": {"unit": "ms", "clock": "wall", "samples": [15.0, 16.0, 15.5]},
                        "eager.torch_add": {"skipped": "torch is not installed"}}
    on = worker_record("on", {"1": 2.0, "100": 1.0},
                       {"jit_loop": 20.0, "jit_changing": 25.0, "jax_calls": 19.0, "trivial_jit": 38.0},
                       skipped={("jax_calls", "100")})
    processes = {"nojax": nojax, "on": on, "off": {"setting": "off", "failed": "exit code 1"}}
    meta = {"schema": 1, "date": "2026-11-23T10:00:00+00:00", "quick": False,
            "config": {"repeats": 3}, "versions": {"jax": "0.11.2", "torch": "2.11.0"},
            "device": {"driver": "580.159.04"}}
    return stats.merge(meta, processes)
