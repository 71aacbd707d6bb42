"""Loop modes: R steps of an N-kernel step, as a device loop, unrolled, and in ``lax.fori_loop``.

The step is the workload's chain (``Chain``: N ``add_one`` kernels, x -> y);
``R = fori_trips(N)`` (1000 at N = 1 and 10, 100 at N = 100), so a call runs
about 10,000 kernels. Each step's output feeds the next step's input, so one
call computes ``x + R * N``, checked exactly against numpy before timing.

Without JAX (the ``nojax`` process, CUDA events):

- ``loop_k2``, ``loop_k8``, ``loop_k32``: ``jaxgraph.graphed_loop(step, R,
  feed={0: 0}, unroll=K).replay()``, one launch per call;
- ``loop_kdefault``: the same with K from ``jaxgraph.default_unroll``;
- ``loop_until``: an ``until=`` flag no kernel sets, the default exact stop
  (speculative trips of K steps, a watch kernel after each): what the exact
  stop costs while the flag stays clear;
- ``loop_until_k1``: the same with ``check_every=1`` (a WHILE trip per step,
  the exact stop without speculation);
- ``loop_until_k8``, ``loop_until_k16``, ``loop_until_k32``: the same with ``check_every=K``
  (the flag tested once per K steps);
- ``loop_copy``: as ``loop_kdefault`` with ``ping_pong="copy"``: a device
  copy y -> x after every step instead of the swapped twin (the fallback's cost);
- ``loop_unrolled``: R * N kernels captured in one graph, raw
  ``cuGraphLaunch`` (the loop's floor).

With JAX (one process per XLA flag setting, host wall clock), the idiomatic
programs first:

- ``jnp_fori``: what a JAX user writes: ``lax.fori_loop`` of R steps of
  ``x + 1`` (N times per step; XLA fuses them into one kernel);
- ``jnp_while``: the same with a data-dependent stop, ``lax.while_loop``
  while ``i < R and x[0] < 1e30`` (never reached, so all R steps run);
- ``loop_jit``: the device loop inside ``jax.jit`` (one FFI call per call);
- ``loop_jit_until``, ``loop_jit_until_k8``: with ``until=`` (exact, and
  ``check_every=8``), ``(y, steps_run) = loop(x)``, y returned;
- ``jit_fori`` (jax_modes.py): R replays of the step in one ``lax.fori_loop``;
- ``xla_fori``: R trips of N ``Kernel.jax_call``\\ s in one ``lax.fori_loop``;
- ``xla_while``: the same trips in a data-stopped ``lax.while_loop`` (the
  condition of ``jnp_while``): the counterpart of ``loop_jit_until``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .config import LOOP_CHECK_EVERY, LOOP_UNROLLS, fori_trips
from .graph_modes import event_timer
from .timing import Mode
from .jax_modes import _loop_mode
from .workload import Chain, check_result, random_input

__all__ = ["device_loop", "jax_factories", "jnp_fori", "jnp_while", "loop_jit", "nojax_factories", "unrolled",
           "xla_fori", "xla_while"]


def device_loop(chain: Chain, stream: Any, rng: np.random.Generator, key: str, unroll: int | None,
                until: bool = False, ping_pong: str = "auto", check_every: int | None = None) -> Mode:
    """``graphed_loop(chain.graph, R, feed={0: 0}, unroll=K).replay()`` in a loop, timed by CUDA events."""
    import jaxgraph
    from jaxgraph import diagnostics

    r = fori_trips(chain.n)
    flag = jaxgraph.zeros(1, np.int32) if until else None
    loop = jaxgraph.graphed_loop(chain.graph, r, feed={0: 0}, unroll=unroll, until=flag, inputs=[chain.x_s],
                                 outputs=[chain.y_s], ping_pong=ping_pong,
                                 **({"check_every": check_every} if until and check_every else {}))

    def replay_all(calls: int) -> None:
        with jaxgraph.stream(stream):
            for _ in range(calls):
                loop.replay()

    run = event_timer(stream, replay_all)
    check = _check_loop(chain, lambda: run(1), r, rng)
    ran = int(loop.steps_run.numpy()[0])
    if ran != r:
        raise AssertionError(f"{key}: the loop ran {ran} steps, expected {r}")
    mode = Mode(key, run, per_call=r * chain.n, clock="cuda_event", check=check + f"; {ran} steps counted")
    mode.info.update(steps=r, unroll=loop.unroll, ping_pong=loop.ping_pong)
    if until:
        mode.info.update(check_every=check_every, stop=loop.stop,
                         pdl=diagnostics.describe_loop(loop).programmatic_check)
    mode._keep = loop  # type: ignore[attr-defined]
    return mode


def unrolled(kernel: Any, n: int, stream: Any, rng: np.random.Generator) -> Mode:
    """R * N kernels in one graph, raw ``cuGraphLaunch``: the floor of the loop modes."""
    from .graph_modes import raw

    chain = Chain(kernel, fori_trips(n) * n)
    mode = raw(chain, stream, rng)
    mode.key = "loop_unrolled"
    mode.info["steps"] = fori_trips(n)
    mode._keep = chain  # type: ignore[attr-defined]
    return mode


def loop_jit(chain: Chain, rng: np.random.Generator, key: str = "loop_jit", until: bool = False,
             check_every: int | None = None) -> Mode:
    """The device loop as one FFI call inside ``jax.jit`` (with ``until``: its state, not ``steps_run``)."""
    import jax

    import jaxgraph

    r = fori_trips(chain.n)
    kw = {"until": jaxgraph.zeros(1, np.int32), "check_every": check_every} if until else {}
    if until and check_every is None:
        kw.pop("check_every")
    loop = jaxgraph.graphed_loop(chain.graph, r, feed={0: 0}, inputs=[chain.x_s], outputs=[chain.y_s], **kw)
    mode = _loop_mode(key, jax.jit((lambda x: loop(x)[0]) if until else loop), r * chain.n, rng, inputs=1)
    mode.info.update(steps=r, unroll=loop.unroll)
    mode._keep = loop  # type: ignore[attr-defined]
    return mode


def jnp_fori(n: int, rng: np.random.Generator) -> Mode:
    """Idiomatic JAX: ``lax.fori_loop`` of R steps, each ``x + 1`` N times (XLA fuses a step into one kernel)."""
    import jax

    r = fori_trips(n)

    def body(i, x):
        for _ in range(n):
            x = x + np.float32(1)
        return x

    mode = _loop_mode("jnp_fori", jax.jit(lambda x: jax.lax.fori_loop(0, r, body, x)), r * n, rng, inputs=1)
    mode.info["steps"] = r
    return mode


def _data_stopped(name: str, step: Any, n: int, rng: np.random.Generator) -> Mode:
    """``lax.while_loop`` while ``i < R and x[0] < 1e30``, N ``step``\\ s a trip: a loop that stops on its data."""
    import jax

    r = fori_trips(n)

    def cond(c):
        i, x = c
        return (i < r) & (x[0] < np.float32(1e30))

    def body(c):
        i, x = c
        for _ in range(n):
            x = step(x)
        return i + 1, x

    f = jax.jit(lambda x: jax.lax.while_loop(cond, body, (np.int32(0), x))[1])
    mode = _loop_mode(name, f, r * n, rng, inputs=1)
    mode.info["steps"] = r
    return mode


def jnp_while(n: int, rng: np.random.Generator) -> Mode:
    """Idiomatic JAX with a data-dependent stop: ``lax.while_loop`` while ``i < R and x[0] < 1e30``."""
    return _data_stopped("jnp_while", lambda x: x + np.float32(1), n, rng)


def xla_fori(one_kernel: Any, n: int, rng: np.random.Generator) -> Mode:
    """``lax.fori_loop`` of R trips, each N ``jax_call``\\ s of the kernel: XLA's own loop."""
    import jax

    r = fori_trips(n)

    def body(i, x):
        for _ in range(n):
            x = one_kernel(x)
        return x

    mode = _loop_mode("xla_fori", jax.jit(lambda x: jax.lax.fori_loop(0, r, body, x)), r * n, rng, inputs=1)
    mode.info["steps"] = r
    return mode


