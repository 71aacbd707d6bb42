"""Bind or copy by cost, the executable cache, and what a graph's executables take (ffi/replay/bind_policy.h).

Which decision the policy takes on given figures, and how many executables,
instantiations, rewrites and copies a call cost, are not in the public API: they
come through ``jaxgraph.diagnostics`` (the native policy functions of
``native_module("replay")``, the replay counters, ``describe_graph``).

The CPU tests check the policy's decisions on given figures (the native
functions the handler itself calls); the GPU tests check what the handler does
with real graphs: an in-place state touched by every kernel, whose address
keeps changing, switches to copying and stays exact; XLA alternating between
two buffers hits cached executables (no instantiation, no rewrite); the
bindings and ``describe_graph`` report the reason and the memory.
"""

import os

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxgraph  # noqa: E402
from jaxgraph import BindingMode  # noqa: E402
from support.graph_helpers import alternate_calls  # noqa: E402
from jaxgraph.diagnostics import counters, describe_graph, native_module  # noqa: E402
from support.kernel_sources import ADD_ONE, INC  # noqa: E402

N = 1024
B = N // 256
SITES_MANY = 64  # kernels updating the state in place: 64 sites of one buffer

SRC = INC + ADD_ONE


def policy():
    return native_module("replay")


# ---------------------------------------------------------------------------
# The decisions, on the CPU
# ---------------------------------------------------------------------------


def test_large_executables_leave_room_for_fewer():
    p = policy()
    assert p.policy_exec_budget(2 << 20, 1000) == 64         # 2 MB each: 64 fill the 128 MB budget
    assert p.policy_exec_budget(200 << 20, 100_000) == 1     # one 200 MB executable: no second
    assert p.policy_exec_budget(50 << 20, 4000) == 2
    assert p.policy_exec_budget(-1, 100_000) == 1            # unmeasured: estimated from the nodes
    assert p.policy_exec_budget(-1, 1000) == 65              # 2 KB a kernel: 2,048,000 bytes each
    assert p.policy_exec_budget(-1, 100) == 256


def test_registration_copies_an_in_place_state_only_when_one_executable_is_kept():
    p = policy()
    in_place = (200_000, [4096, 4096])      # 2N sites; copied in and out
    assert p.policy_copy_at_registration(*in_place, 1)
    assert not p.policy_copy_at_registration(*in_place, 4)    # a few address sets get an executable each
    assert not p.policy_copy_at_registration(1, [4096], 1)    # one site: a rewrite is cheaper than copies
    assert not p.policy_copy_at_registration(2000, [1 << 30], 1)  # a 1 GB buffer: copying costs more


def test_misses_switch_a_buffer_to_copying_by_measured_cost():
    p = policy()
    assert p.policy_copy_after_misses(8, 8, 20_000, -1.0, [4096, 4096])    # new every call, many sites
    assert not p.policy_copy_after_misses(2, 100, 20_000, -1.0, [4096])   # A/B: cached, rarely missed
    assert not p.policy_copy_after_misses(3, 3, 20_000, -1.0, [4096])     # too early to judge
    assert not p.policy_copy_after_misses(8, 8, 1, 500.0, [4096])         # one cheap site: stays bound
    # One site at what a rewrite measured at 100k kernels (~4.1 us): no dearer than a copy (a copy's
    # cudaMemcpyAsync alone took 3.5-13 us inside JAX, and it adds work on the device).
    assert not p.policy_copy_after_misses(8, 8, 1, 4100.0, [4096])
    # A graph copying by nodes makes its executable afresh to switch (~0.8 s at 100k kernels): one
    # site rewritten at ~70 us a call does not pay for that within the window; 200,000 sites do.
    assert p.policy_copy_after_misses(8, 8, 1, 70_000.0, [4096])
    assert not p.policy_copy_after_misses(8, 8, 1, 70_000.0, [4096], 8e8, 8e8)
    assert p.policy_copy_after_misses(8, 8, 200_000, 1000.0, [4096, 4096], 8e8, 8e8)
    assert p.policy_copy_after_misses(8, 8, 1, 700_000.0, [4096])         # measured: a rewrite costs more
    # A miss costs a rewrite or a fresh executable, whichever is less.
    assert not p.policy_copy_after_misses(8, 8, 20_000, -1.0, [4096, 4096], 3000.0)  # fresh: 3 us < copies
    assert p.policy_copy_after_misses(8, 8, 20_000, -1.0, [4096, 4096], 300_000.0)
    assert not p.policy_copy_after_misses(4, 256, 20_000, -1.0, [4096], 30_000.0)   # few recent misses


