"""Timing machinery of the workers: a :class:`Mode`, its calibration, interleaved sampling.

A mode is made by a factory that compiles and checks its result against
numpy once (a fast wrong answer never gets timed). The worker then warms it
up (its first calls do one-off work: XLA records its command buffer),
calibrates its calls per sample to a target duration and samples the modes
of a group round-robin, so host drift (10-30% on the GPU machine) hits every
mode of a round alike.

Where the process has event counters (the replay handler's: which path each
call took, executables made, nodes rebound, buffers copied), each sample
records their change per call, and the warm-up goes on until those per-call
figures stop changing, within a bound. Nothing here needs a GPU: modes are
callables.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
import traceback
from typing import Callable

from .stats import calls_for_target

__all__ = ["Mode", "Skip", "calibrate", "counter_deltas", "measure_group", "prepare", "sample_interleaved",
           "settle", "warm_up"]

SCALE = {"us_per_kernel": 1e6, "us_per_call": 1e6, "us_per_launch": 1e6, "ms": 1e3}
WARM_UP_CALLS = 64    # untimed calls before calibrating (or WARM_UP_S, whichever comes first)
WARM_UP_S = 0.25
SETTLE_ROUNDS = 8     # at most this many sample-sized runs wait for the counters to settle
RESETTLE_ROUNDS = 4   # ... and again for each mode once the whole group is built
NOISY_COUNTERS = ("handler_ns", "launch_ns", "copy_ns")  # times, not events: not compared when settling


class Skip(Exception):
    """This mode cannot run here (a missing package, a time budget); the message says why."""


@dataclasses.dataclass
class Mode:
    """One way of running the workload, ready to be timed.

    ``run(calls)`` performs ``calls`` calls and returns the seconds they took,
    starting with the device idle and ending when the work is done. A sample
    is that time divided by ``calls * per_call``, in ``unit``.

    With ``steady``, each sample also times a short burst of ``calls // 8``
    calls and records ``(long - short) / (calls - calls // 8)`` per item in
    ``steady_samples``: the cost of a call once calls are streaming, without
    the burst's fixed start and end. Timed from idle by the host's clock, a
    burst of jitted calls carries JAX's first dispatch after idle (0.16-0.60 ms
    on the H100, a trivial jitted function's too) and its wait for the last
    result, while the floor's CUDA events carry neither
    (``benchmarks/probes/stamp_probe.py``); over a 25 ms sample that alone reads as
    1-2% over the floor.
    """

    key: str
    run: Callable[[int], float]
    per_call: int = 1          # kernels (or launches, or captures) per call
    unit: str = "us_per_kernel"
    clock: str = "wall"        # "cuda_event": device time between two events; "wall": host perf_counter
    check: str = ""            # what the numpy check verified
    calls: int = 1             # calls per sample, set by calibrate()
    info: dict = dataclasses.field(default_factory=dict)  # recorded with the samples (e.g. fori trips)
    counters: Callable[[], dict] | None = None  # the process's event counters, read around each sample
    counter_samples: list = dataclasses.field(default_factory=list)  # per sample: counters' change per call
    steady: bool = False       # also record steady_samples (see above)
    steady_samples: list = dataclasses.field(default_factory=list)

    def sample(self) -> float:
        """Time ``self.calls`` calls; return the time per ``per_call`` item in ``unit``."""
        before = self.counters() if self.counters is not None else None
        seconds = self._timed(self.calls)
        if before is not None:  # read after the timed calls: never inside them
            self.counter_samples.append(counter_deltas(before, self.counters(), self.calls))
        if self.steady and self.calls >= 16:
            short = self.calls // 8
            self.steady_samples.append((seconds - self._timed(short)) / ((self.calls - short) * self.per_call)
                                       * SCALE[self.unit])
        return seconds / (self.calls * self.per_call) * SCALE[self.unit]

    def _timed(self, calls: int) -> float:
        """``run(calls)`` with the garbage collector held off: a collection inside a timed loop is noise."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self.run(calls)
        finally:
            if enabled:
                gc.enable()


def calibrate(mode: Mode, target_s: float, max_calls: int) -> int:
    """Set ``mode.calls`` so a sample lasts about ``target_s`` (after :func:`warm_up`)."""
    calls = 1
    while True:
        seconds = mode.run(calls)
        if seconds >= target_s / 4 or calls >= max_calls:
            mode.calls = calls_for_target(seconds, calls, target_s, max_calls)
            return mode.calls
        calls = min(max_calls, calls * 8)


def counter_deltas(before: dict, after: dict, calls: int) -> dict:
    """How much each counter grew per call between two readings."""
    return {k: (after[k] - before.get(k, 0)) / max(1, calls) for k in after}


def warm_up(mode: Mode, calls: int = WARM_UP_CALLS, seconds: float = WARM_UP_S) -> dict:
    """Make the mode's first calls, untimed: batches of 1, 2, 4, ... until ``calls`` calls or ``seconds``.

    The first calls after compiling do one-off work (XLA records its command
    buffer; an address set seen for the first time may instantiate an
    executable). Calibrating on them gives too few calls per sample: a quick
    run of 2026-11-23 calibrated 4 calls per sample of ``jit_loop`` under
    command buffers, whose samples read 2.2x the cost seen after 200 calls.
    Returns ``{"warm_up_calls": calls made, "warm_up_us": us per call of each batch}``.
    """
    done, batch, spent, per_call = 0, 1, 0.0, []
    while done < calls and spent < seconds:
        took = mode.run(batch)
        per_call.append(round(took / batch * 1e6, 2))
        spent += took
        done += batch
        batch = max(1, min(batch * 2, calls - done))
    return {"warm_up_calls": done, "warm_up_us": per_call}


def settle(mode: Mode, target_s: float, max_calls: int, rounds: int = SETTLE_ROUNDS) -> dict:
    """Run ``mode.calls`` calls at a time until the counters' change per call repeats (at most
    ``rounds`` runs), then set ``mode.calls`` again from the last run.

    XLA records its command buffer on an early call and may record it again
    on later ones; timing starts once the counters say the calls do the same
    thing every time. Returns ``{"settle_runs": k, "settled": bool}`` (empty
    when the mode has no counters: one run, for the calibration).
    """
    previous, info = None, {"settle_runs": rounds, "settled": False}
    for k in range(1, rounds + 1):
        before = mode.counters() if mode.counters is not None else None
        seconds = mode.run(mode.calls)
        if before is None:
            info = {}
            break
        current = counter_deltas(before, mode.counters(), mode.calls)
        if previous is not None and _same_events(previous, current, mode.calls):
            info = {"settle_runs": k, "settled": True}
            break
        previous = current
    mode.calls = calls_for_target(seconds, mode.calls, target_s, max_calls)
    return info


def prepare(factory: Callable[[], Mode], target_s: float, max_calls: int,
            counters: Callable[[], dict] | None = None) -> tuple[Mode | None, dict]:
    """Build (compile, check), warm up, calibrate and settle one mode; never raises.

    Returns the mode and its record, or ``None`` and a record saying
    ``skipped`` (with the reason) or ``error`` (the exception; traceback printed).
    ``counters``: the process's event counters, read around each sample.
    """
    start = time.perf_counter()
    settled: dict = {}
    try:
        mode = factory()
        setup_s = time.perf_counter() - start
        mode.counters = counters
        warmed = warm_up(mode)
        calibrate(mode, target_s, max_calls)
        settled = {**warmed, **settle(mode, target_s, max_calls)}
    except Skip as exc:
        return None, {"skipped": str(exc)}
    except Exception as exc:  # one broken mode must not cost the others their run
        traceback.print_exc()
        return None, {"error": f"setup: {type(exc).__name__}: {exc}"}
    entry = {"unit": mode.unit, "clock": mode.clock, "check": mode.check, "setup_s": round(setup_s, 3),
             "calls": mode.calls, "per_call": mode.per_call, **settled, **mode.info}
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
                  target_s: float, max_calls: int, log: Callable[[str], None] = print,
                  counters: Callable[[], dict] | None = None) -> dict[str, dict]:
    """Prepare the modes of one group (one N, or the N-independent figures) and sample them interleaved.

    XLA drops every executable's command buffers when it loads a new one, so
    once the group is built each mode settles again before the first round.

    Returns one record per mode key: ``samples`` plus calibration and check
    details, or ``skipped``/``error``; with ``counters``, also ``counters``:
    the median change per call of each counter over the samples.
    """
    records: dict[str, dict] = {}
    modes: list[Mode] = []
    start = time.perf_counter()
    for key, factory in factories:
        mode, records[key] = prepare(factory, target_s, max_calls, counters)
        if mode is not None:
            modes.append(mode)
    for mode in modes:  # XLA dropped the command buffers of the modes built before the last one
        records[mode.key]["resettle_runs"] = settle(mode, target_s, max_calls, RESETTLE_ROUNDS).get("settle_runs")
    ready = ", ".join(f"{m.key} x{m.calls}" for m in modes) or "none"
    log(f"{label} ready in {time.perf_counter() - start:.1f} s (calls per sample: {ready})")
    for key, record in records.items():
        if "skipped" in record or "error" in record:
            log(f"{label} {key}: {record.get('skipped') or record.get('error')}")
    samples, errors = sample_interleaved(
        modes, repeats, lambda r: log(f"{label} repeat {r + 1}/{repeats}"))
    for mode in modes:
        records[mode.key]["samples"] = samples[mode.key]
        if mode.counter_samples:
            records[mode.key]["counters"] = _median_counters(mode.counter_samples)
        if mode.steady_samples:
            records[mode.key]["steady_samples"] = mode.steady_samples
        if mode.key in errors:
            records[mode.key]["error"] = errors[mode.key]
    return records


def _same_events(a: dict, b: dict, calls: int) -> bool:
    """Whether two per-call counter readings agree, up to 2% or one call's burst of events in the run
    (an event every other call reads differently over an odd number of calls)."""
    def close(x: float, y: float) -> bool:
        big = max(abs(x), abs(y))
        return abs(x - y) <= max((1.0 + 2.0 * big) / max(1, calls), 0.02 * big) + 1e-9

    return all(close(a.get(k, 0), b.get(k, 0)) for k in set(a) | set(b) if k not in NOISY_COUNTERS)


def _median_counters(per_sample: list[dict]) -> dict:
    keys = dict.fromkeys(k for sample in per_sample for k in sample)
    return {k: statistics.median(sample.get(k, 0) for sample in per_sample) for k in keys}