def xla_while(one_kernel: Any, n: int, rng: np.random.Generator) -> Mode:
    """``lax.while_loop`` while ``i < R and x[0] < 1e30`` of trips of N ``jax_call``\\ s: XLA's data-stopped loop."""
    return _data_stopped("xla_while", one_kernel, n, rng)


def nojax_factories(kernel: Any, chain: Chain, stream: Any, rng: np.random.Generator) -> list:
    """The device-loop modes and their floor, for the ``nojax`` process."""
    out = [(f"loop_k{k}", functools.partial(device_loop, chain, stream, rng, f"loop_k{k}", k))
           for k in LOOP_UNROLLS]
    out.append(("loop_kdefault", functools.partial(device_loop, chain, stream, rng, "loop_kdefault", None)))
    out.append(("loop_until", functools.partial(device_loop, chain, stream, rng, "loop_until", None, True)))
    out.append(("loop_until_k1", functools.partial(device_loop, chain, stream, rng, "loop_until_k1", None, True,
                                                   check_every=1)))
    out += [(f"loop_until_k{k}", functools.partial(device_loop, chain, stream, rng, f"loop_until_k{k}", None, True,
                                                   check_every=k)) for k in LOOP_CHECK_EVERY]
    out.append(("loop_copy", functools.partial(device_loop, chain, stream, rng, "loop_copy", None, False, "copy")))
    out.append(("loop_unrolled", functools.partial(unrolled, kernel, chain.n, stream, rng)))
    return out


def jax_factories(chain: Chain, one_kernel: Any, rng: np.random.Generator) -> list:
    """The loop modes of a JAX process (``jit_fori`` comes from the worker's own list)."""
    k = LOOP_CHECK_EVERY[0]
    return [("jnp_fori", functools.partial(jnp_fori, chain.n, rng)),
            ("jnp_while", functools.partial(jnp_while, chain.n, rng)),
            ("loop_jit", functools.partial(loop_jit, chain, rng)),
            ("loop_jit_until", functools.partial(loop_jit, chain, rng, "loop_jit_until", True)),
            (f"loop_jit_until_k{k}", functools.partial(loop_jit, chain, rng, f"loop_jit_until_k{k}", True, k)),
            ("xla_fori", functools.partial(xla_fori, one_kernel, chain.n, rng)),
            ("xla_while", functools.partial(xla_while, one_kernel, chain.n, rng))]


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _check_loop(chain: Chain, run_once: Any, steps: int, rng: np.random.Generator) -> str:
    """Fresh input in x, poisoned y, one call: y must be x + R * N."""
    import jaxgraph

    x = random_input(rng)
    chain.x_s.copy_(x)
    chain.y_s.fill_(np.nan)
    jaxgraph.synchronize()
    run_once()
    jaxgraph.synchronize()
    return check_result(chain.y_s.numpy(), x, steps * chain.n)