def test_cost_copies_are_a_binding_mode_of_their_own():
    codes = policy().codes()["binding"]
    assert BindingMode.COPIED_BY_COST.value in codes
    assert codes["copied_by_cost"] not in (codes["bound"], codes["copied"], codes["unused"])


# ---------------------------------------------------------------------------
# The handler, on the GPU
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def k():
    kernels = {name: jaxgraph.Kernel(SRC, name) for name in ("inc", "add_one")}
    for kernel in kernels.values():
        kernel.handle  # noqa: B018 - load before capture
    return kernels


def ints(rng):
    """Fresh random integers as float32: adding a few hundred stays exact."""
    return rng.integers(-1000, 1000, N).astype(np.float32)


def in_place(k, kernels=SITES_MANY):
    s = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        for _ in range(kernels):
            k["inc"][B, 256](s, N)                   # s += kernels, every kernel in place
    return g, s


@pytest.mark.gpu
def test_in_place_state_whose_address_keeps_changing_is_copied_and_exact(k, rng):
    g, s = in_place(k)
    step = jaxgraph.replayable(g, [s], [s])
    rows = step.bindings[g.device]
    assert rows[1].mode is BindingMode.BOUND and rows[1].sites == SITES_MANY, rows
    s.fill_(np.float32(np.nan))
    f = jax.jit(step)
    before = counters()
    outs = []
    # A new operand and result buffer on every call: the free executables are filled once (no
    # miss), then each call replaces one, and the share of recent calls that missed grows until
    # the misses cost more than copies. How soon depends on what a copy costs in this process
    # (the mean of its copies so far: 4 us, the guess, alone; 12-18 us after test_exec_cache's full
    # cache, tests/GPU_RESULTS.md session 6). Three more windows of calls (kMissWindow, 256) let
    # the share of misses reach ~0.85, room for copies of up to ~25 us against a rewrite of the 64
    # sites (56-87 us measured).
    calls, left = describe_graph(step.graph_id, g.device).max_executables + 768, None
    for call in range(calls):
        x = ints(rng)
        out = f(jnp.asarray(x))
        outs.append(out)                             # alive: the next result gets another address
        np.testing.assert_array_equal(np.asarray(out), x + SITES_MANY, err_msg=f"call {call}")
        if left is None and step.bindings[g.device][1].mode is BindingMode.COPIED_BY_COST:
            left = 2                                 # switched: two more calls settle the executable
        elif left is not None:
            left -= 1
            if left == 0:
                break
    rows = step.bindings[g.device]
    priced = native_module("replay").policy_copy_host_ns()
    assert [r.mode for r in rows] == [BindingMode.COPIED_BY_COST] * 2, (rows, f"a copy priced at {priced:.0f} ns")
    assert "address was new on" in rows[1].reason and "copying it" in rows[1].reason, rows[1].reason
    assert str(rows[1]).startswith("output 0 copied_by_cost (")
    assert counters()["to_copy"] - before["to_copy"] == 1
    settled = counters()
    for _ in range(6):                               # copied now: one executable, nothing rewritten
        x = ints(rng)
        out = f(jnp.asarray(x))
        outs.append(out)
        np.testing.assert_array_equal(np.asarray(out), x + SITES_MANY)
    after = counters()
    change = {key: after[key] - settled[key] for key in after}
    assert change["instantiate"] == 0 and change["rebind"] == 0, change
    assert change["copy"] == 2 * 6, change           # in and out on every call
    info = describe_graph(step.graph_id, g.device)
    assert info.executables == 1 and info.rewrite_ns_per_site > 0, info


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["one_site", "in_place"])
def test_alternating_buffers_hit_cached_executables(k, rng, pattern):
    if pattern == "in_place":
        g, s = in_place(k)
        step, steps = jaxgraph.replayable(g, [s], [s]), SITES_MANY
        s.fill_(np.float32(np.nan))
    else:
        x_s, y_s = jaxgraph.empty(N), jaxgraph.empty(N)
        g = jaxgraph.CUDAGraph()
        with jaxgraph.graph(g):
            k["add_one"][B, 256](y_s, x_s, N)            # one site each
        step, steps = jaxgraph.replayable(g, [x_s], [y_s]), 1
        x_s.fill_(np.float32(np.nan))
        y_s.fill_(np.float32(np.nan))
    x = ints(rng)
    out, seen, change = alternate_calls(jax.jit(step), jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(out), x + steps)
    assert 2 <= len(seen) <= 4, seen                  # the case under test: XLA alternates its results
    assert change["instantiate"] == 0 and change["rebind"] == 0 and change["copy"] == 0, change
    assert change["launch"] == 6, change
    assert all(r.mode is BindingMode.BOUND for r in step.bindings[g.device])
    info = describe_graph(step.graph_id, g.device)
    assert 2 <= info.executables <= info.max_executables, info


