"""Replay inside jit bound to XLA's buffers (GPU): no copies where that is safe, copies where not.

The static arrays are poisoned (NaN) before the jitted calls: a bound buffer is
never touched (the replay reads XLA's operand and writes XLA's result), so the
poison stays; a copied one is overwritten. Every call draws fresh inputs in new
buffers, so the graph is rebound between calls. Command buffers on and off are
compared in subprocesses in test_jax_gpu.py.

Tests internals (listed in tests/README.md): ``internals.replayable_of_referenced``;
unreferenced inputs left out. Calls per replay path, rebinds, copies and instantiations
come from ``jaxgraph.diagnostics.counters``.
"""

import gc
import os

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxgraph  # noqa: E402
from jaxgraph.diagnostics import counters  # noqa: E402
from support.kernel_sources import ADD, AXPB, COUNT, INC, SCALE_NONCONST  # noqa: E402
from support.graph_helpers import alternate_calls, cupy_stream, launched, path_calls, ref_uniform  # noqa: E402

pytestmark = pytest.mark.gpu

N = 4096
B = (N + 255) // 256

SRC = AXPB + ADD + INC + SCALE_NONCONST + COUNT


@pytest.fixture(scope="module")
def k():
    names = ("axpb", "add", "inc", "scale_nonconst", "bump", "add_count")
    kernels = {name: jaxgraph.Kernel(SRC, name) for name in names}
    for kernel in kernels.values():
        kernel.handle  # noqa: B018 - load before capture
    return kernels


def rnd(rng, n=N):
    return rng.standard_normal(n).astype(np.float32)


def two_stage(k):
    """x -> tmp = 2x + 1 (pool) -> y = tmp + x: x and y each appear in one kernel argument."""
    x_s, y_s = jaxgraph.empty(N), jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        tmp = jaxgraph.empty(N)
        k["axpb"][B, 256](tmp, x_s, 2.0, 1.0, N)
        k["add"][B, 256](y_s, tmp, x_s, N)
    return g, x_s, y_s


def test_bound_buffers_are_never_copied_and_follow_new_addresses(k, rng):
    g, x_s, y_s = two_stage(k)
    step = jaxgraph.replayable(g, [x_s], [y_s])
    (rows,) = step.bindings.values()
    assert [(r.kind, r.mode, r.sites) for r in rows] == [("input", "bound", 2), ("output", "bound", 1)]
    assert "input 0 bound (2 sites); output 0 bound (1 site)" in repr(step)
    x_s.fill_(np.float32(np.nan))
    y_s.fill_(np.float32(np.nan))
    f = jax.jit(step)
    before = counters()
    outs = []
    for _ in range(4):                      # new operand and result buffers on every call
        x = rnd(rng)
        out = f(jnp.asarray(x))
        outs.append(out)                    # kept alive: the next result gets a new address
        np.testing.assert_allclose(np.asarray(out), 3.0 * x + 1.0, rtol=1e-6, atol=1e-6)
    after = counters()
    assert path_calls(before, after) == launched(4), (before, after)  # command buffers are off here
    assert after["copy"] == before["copy"], "a bound buffer was copied"
    assert after["rebind"] > before["rebind"], "new addresses must rebind kernel arguments"
    assert np.isnan(x_s.numpy()).all() and np.isnan(y_s.numpy()).all(), "the static arrays were touched"


def test_alternating_addresses_of_a_many_site_buffer_reuse_cached_executables(k, rng):
    # y is written by 10 kernels (10 sites): rewriting them on every call costs more than
    # keeping one executable per address, so each alternating address gets its own.
    x_s, y_s = jaxgraph.empty(N), jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k["axpb"][B, 256](y_s, x_s, 3.0, 1.0, N)
        for _ in range(9):
            k["inc"][B, 256](y_s, N)
    step = jaxgraph.replayable(g, [x_s], [y_s])
    assert [r.sites for r in step.bindings[jaxgraph.current_device()]] == [1, 10]
    x = rnd(rng)
    out, seen, change = alternate_calls(jax.jit(step), jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(out), 3.0 * x + 10.0, rtol=1e-6, atol=1e-5)
    assert 2 <= len(seen) <= 4, seen  # the case under test: a few alternating result addresses
    assert change["instantiate"] == 0 and change["rebind"] == 0, (seen, change)
    assert path_calls({}, change) == launched(6), change


def test_alternating_addresses_of_a_few_site_buffer_reuse_cached_executables(k, rng):
    # y has one site: each alternating address still gets its own executable while the graph
    # has room for one (bind_policy.h), so a call rewrites nothing: a rewritten executable is
    # slower to launch, and the handler's work would grow with the calls, not with what changed.
    g, x_s, y_s = two_stage(k)
    step = jaxgraph.replayable(g, [x_s], [y_s])
    x = rnd(rng)
    out, seen, change = alternate_calls(jax.jit(step), jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(out), 3.0 * x + 1.0, rtol=1e-6, atol=1e-6)
    assert 2 <= len(seen) <= 4, seen
    assert change["instantiate"] == 0 and change["rebind"] == 0, change
    assert path_calls({}, change) == launched(6), change


