"""Timing machinery of the workers: a :class:`Mode`, its calibration, interleaved sampling.

A mode is made by a factory that compiles, warms up and checks its result
against numpy once (a fast wrong answer never gets timed). The worker then
calibrates each mode's calls per sample to a target duration and samples the
modes of a group round-robin, so host drift (10-30% on the GPU machine) hits
every mode of a round alike. Nothing here needs a GPU: modes are callables.
"""

from __future__ import annotations

import dataclasses
import gc
import time
import traceback
from typing import Callable

from .stats import calls_for_target

__all__ = ["Mode", "Skip", "calibrate", "measure_group", "prepare", "sample_interleaved"]

SCALE = {"us_per_kernel": 1e6, "us_per_call": 1e6, "us_per_launch": 1e6, "ms": 1e3}


class Skip(Exception):
    """This mode cannot run here (a missing package, a time budget); the message says why."""


@dataclasses.dataclass
class Mode:
    """One way of running the workload, ready to be timed.

    ``run(calls)`` performs ``calls`` calls and returns the seconds they took,
    starting with the device idle and ending when the work is done. A sample
    is that time divided by ``calls * per_call``, in ``unit``.
    """

    key: str
    run: Callable[[int], float]
    per_call: int = 1          # kernels (or launches, or captures) per call
    unit: str = "us_per_kernel"
    clock: str = "wall"        # "cuda_event": device time between two events; "wall": host perf_counter
    check: str = ""            # what the numpy check verified
    calls: int = 1             # calls per sample, set by calibrate()
    info: dict = dataclasses.field(default_factory=dict)  # recorded with the samples (e.g. fori trips)

    def sample(self) -> float:
        """Time ``self.calls`` calls; return the time per ``per_call`` item in ``unit``."""
        enabled = gc.isenabled()
        gc.disable()  # a collection inside a timed loop is noise, not cost
        try:
            seconds = self.run(self.calls)
        finally:
            if enabled:
                gc.enable()
        return seconds / (self.calls * self.per_call) * SCALE[self.unit]


def calibrate(mode: Mode, target_s: float, max_calls: int) -> int:
    """Set ``mode.calls`` so a sample lasts about ``target_s``; the runs double as warm-up."""
    calls = 1
    while True:
        seconds = mode.run(calls)
        if seconds >= target_s / 4 or calls >= max_calls:
            mode.calls = calls_for_target(seconds, calls, target_s, max_calls)
            return mode.calls
        calls = min(max_calls, calls * 8)


def prepare(factory: Callable[[], Mode], target_s: float, max_calls: int) -> tuple[Mode | None, dict]:
    """Build (compile, warm up, check) and calibrate one mode; never raises.

    Returns the mode and its record, or ``None`` and a record saying
    ``skipped`` (with the reason) or ``error`` (the exception; traceback printed).
    """
    start = time.perf_counter()
    try:
        mode = factory()
        setup_s = time.perf_counter() - start
        calibrate(mode, target_s, max_calls)
    except Skip as exc:
        return None, {"skipped": str(exc)}
    except Exception as exc:  # one broken mode must not cost the others their run
        traceback.print_exc()
        return None, {"error": f"setup: {type(exc).__name__}: {exc}"}
    entry = {"unit": mode.unit, "clock": mode.clock, "check": mode.check, "setup_s": round(setup_s, 3),
             "calls": mode.calls, "per_call": mode.per_call, **mode.info}
    return mode, entry


def sample_interleaved(modes: list[Mode], repeats: int,
                       on_round: Callable[[int], None] = lambda r: None) -> tuple[dict, dict]:
    """Sample every mode once per round, for ``repeats`` rounds, in the same order each round.

    Returns ``(samples, errors)``: the samples of each mode key, and the first
    error of each mode that failed (it is dropped from later rounds).
    """
    samples: dict[str, list[float]] = {m.key: [] for m in modes}
    errors: dict[str, str] = {}
    for r in range(repeats):
        for mode in modes:
            if mode.key in errors:
                continue
            try:
                samples[mode.key].append(mode.sample())
            except Exception as exc:
                traceback.print_exc()
                errors[mode.key] = f"timing: {type(exc).__name__}: {exc}"
        on_round(r)
    return samples, errors


def measure_group(label: str, factories: list[tuple[str, Callable[[], Mode]]], repeats: int,
                  target_s: float, max_calls: int, log: Callable[[str], None] = print) -> dict[str, dict]:
    """Prepare the modes of one group (one N, or the N-independent figures) and sample them interleaved.

    Returns one record per mode key: ``samples`` plus calibration and check
    details, or ``skipped``/``error``.
    """
    records: dict[str, dict] = {}
    modes: list[Mode] = []
    start = time.perf_counter()
    for key, factory in factories:
        mode, records[key] = prepare(factory, target_s, max_calls)
        if mode is not None:
            modes.append(mode)
    ready = ", ".join(f"{m.key} x{m.calls}" for m in modes) or "none"
    log(f"{label} ready in {time.perf_counter() - start:.1f} s (calls per sample: {ready})")
    for key, record in records.items():
        if "skipped" in record or "error" in record:
            log(f"{label} {key}: {record.get('skipped') or record.get('error')}")
    samples, errors = sample_interleaved(
        modes, repeats, lambda r: log(f"{label} repeat {r + 1}/{repeats}"))
    for mode in modes:
        records[mode.key]["samples"] = samples[mode.key]
        if mode.key in errors:
            records[mode.key]["error"] = errors[mode.key]
    return records
