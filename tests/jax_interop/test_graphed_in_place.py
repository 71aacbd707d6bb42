"""A graphed step that updates its state in place, replayed in a jitted ``lax.fori_loop`` (GPU).

The pattern of ``examples/gray_scott.py``: the step ping-pongs between its
arguments and a scratch array so that its last kernel writes the arguments,
and returns them. Its replay's outputs then share its operands' buffers, so
XLA carries the loop's state in place (no copy per trip) and jaxgraph binds
every buffer (no copy in or out). A step that returns new arrays makes XLA
copy them into the carry on every trip: checked here too, as the contrast.

The copies jaxgraph makes, executables and rebinds per call, are read from
the native replay counters (``jaxgraph.diagnostics.counters``).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
from jaxgraph.diagnostics import counters
from support.kernel_sources import NEIGHBOUR_MIX, ZERO_THEN_TOTAL

N, SUBSTEPS, TRIPS, A = 3000, 4, 7, np.float32(0.25)
BLOCKS = (N + 255) // 256


@pytest.fixture(scope="module")
def k():
    import types

    return types.SimpleNamespace(**{name: jaxgraph.Kernel(NEIGHBOUR_MIX + ZERO_THEN_TOTAL, name) for name in ("smooth", "zero", "total")})


def reference(x):
    """numpy: the state after TRIPS steps, and its sum after each step."""
    sums = []
    for _ in range(TRIPS):
        for _ in range(SUBSTEPS):
            x = (np.float32(1) - A) * x + A * np.roll(x, -1)
        sums.append(x.sum(dtype=np.float64))
    return x, np.array(sums)


def step_fn(k, in_place):
    def step(x):
        pairs = (x, jaxgraph.empty(x.shape)) if in_place else (jaxgraph.empty(x.shape), jaxgraph.empty(x.shape))
        for s in range(SUBSTEPS):
            y = pairs[(SUBSTEPS - 1 - s) % 2]  # in place: the last substep writes x
            k.smooth[BLOCKS, 256](y, x, A, N)
            x = y
        total = jaxgraph.empty(1)
        k.zero[1, 1](total)
        k.total[BLOCKS, 256](total, x, N)
        return x, total

    return step


def loop_copies(hlo):
    """Array copies XLA placed outside the entry computation (in the loop)."""
    copies, entry = 0, False
    for line in hlo.splitlines():
        if line and not line.startswith((" ", "}")):
            entry = line.startswith("ENTRY")
        elif not entry and re.search(r"= \w+\[\d[\d,]*\]\S* copy(-start)?\(", line):
            copies += 1
    return copies


@pytest.mark.gpu
@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "fresh_outputs"])
def test_state_updated_in_place_is_carried_without_copies(k, rng, in_place):
    x0 = rng.standard_normal(N).astype(np.float32)
    graphed = jaxgraph.make_graphed_callables(step_fn(k, in_place), (x0,))
    bindings = graphed.replayable.bindings[0]
    assert all(b.mode is jaxgraph.BindingMode.BOUND for b in bindings), bindings
    if in_place:
        assert graphed.static_outputs[0] is graphed.static_inputs[0]

    def body(i, carry):
        x, totals = carry
        x, t = graphed(x)
        return x, totals.at[i].set(t[0])

    f = jax.jit(lambda x: jax.lax.fori_loop(0, TRIPS, body, (x, jnp.full(TRIPS, jnp.nan, jnp.float32))))
    x = jnp.asarray(x0)
    assert loop_copies(f.lower(x).compile().as_text()) == (0 if in_place else 1)
    jax.block_until_ready(f(x))  # the first call may make an executable for XLA's addresses
    before = counters()
    got, totals = (np.asarray(a) for a in jax.block_until_ready(f(x)))
    after = counters()
    want, sums = reference(x0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(totals, sums, rtol=0, atol=1e-5 * np.abs(x0).sum())  # every trip wrote its total
    np.testing.assert_array_equal(np.asarray(x), x0)  # the caller's array is only read
    # jaxgraph copies nothing and makes no executable once warm, whichever path XLA takes.
    for counter in ("copy", "instantiate", "rebind"):
        assert after[counter] == before[counter], (counter, before, after)