def test_copy_fallback_says_why_and_stays_correct(k, rng):
    x_s, w_s, y_s, z_s = (jaxgraph.empty(N) for _ in range(4))
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k["scale_nonconst"][B, 256](y_s, x_s, 2.0, N)   # x through a non-const pointer
        z_s.copy_(w_s)                                   # w read by a memcpy node
        k["add"][B, 256](z_s, z_s, y_s, N)               # z = w + 2x
    step = jaxgraph.replayable(g, [x_s, w_s], [y_s, z_s])
    rows = {(r.kind, r.index): r for r in step.bindings[g.device]}
    assert rows["input", 0].mode == "copied" and "non-const pointer" in rows["input", 0].reason
    assert rows["input", 1].mode == "copied" and "memcpy node" in rows["input", 1].reason
    assert rows["output", 0].mode == "bound"
    assert rows["output", 1].mode == "copied" and "memcpy node writes it" in rows["output", 1].reason
    f = jax.jit(step)
    for _ in range(3):
        x, w = rnd(rng), rnd(rng)
        y, z = f(jnp.asarray(x), jnp.asarray(w))
        np.testing.assert_allclose(np.asarray(y), 2.0 * x, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(z), w + 2.0 * x, rtol=1e-6)
    everything_copied = jaxgraph.replayable(g, [x_s, w_s], [y_s, z_s], bind="copy")
    assert all(r.mode == "copied" for r in everything_copied.bindings[g.device])
    x, w = rnd(rng), rnd(rng)
    y, z = jax.jit(everything_copied)(x, w)
    np.testing.assert_allclose(np.asarray(z), w + 2.0 * x, rtol=1e-6)


def test_a_kernel_jaxgraph_did_not_launch_makes_what_it_touches_copied_unless_trusted(k, rng):
    cupy = pytest.importorskip("cupy")
    double = cupy.RawKernel(r'''extern "C" __global__ void double_it(float* y, const float* x, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 2.0f * x[i]; }''', "double_it")
    x_s, y_s = jaxgraph.empty(N), jaxgraph.empty(N)
    double((B,), (256,), (cupy.asarray(y_s), cupy.asarray(x_s), np.int32(N)))  # compile and load first
    jaxgraph.synchronize()
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        with cupy_stream(cupy, jaxgraph.current_stream()):
            double((B,), (256,), (cupy.asarray(y_s), cupy.asarray(x_s), np.int32(N)))
    step = jaxgraph.replayable(g, [x_s], [y_s])
    rows = step.bindings[g.device]
    assert rows[0].mode == "copied" and "did not launch" in rows[0].reason
    assert rows[1].mode == "copied" and "trust_foreign_kernels=True binds it" in rows[1].reason
    trusted = jaxgraph.replayable(g, [x_s], [y_s], trust_foreign_kernels=True)
    rows = trusted.bindings[g.device]
    # Inputs: copied either way (the reason names the foreign kernel; it says "may write it", or "may
    # hold a pointer to its end" when the allocator placed the output right after the input).
    assert rows[0].mode == "copied" and "double_it, which jaxgraph did not launch" in rows[0].reason
    assert rows[1].mode == "bound"
    for f in (jax.jit(step), jax.jit(trusted)):
        x = rnd(rng)
        np.testing.assert_allclose(np.asarray(f(x)), 2.0 * x, rtol=1e-6)


def test_in_place_graph_aliases_its_input_to_its_output(k, rng):
    s = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        for _ in range(10):
            k["inc"][B, 256](s, N)                   # s += 10, in place
    step = jaxgraph.replayable(g, [s], [s])
    rows = step.bindings[g.device]
    assert rows[1].mode == "bound" and rows[1].sites == 10
    assert rows[0].mode == "bound" and "shares its buffer with output 0" in rows[0].reason
    text = jax.jit(step).trace(jax.ShapeDtypeStruct((N,), jnp.float32)).lower().as_text()
    assert "tf.aliasing_output = 0" in text or "output_operand_alias" in text
    x = rnd(rng)
    xj = jnp.asarray(x)
    np.testing.assert_allclose(np.asarray(jax.jit(step)(xj)), x + 10.0, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(xj), x)            # not donated: left as it was
    donated = jnp.asarray(x)
    ptr = donated.unsafe_buffer_pointer()
    out = jax.jit(step, donate_argnums=0)(donated)
    assert donated.is_deleted() and out.unsafe_buffer_pointer() == ptr  # updated in place
    np.testing.assert_allclose(np.asarray(out), x + 10.0, rtol=1e-6)


def test_user_aliases_with_donation(k, rng):
    g, x_s, y_s = two_stage(k)
    step = jaxgraph.replayable(g, [x_s], [y_s], input_output_aliases={0: 0})
    rows = step.bindings[g.device]
    assert rows[0].mode == "copied" and "aliased to output 0" in rows[0].reason
    assert rows[1].mode == "bound"
    f = jax.jit(step, donate_argnums=0)
    for _ in range(3):
        x = rnd(rng)
        xj = jnp.asarray(x)
        ptr = xj.unsafe_buffer_pointer()
        out = f(xj)
        assert out.unsafe_buffer_pointer() == ptr
        np.testing.assert_allclose(np.asarray(out), 3.0 * x + 1.0, rtol=1e-6, atol=1e-6)


