"""Synthetic benchmark records, shaped as the workers write them, for the test_benchmarks*.py files.

``worker_record`` makes one worker's JSON with given times per mode;
``synthetic_results`` merges a few of them (a skipped mode, a failed setting)
as ``benchmarks/run.py`` does. ``record`` and ``synthetic_quick`` make the
quick run the targets files are judged on (``table`` reads a targets table back).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks` is a package at the repository root

from benchmarks.harness import config, stats  # noqa: E402

__all__ = ["record", "synthetic_quick", "synthetic_results", "table", "worker_record"]


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


def record(setting, per_kernel, ns=("1", "10", "100")):
    """A worker record: mode -> (N -> us per kernel; ``trivial_jit``: us per call), two rounds alike."""
    modes = {}
    for mode, values in per_kernel.items():
        unit = "us_per_call" if mode == "trivial_jit" else "us_per_kernel"
        modes[mode] = {"unit": unit, "clock": "wall",
                       "by_n": {n: {"samples": [values[n]] * 2, "calls": 10, "per_call": int(n), "check": "ok"}
                                for n in ns if n in values}}
    return {"setting": setting, "xla_flags": config.SETTINGS[setting].xla_flags, "modes": modes, "scalars": {},
            "errors": [], "device": {"name": "NVIDIA H100 80GB HBM3", "ordinal": 0}}


def synthetic_quick(mixed_ns=("1", "10", "100")):
    """A quick run: on's jit_loop 1.08x and defaults' jit_changing 1.03x at N=100; the replay behind at on N=10
    (fixed input) and at N=1 (below the target's range); `kernel.launch` 1.5 us over cuda.core, bound 0.5 us."""
    def jax_modes(key):
        modes = {"raw": {"1": 1.0, "10": 1.0, "100": 1.0},
                 "jit_loop": {"1": 20.0, "100": {"off": 1.04, "on": 1.08, "defaults": 1.01}[key]},
                 "jit_changing": {"1": 20.0, "100": {"off": 1.04, "on": 1.04, "defaults": 1.03}[key]}}
        for mode, value in {"mixed": 2.0, "mixed_changing": 2.0, "mixed_calls": 3.0, "mixed_calls_changing": 3.0}.items():
            modes[mode] = {n: value for n in mixed_ns}
            if "1" in mixed_ns:
                modes[mode]["1"] = 4.0 if "calls" in mode else 5.0  # the replay behind at N=1
        if key == "on" and "10" in mixed_ns:
            modes["mixed"]["10"] = 4.5  # behind mixed_calls' 3.0
        return modes

    processes = {key: record(key, jax_modes(key)) for key in ("off", "on", "defaults")}
    nojax = record("nojax", {"raw": {"1": 2.0}})
    nojax["scalars"] = {f"eager.{k}": {"unit": "us_per_launch", "samples": [v] * 3}
                        for k, v in {"cuda_core": 4.0, "jaxgraph_bound": 4.5, "jaxgraph_launch": 5.5}.items()}
    meta = {"schema": 1, "date": "2026-11-23T12:00:00+00:00", "command": "python benchmarks/run.py --quick",
            "git": "q123456", "quick": True, "config": {"repeats": 3, "target_ms": 5.0}, "versions": {"jax": "0.11.2"},
            "device": {"driver": "580.159.04"}}
    return stats.merge(meta, {"nojax": nojax, **processes})


def table(text, section="## Issue 8"):
    """From the markdown table of ``section``: target -> (measured, verdict); issue 19's: (target, run) -> them."""
    text = text.split(section, 1)[1].split("\n## ", 1)[0]
    cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in text.splitlines()
             if line.startswith("| ") and " | " in line and not line.startswith("| ---")]
    return {(c[0] if len(c) == 3 else tuple(c[:2])): tuple(c[-2:]) for c in cells[1:]}
