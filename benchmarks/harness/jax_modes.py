"""Modes that run the chain inside ``jax.jit``: replayable calls, loops, unrolling, ``jax_call`` chains.

Every factory takes ``step``, a JAX function computing ``x + N`` (on the GPU:
``jaxgraph.replayable(g, inputs=[x_s], outputs=[y_s])``), compiles its jitted
function, checks one call against numpy on fresh random input and returns a
:class:`~benchmarks.harness.timing.Mode` timed by the host wall clock over many calls
with one ``jax.block_until_ready`` at the end (jit modes are host-bound at
small N, so device events would miss the dispatch they cost).

The ``mixed`` modes are the programs users write: ``MIXED_REPLAYS`` replays
separated by XLA elementwise ops in one jitted function, against the same
program with every replay's kernels as ``Kernel.jax_call`` calls.

Because ``step`` is just a function, ``tests/benchmarks/test_benchmarks_timing.py`` runs these
factories on the CPU with ``step = lambda x: x + N``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from .config import CHANGING_INPUTS, MIXED_REPLAYS, UNROLL, fori_trips
from .timing import Mode, Skip
from .workload import check_equal, check_result, random_input

__all__ = ["jax_calls", "jit_changing", "jit_fori", "jit_loop", "jit_unrolled", "kernel_step", "mixed",
           "mixed_calls", "mixed_reference", "timed_calls", "trivial_jit"]


def jit_loop(step: Callable, n: int, rng: np.random.Generator) -> Mode:
    """``jax.jit(step)`` called from a Python loop on one fixed input."""
    import jax

    mode = _loop_mode("jit_loop", jax.jit(step), n, rng, inputs=1)
    mode.steady = True  # also the streaming cost per call (harness.Mode.steady): judged against the floor
    return mode


def jit_changing(step: Callable, n: int, rng: np.random.Generator) -> Mode:
    """As :func:`jit_loop`, rotating over several inputs: a new input address on every call."""
    import jax

    # A function of its own, so its executable (and XLA's recorded command
    # buffer) is not the one jit_loop times.
    mode = _loop_mode("jit_changing", jax.jit(lambda x: step(x)), n, rng, inputs=CHANGING_INPUTS)
    mode.steady = True
    return mode


def jit_fori(step: Callable, n: int, rng: np.random.Generator) -> Mode:
    """``lax.fori_loop`` of ``fori_trips(n)`` replays in one jit, each output the next input."""
    import jax

    trips = fori_trips(n)
    f = jax.jit(lambda x: jax.lax.fori_loop(0, trips, lambda i, v: step(v), x))
    mode = _loop_mode("jit_fori", f, n * trips, rng, inputs=1)
    mode.info["trips"] = trips
    return mode


def jit_unrolled(step: Callable, n: int, rng: np.random.Generator) -> Mode:
    """``UNROLL`` chained replays in one jit (distinct operands, so XLA cannot merge them)."""
    import jax

    mode = _loop_mode("jit_unrolled", jax.jit(_chained(step, UNROLL)), n * UNROLL, rng, inputs=1)
    mode.info["unroll"] = UNROLL
    return mode


def jax_calls(one_kernel: Callable, n: int, rng: np.random.Generator, skip: str | None = None) -> Mode:
    """The chain as ``n`` calls of ``one_kernel`` (a ``Kernel.jax_call``) in one jit."""
    import jax

    if skip:
        raise Skip(skip)
    return _loop_mode("jax_calls", jax.jit(_chained(one_kernel, n)), n, rng, inputs=1)


def mixed(step: Callable, n: int, rng: np.random.Generator, changing: bool = False) -> Mode:
    """``MIXED_REPLAYS`` replays separated by XLA elementwise ops in one jit (``mixed``, or
    ``mixed_changing`` rotating over several inputs)."""
    import jax

    key = "mixed_changing" if changing else "mixed"
    f = jax.jit(lambda x: _mixed_program(step, x))  # a function per mode: an executable per mode
    return _loop_mode(key, f, n * MIXED_REPLAYS, rng, inputs=CHANGING_INPUTS if changing else 1,
                      reference=lambda x: mixed_reference(x, n))


def mixed_calls(one_kernel: Callable, n: int, rng: np.random.Generator, changing: bool = False,
                skip: str | None = None) -> Mode:
    """The :func:`mixed` program with each replay as ``n`` calls of ``one_kernel`` (``Kernel.jax_call``)."""
    import jax

    if skip:
        raise Skip(skip)
    chain = _chained(one_kernel, n)
    key = "mixed_calls_changing" if changing else "mixed_calls"
    f = jax.jit(lambda x: _mixed_program(chain, x))
    return _loop_mode(key, f, n * MIXED_REPLAYS, rng, inputs=CHANGING_INPUTS if changing else 1,
                      reference=lambda x: mixed_reference(x, n))


def mixed_reference(x: np.ndarray, n: int) -> tuple[np.ndarray, str]:
    """What the mixed program computes from ``x`` with an N-kernel stage, in numpy, and its formula.

    Integer-valued float32 throughout (|values| < 2**24), so the check is exact.
    """
    y = x
    for r in range(MIXED_REPLAYS):
        if r:
            y = y * np.float32(2) - np.float32(3)
        y = y + np.float32(n)
    return y, f"{MIXED_REPLAYS} stages of x + {n} with x * 2 - 3 between them"


def trivial_jit(rng: np.random.Generator) -> Mode:
    """``jax.jit(lambda x: x + 1)``: what any jitted call costs (us per call)."""
    import jax

    mode = _loop_mode("trivial_jit", jax.jit(lambda x: x + 1), 1, rng, inputs=1)
    mode.unit = "us_per_call"
    return mode


def kernel_step(kernel: Any) -> Callable:
    """One ``add_one`` kernel on a JAX array through ``Kernel.jax_call`` (a new output buffer)."""
    import jax

    return lambda x: kernel.jax_call(jax.ShapeDtypeStruct(x.shape, x.dtype), x, x.size)


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _chained(f: Callable, times: int) -> Callable:
    """``x`` through ``times`` calls of ``f``, each output the next input (distinct operands, so
    XLA cannot merge them when the result is jitted)."""
    def chain(x):
        for _ in range(times):
            x = f(x)
        return x

    return chain


def _mixed_program(stage: Callable, x: Any) -> Any:
    """``MIXED_REPLAYS`` calls of ``stage`` with an XLA elementwise op (``x * 2 - 3``) between them."""
    for r in range(MIXED_REPLAYS):
        if r:
            x = x * np.float32(2) - np.float32(3)
        x = stage(x)
    return x


def _loop_mode(key: str, f: Callable, steps: int, rng: np.random.Generator, inputs: int,
               reference: Callable[[np.ndarray], tuple[np.ndarray, str]] | None = None) -> Mode:
    """Compile ``f`` (``steps`` kernels per call; without ``reference`` it adds ``steps``, one per
    kernel), check it on each of ``inputs`` fresh arrays, and time calls rotating over them."""
    import jax.numpy as jnp

    hosts = [random_input(rng) for _ in range(inputs)]
    arrays = [jnp.asarray(x) for x in hosts]
    for x, a in zip(hosts, arrays):  # the first call compiles; every input is checked once
        if reference is None:
            check = check_result(f(a), x, steps)
        else:
            want, what = reference(x)
            check = check_equal(f(a), want, x, what)
    if inputs > 1:
        check += f" (each of {inputs} inputs)"
    return Mode(key, timed_calls(f, arrays), per_call=steps, clock="wall", check=check)


def timed_calls(f: Callable, arrays: Sequence[Any]) -> Callable[[int], float]:
    """``run(calls)``: call ``f`` ``calls`` times (cycling over ``arrays``), wait for the last result."""
    import jax

    count = len(arrays)

    def run(calls: int) -> float:
        jax.block_until_ready(arrays)
        _idle()
        out = None
        start = time.perf_counter()
        for i in range(calls):
            out = f(arrays[i % count])
        jax.block_until_ready(out)
        return time.perf_counter() - start

    return run


def _idle() -> None:
    """Wait for every stream of the device (XLA's included); a no-op without a GPU (CPU tests)."""
    import jaxgraph

    if jaxgraph.device_count() > 0:
        jaxgraph.synchronize()
