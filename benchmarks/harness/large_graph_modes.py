"""The scale benchmark's modes (``benchmarks/large_graphs.py``) and what the replay handler's counters say of them.

``eager_mode`` replays the graph with ``g.replay()`` (the floor); ``feedback_mode`` and
``rotating_mode`` call a jitted replay (``x = f(x)``, or 8 inputs in turn), each adding the
native counters' change over its timed samples to ``mode.info``; ``handler_burst`` reads the
handler's time on a first call made on an idle device and per call in a burst after it.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from benchmarks.harness import timing

__all__ = ["BURST", "COUNTERS", "counted_delta", "eager_mode", "feedback_mode", "handler_burst", "per_call",
           "rotating_mode"]

BURST = 32  # calls of the handler burst after the first (handler_burst)
COUNTERS = ("instantiate", "rebind", "copy", "node_copy", "to_copy", "handler_calls", "handler_ns", "launch_ns",
            "copy_ns", "prepare_ns")


def eager_mode(graph: Any, n: int) -> timing.Mode:
    """``g.replay()`` back to back, from an idle device to the last replay done: the floor."""
    import jaxgraph

    def run(calls: int) -> float:
        jaxgraph.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            graph.replay()
        jaxgraph.synchronize()
        return time.perf_counter() - start

    return timing.Mode("eager", run, per_call=n)


def feedback_mode(f: Any, x0: Any, n: int) -> timing.Mode:
    """``x = f(x)``: XLA's output buffer becomes the next input, so addresses alternate."""
    def calls_of(calls: int) -> Any:
        x = x0
        for _ in range(calls):
            x = f(x)
        return x

    return _counted_mode("jit_feedback", n, x0, calls_of)


def rotating_mode(f: Any, xs: list, n: int) -> timing.Mode:
    """``f(xs[i % 8])``, the last 8 results kept: a different input and output address on every call."""
    ys = [None] * len(xs)  # the last 8 results alive: each call's result lands at a new address too
    turn = [0]             # the rotation goes on across samples, whatever their calls

    def calls_of(calls: int) -> Any:
        for _ in range(calls):
            i = turn[0] = (turn[0] + 1) % len(xs)
            ys[i] = f(xs[i])
        return ys

    return _counted_mode("jit_rotating", n, xs, calls_of)


def _counted_mode(key: str, n: int, inputs: Any, calls_of: Callable[[int], Any]) -> timing.Mode:
    """A jit mode timing ``calls_of(calls)`` (it returns what to wait for), from ``inputs`` ready to
    its results ready; each run adds the native counters' change to ``mode.info`` (:func:`_accumulate`)."""
    import jax

    mode = timing.Mode(key, lambda calls: 0.0, per_call=n)

    def run(calls: int) -> float:
        from jaxgraph.diagnostics import counters

        jax.block_until_ready(inputs)
        before = counters()
        start = time.perf_counter()
        jax.block_until_ready(calls_of(calls))
        seconds = time.perf_counter() - start
        _accumulate(mode, before, counters(), calls)
        return seconds

    mode.run = run
    mode.calls_of, mode.inputs = calls_of, inputs  # for handler_burst
    return mode


def handler_burst(mode: timing.Mode) -> dict:
    """The handler's counters on the first call after the device went idle, and per call over the next
    :data:`BURST` calls, queued while the earlier ones still run."""
    import jax
    from jaxgraph.diagnostics import counters

    jax.block_until_ready(mode.inputs)
    c0 = counters()
    first = mode.calls_of(1)
    c1 = _after_handler_calls(c0["handler_calls"] + 1)  # its handler done, its graph still running
    rest = mode.calls_of(BURST)
    jax.block_until_ready((first, rest))
    c2 = counters()
    if c2["handler_calls"] - c1["handler_calls"] != BURST:
        raise RuntimeError(f"the burst ran {c2['handler_calls'] - c1['handler_calls']} handler calls, not {BURST}")
    return {"first": counted_delta(c0, c1, 1), "steady": counted_delta(c1, c2, BURST), "calls": BURST}


def _after_handler_calls(target: int, timeout_s: float = 30.0) -> dict:
    """The counters once the handler has run ``target`` calls in all (JAX may call it from another thread)."""
    from jaxgraph.diagnostics import counters

    deadline = time.perf_counter() + timeout_s
    while (now := counters())["handler_calls"] < target:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"the replay handler did not run within {timeout_s} s")
        time.sleep(0)
    return now


def _accumulate(mode: timing.Mode, before: dict, after: dict, calls: int) -> None:
    """Add the counters of a timed sample (not calibration runs) to ``mode.info``."""
    if "counters" not in mode.info:
        return
    for c in COUNTERS:
        mode.info["counters"][c] += after.get(c, 0) - before.get(c, 0)
    mode.info["calls_counted"] += calls


def per_call(totals: dict, calls: int) -> dict:
    """Counters per jitted call; the handler's host time in us per handler call."""
    if calls == 0:
        return {}
    out = {c: totals.get(c, 0) / calls for c in ("instantiate", "rebind", "copy", "node_copy", "to_copy")}
    if totals["handler_calls"]:
        out["handler_us"] = totals["handler_ns"] / totals["handler_calls"] / 1e3
        out["launch_us"] = totals["launch_ns"] / totals["handler_calls"] / 1e3  # inside cudaGraphLaunch
        out["copy_us"] = totals["copy_ns"] / totals["handler_calls"] / 1e3  # inside cudaMemcpyAsync
        out["prepare_us"] = totals.get("prepare_ns", 0) / totals["handler_calls"] / 1e3  # choosing the executable
    return out


def counted_delta(before: dict, after: dict, calls: int) -> dict:
    """:func:`per_call` of the counters' change from ``before`` to ``after`` over ``calls`` calls."""
    return per_call({c: after.get(c, 0) - before.get(c, 0) for c in COUNTERS}, calls)