def test_two_calls_in_one_function_both_replay(k, rng):
    x_s, y_s, count = jaxgraph.empty(N), jaxgraph.empty(N), jaxgraph.zeros(1)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k["bump"][1, 1](count)                       # state the graph keeps: count += 1
        k["add_count"][B, 256](y_s, x_s, count, N)
    step = jaxgraph.replayable(g, [x_s], [y_s])
    x = rnd(rng)
    first, second = jax.jit(lambda x: (step(x), step(x)))(x)
    assert float(count.numpy()[0]) == 2.0, "XLA merged the two identical calls into one replay"
    # XLA may run the two independent calls in either order: one saw count 1, the other 2.
    low, high = sorted((np.asarray(first), np.asarray(second)), key=lambda a: float((a - x).mean()))
    np.testing.assert_allclose(low, x + 1.0, rtol=1e-6)
    np.testing.assert_allclose(high, x + 2.0, rtol=1e-6)


def test_generator_graph_draws_fresh_numbers_on_each_call():
    seed = int(np.random.default_rng().integers(2**63))
    gen = jaxgraph.Generator(seed)
    out = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        gen.uniform(out)
    g.register_generator_state(gen)
    start = gen.get_offset()
    step = jaxgraph.replayable(g, [], [out])
    a, b = (np.asarray(v) for v in jax.jit(lambda: (step(), step()))())
    first, second = ref_uniform(seed, start, N), ref_uniform(seed, start + 1, N)
    assert not np.array_equal(a, b), "the two calls drew the same numbers: XLA merged them"
    if not np.array_equal(a, first):   # XLA may run the two independent calls in either order
        a, b = b, a
    np.testing.assert_array_equal(a, first)
    np.testing.assert_array_equal(b, second)
    assert gen.get_offset() == start + 2


def test_unused_outputs_drop_the_call_unless_side_effects(k, rng):
    g, x_s, y_s = two_stage(k)
    pure = jaxgraph.replayable(g, [x_s], [y_s])
    effectful = jaxgraph.replayable(g, [x_s], [y_s], side_effects=True)
    x = jnp.asarray(rnd(rng))

    def runs(step):
        f = jax.jit(lambda x: (step(x), x + 1)[1])   # the replay's output is unused
        jax.block_until_ready(f(x))
        before = counters()
        jax.block_until_ready(f(x))
        after = counters()
        return path_calls(before, after)

    assert runs(pure) == launched(0)        # XLA removed the call, as it removes any unused pure op
    assert runs(effectful) == launched(1)   # kept: one replay per call, launched (command buffers are off here)
    del pure, effectful
    gc.collect()


def test_a_graph_with_memory_nodes_is_refused_in_jit_and_replays_from_the_host(k, rng):
    # cuMemAllocAsync on the capture stream records allocation nodes; CUDA cannot clone
    # such a graph, so it cannot be bound into jit: a clear error, and via="callback" works.
    from cuda.bindings import driver as cu

    x_s, y_s = jaxgraph.empty(N), jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        h = jaxgraph.current_stream().handle
        err, scratch = cu.cuMemAllocAsync(N * 4, h)
        assert err == cu.CUresult.CUDA_SUCCESS, err
        k["axpb"][B, 256](y_s, x_s, 3.0, 1.0, N)
        assert cu.cuMemFreeAsync(scratch, h)[0] == cu.CUresult.CUDA_SUCCESS
    with pytest.raises(RuntimeError, match="allocates or frees memory in its own nodes.*via=\"callback\""):
        jaxgraph.replayable(g, [x_s], [y_s])
    step = jaxgraph.replayable(g, [x_s], [y_s], via="callback")
    x = rnd(rng)
    y_s.fill_(np.float32(np.nan))
    np.testing.assert_allclose(np.asarray(step(jnp.asarray(x))), 3.0 * x + 1.0, rtol=1e-6, atol=1e-6)


def test_an_unreferenced_input_is_unused_and_can_be_left_out(k, rng):
    from support.internals import replayable_of_referenced

    g, x_s, y_s = two_stage(k)
    spare = jaxgraph.empty(N)                       # no node refers to it
    step = jaxgraph.replayable(g, [spare, x_s], [y_s])
    rows = step.bindings[g.device]
    assert rows[0].mode is jaxgraph.BindingMode.UNUSED and "no kernel argument points at it" in rows[0].reason
    assert rows[1].mode is jaxgraph.BindingMode.BOUND
    lean, kept = replayable_of_referenced(g, [spare, x_s], [y_s])
    assert kept == (False, True) and len(lean.in_shapes) == 1
    assert [(r.kind, r.index, r.mode) for r in lean.bindings[g.device]] == [("input", 0, "bound"), ("output", 0, "bound")]
    x = rnd(rng)
    np.testing.assert_allclose(np.asarray(jax.jit(step)(rnd(rng), x)), 3.0 * x + 1.0, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jit(lean)(x)), 3.0 * x + 1.0, rtol=1e-6, atol=1e-6)
