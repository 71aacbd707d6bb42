"""What the one-question probes share (``floor_probe.py``, ``placement_probe.py``,
``matched_floor_probe.py``, ``stamp_probe.py``).

Each probe launches executables itself through ``cuda.bindings``, most of
them timed with CUDA events on a stream of its own: the checked driver call,
that setup and that timed loop, written once.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from ..harness.workload import SOURCE

__all__ = ["Kit", "driver_call", "kit", "timed_launches"]


def driver_call(name: str, *args: Any) -> Any:
    """``cuda.bindings.driver.<name>(*args)``: its value (or values), ``RuntimeError`` unless it succeeded."""
    from cuda.bindings import driver

    err, *values = getattr(driver, name)(*args)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{name} failed: {err}")
    return values[0] if len(values) == 1 else (values or None)


class Kit(NamedTuple):
    kernel: Any   # the workload's add_one, a jaxgraph.Kernel
    stream: Any   # a jaxgraph.Stream of the probe's own
    handle: Any   # that stream as a CUstream, for cuGraphLaunch
    start: Any    # two timing events
    end: Any


def kit() -> Kit:
    """The workload's kernel, a stream and two timing events (needs a GPU)."""
    import jaxgraph
    from cuda.bindings import driver

    stream = jaxgraph.Stream()
    return Kit(jaxgraph.Kernel(SOURCE, "add_one"), stream, driver.CUstream(int(stream)),
               jaxgraph.Event(enable_timing=True), jaxgraph.Event(enable_timing=True))


def timed_launches(k: Kit, execs: Sequence[Any], launches: int) -> float:
    """Seconds between two CUDA events around ``launches`` ``cuGraphLaunch`` calls of ``execs`` in
    turn on the kit's stream, each executable launched once before (uploaded, caches warm)."""
    for e in execs:
        driver_call("cuGraphLaunch", e, k.handle)
    k.start.record(k.stream)
    for i in range(launches):
        driver_call("cuGraphLaunch", execs[i % len(execs)], k.handle)
    k.end.record(k.stream)
    k.end.synchronize()
    return k.start.elapsed_time(k.end) * 1e-3
