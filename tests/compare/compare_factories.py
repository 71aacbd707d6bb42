"""Factories for tests/compare/: small jnp programs, and ones that go wrong in one setting on purpose.

Each worker of ``jaxgraph.compare`` imports this file by its path and calls one
factory; ``current_setting()`` tells a factory which setting its process runs.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxgraph.compare import Case, current_setting

N = 64
STEPS = 10


def initial(n=N, seed=0):
    return jnp.asarray(np.random.default_rng(seed).random(n, dtype=np.float32))


def decay_loop(u, steps=STEPS):
    """u -> u / 2 + 1, ``steps`` times: one jnp loop."""
    return jax.lax.fori_loop(0, steps, lambda i, v: 0.5 * v + 1.0, u)


def decay_scan(u, steps=STEPS):
    """The same steps as a scan, also returning every step's mean."""
    def body(v, _):
        v = 0.5 * v + 1.0
        return v, v.mean()
    return jax.lax.scan(body, u, None, length=steps)


def make_loop(n=N, steps=STEPS):
    """(fn, args): one function."""
    return (lambda u: decay_loop(u, steps)), (initial(n),)


def make_pair(n=N, steps=STEPS):
    """Two labelled functions: a fori_loop and a scan (already jitted: the tool must not jit it again)."""
    u = initial(n)
    return {"fori": (lambda u: decay_loop(u, steps), (u,)),
            "scan": Case(jax.jit(lambda u: decay_scan(u, steps)), (u,))}


def make_two_ways(n=N, steps=STEPS):
    """The fori_loop and the same steps unrolled in Python: two ways to one result."""
    def unrolled(u):
        for _ in range(steps):
            u = 0.5 * u + 1.0
        return u
    u = initial(n)
    return {"fori": (lambda u: decay_loop(u, steps), (u,)), "unrolled": (unrolled, (u,))}


def make_setting_dependent(differ_in="defaults"):
    """The loop, but under setting ``differ_in`` element 3 of the result is off by 1."""
    bump = jnp.zeros(N, jnp.float32).at[3].set(1.0 if current_setting() == differ_in else 0.0)
    return {"loop": (lambda u, b: decay_loop(u) + b, (initial(), bump))}


def make_failing(fail_in="defaults"):
    """``good`` runs everywhere; ``bad`` fails while being traced under ``fail_in``; ``late`` fails at its
    third call there (during the timed rounds)."""
    setting = current_setting()

    def bad(u):
        if setting == fail_in:
            raise ValueError(f"bad refuses to run under {setting}")
        return decay_loop(u)

    calls = [0]

    def late(u):
        calls[0] += 1
        if setting == fail_in and calls[0] > 2:
            raise RuntimeError(f"late fails at call {calls[0]}")
        return u + 1.0

    u = initial()
    return {"good": (decay_loop, (u,)), "bad": (bad, (u,)), "late": Case(late, (u,), jit=False)}


def make_slow(slow_in="defaults", seconds=120.0):
    """Hangs (sleeps) under ``slow_in`` before returning: a timeout there."""
    if current_setting() == slow_in:
        time.sleep(seconds)
    return make_loop()


def make_raising():
    raise RuntimeError("the factory itself fails")


def make_wrong_type():
    return [decay_loop, initial()]