@pytest.mark.gpu
def test_describe_graph_weighs_the_executables(k):
    # 10k kernels (~22 MB): the driver reuses device memory destroyed executables left, which can
    # hold a smaller executable whole (measured as 0 bytes after other tests made and dropped some).
    g, s = in_place(k, kernels=10_000)
    step = jaxgraph.replayable(g, [s], [s])
    info = describe_graph(step.graph_id, g.device)
    assert info.kernel_nodes == 10_000 and info.executables == 1, info
    assert info.exec_device_bytes > 0, info          # measured at registration (the upload included)
    assert info.max_executables == policy().policy_exec_budget(info.exec_device_bytes, 10_000) == 1
    # One executable kept, and 2 x 10k kernel arguments point at the state: copied from the start,
    # so XLA's alternating buffers never make a second 22 MB executable.
    rows = step.bindings[g.device]
    assert [r.mode for r in rows] == [BindingMode.COPIED_BY_COST] * 2, rows
    assert "the graph keeps one executable" in rows[1].reason, rows[1].reason
    assert info.device_bytes == info.exec_device_bytes
    # Host figures are the process's resident size around each step: measured (>= 0) on Linux.
    assert min(info.exec_host_bytes, info.clone_host_bytes, info.binding_host_bytes) >= 0, info


@pytest.mark.gpu
def test_one_site_buffers_switched_to_copying_keep_their_executables(k, rng):
    # New addresses on every call: the cache fills (at most max_executables - 1 new executables),
    # then each call rewrites a site in place. Should the measured rewrites cost more than copies,
    # the buffers switch, and their executables are rewritten back, not instantiated again.
    x_s, y_s = jaxgraph.empty(N), jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k["add_one"][B, 256](y_s, x_s, N)
    step = jaxgraph.replayable(g, [x_s], [y_s])
    f = jax.jit(step)
    before, outs = counters(), []
    for call in range(16):
        x = ints(rng)
        outs.append(f(jnp.asarray(x)))
        np.testing.assert_array_equal(np.asarray(outs[-1]), x + 1, err_msg=f"call {call}")
    change = {key: value - before[key] for key, value in counters().items()}
    info = describe_graph(step.graph_id, g.device)
    assert change["instantiate"] <= info.max_executables - 1, (change, info)
    rows = step.bindings[g.device]
    for row in rows:
        assert row.mode in (BindingMode.BOUND, BindingMode.COPIED_BY_COST), rows
        if row.mode is BindingMode.COPIED_BY_COST:
            assert "address was new on" in row.reason, row
    assert change["to_copy"] == sum(r.mode is BindingMode.COPIED_BY_COST for r in rows), (change, rows)
    assert info.executables >= 1, info
