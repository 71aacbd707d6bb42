"""Lifetimes: what a replayable (graphed callable, sharded graph) keeps alive, and what it frees.

A function that captures a graph and returns only the replayable is the
natural way to write a step: the replayable holds its graph, the graph's
executable, memory and kernels until it is closed or collected, so nothing
is retired when the graph object goes out of scope. An explicit ``reset()``
still retires it. Closing or collecting the replayable frees all of it: the
native table's entry and the graph's memory (closed replayables the caller
still holds too).

What a replayable frees when it goes is read through ``jaxgraph.diagnostics``: the native replay
table's live graphs (``native_module("replay").live_graphs()``) and the pools alive (``live_pool_ids``).
"""

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
from support.graph_helpers import GRAPH_KERNELS, MiB, blocks, free_device_bytes, poison

pytestmark = pytest.mark.gpu

N = 4096
BIG = 256 * MiB  # a scratch buffer from the graph's pool, large enough to see in cuMemGetInfo


def axpb_ref(x, a=3.0, b=1.0):
    return np.float32(a) * x + np.float32(b)


def capture_in_a_function(n=N, scratch_bytes=0):
    """Capture y = 3 x + 1 (through a scratch buffer from the graph's pool when asked)
    with a kernel made here, and return what a step function would return: no graph."""
    axpb = jaxgraph.Kernel(GRAPH_KERNELS, "axpb")   # local too: the graph keeps it loaded
    scale = jaxgraph.Kernel(GRAPH_KERNELS, "scale")
    x_s, y_s = jaxgraph.zeros(n), jaxgraph.zeros(n)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        if scratch_bytes:
            tmp = jaxgraph.empty(scratch_bytes // 4)   # from the graph's pool
            axpb[blocks(n), 256](tmp, x_s, 3.0, 1.0, n)
            scale[blocks(n), 256](y_s, tmp, 1.0, n)
        else:
            axpb[blocks(n), 256](y_s, x_s, 3.0, 1.0, n)
    pool_id = g.pool()[1]  # an int: holding the token would keep the pool alive
    return g, x_s, y_s, pool_id


def make_step(via="ffi", scratch_bytes=0):
    g, x_s, y_s, pool_id = capture_in_a_function(scratch_bytes=scratch_bytes)
    return jaxgraph.replayable(g, [x_s], [y_s], via=via), weakref.ref(g), pool_id


@pytest.mark.parametrize("via", ["ffi", "callback"])
def test_a_replayable_returned_without_its_graph_keeps_working(via, rng):
    step, graph_ref, _ = make_step(via)
    gc.collect()
    assert graph_ref() is not None and step.alive
    for _ in range(3):  # fresh inputs every call: eagerly, in jit, between XLA ops
        x = rng.standard_normal(N).astype(np.float32)
        np.testing.assert_allclose(np.asarray(step(jnp.asarray(x))), axpb_ref(x), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(jax.jit(step)(x)), axpb_ref(x), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(jax.jit(lambda x: step(x * 2) - 1)(x)), axpb_ref(x * 2) - 1,
                                   rtol=1e-6, atol=1e-5)


def test_reset_of_the_graph_still_retires_the_replayable(rng):
    g, x_s, y_s, _ = capture_in_a_function()
    step = jaxgraph.replayable(g, [x_s], [y_s])
    x = rng.standard_normal(N).astype(np.float32)
    np.testing.assert_allclose(np.asarray(jax.jit(step)(x)), axpb_ref(x), rtol=1e-6, atol=1e-6)
    g.reset()
    assert not step.alive
    with pytest.raises(RuntimeError, match="was reset or destroyed"):
        jax.jit(lambda x: step(x) + 1)(x)


@pytest.mark.parametrize("close_first", [True, False], ids=["close", "collect"])
def test_closing_then_collecting_the_replayable_frees_its_entry_graph_and_memory(close_first, rng):
    from jaxgraph import diagnostics

    replay = diagnostics.native_module("replay")
    x = rng.standard_normal(N).astype(np.float32)
    xj = jnp.asarray(x).block_until_ready()  # JAX's own device memory is taken before measuring
    gc.collect()
    live, free_before = replay.live_graphs(), free_device_bytes()
    step, graph_ref, pool_id = make_step(scratch_bytes=BIG)
    np.testing.assert_allclose(np.asarray(jax.jit(step)(xj)), axpb_ref(x), rtol=1e-6, atol=1e-6)
    gc.collect()
    held = free_before - free_device_bytes()
    print(f"graph alive: {held / MiB:.0f} MiB held, live graphs {replay.live_graphs()} (was {live})")
    assert replay.live_graphs() == live + 1 and graph_ref() is not None and pool_id in diagnostics.live_pool_ids()
    assert held >= BIG * 0.95
    if close_first:
        step.close()
        assert replay.live_graphs() == live and not step.alive
        with pytest.raises(RuntimeError, match="was closed"):
            step(xj)
    del step  # no reference cycle: everything goes once nothing refers to the replayable
    gc.collect()
    if graph_ref() is not None:  # say so, then let JAX's caches go (they may hold the traced function)
        print(f"held after del and gc: live graphs {replay.live_graphs()}; clearing JAX's caches")
        jax.clear_caches()
        gc.collect()
    assert replay.live_graphs() == live
    assert graph_ref() is None and pool_id not in diagnostics.live_pool_ids()
    regained = free_device_bytes() - (free_before - held)
    print(f"after collection: {regained / MiB:.0f} MiB of {held / MiB:.0f} MiB back")
    assert regained >= BIG * 0.95


@pytest.mark.parametrize("via", ["ffi", "callback"])
def test_closed_replayables_the_caller_still_holds_give_their_device_memory_back(via, rng):
    # Closed but still referenced (a list of steps, a notebook's variables), their jitted functions
    # too: their graphs, static arrays and pools go all the same; each refuses calls with a clear error.
    x = rng.standard_normal(N).astype(np.float32)
    xj = jnp.asarray(x).block_until_ready()
    gc.collect()
    free_before = free_device_bytes()
    steps = [make_step(via, scratch_bytes=64 * MiB)[0] for _ in range(6)]
    jitted = [jax.jit(step) for step in steps]
    for f in jitted:
        np.testing.assert_allclose(np.asarray(f(xj)), axpb_ref(x), rtol=1e-6, atol=1e-6)
    gc.collect()
    held = free_before - free_device_bytes()
    assert held >= 6 * 64 * MiB * 0.95, held
    for step in steps:
        step.close()
    assert not any(step._state.recorded for step in steps)  # a lone replay: XLA records no command buffer
    gc.collect()
    regained = free_device_bytes() - (free_before - held)
    print(f"after close: {regained / MiB:.0f} MiB of {held / MiB:.0f} MiB back, the replayables still held")
    assert regained >= 6 * 64 * MiB * 0.95
    with pytest.raises(RuntimeError, match="this replayable was closed"):
        steps[0](xj)
    with pytest.raises(Exception, match="was closed|reset or destroyed"):  # the handler or the host replay
        np.asarray(jitted[0](xj))
    y = rng.standard_normal(N).astype(np.float32)  # and a new step works in the memory they gave back
    step = make_step(via, scratch_bytes=64 * MiB)[0]
    np.testing.assert_allclose(np.asarray(jax.jit(step)(jnp.asarray(y))), axpb_ref(y), rtol=1e-6, atol=1e-6)


def test_a_graphed_callable_returned_alone_keeps_working(rng):
    def build():
        scale = jaxgraph.Kernel(GRAPH_KERNELS, "scale")

        def twice(x):
            y = jaxgraph.empty(x.shape)
            scale[blocks(x.size), 256](y, x, 2.0, x.size)
            return y

        graphed = jaxgraph.make_graphed_callables(twice, (np.zeros(N, np.float32),))
        return graphed, graphed.replayable

    graphed, step = build()
    only_step = build()[1]  # the replayable alone, its GraphedCallable gone
    gc.collect()
    for _ in range(2):
        x = rng.standard_normal(N).astype(np.float32)
        np.testing.assert_allclose(np.asarray(jax.jit(graphed)(x)), 2 * x, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(jax.jit(only_step)(x)), 2 * x, rtol=1e-6)
        out = graphed(jaxgraph.asarray(x))  # device arrays: an eager replay
        np.testing.assert_allclose(out.numpy(), 2 * x, rtol=1e-6)
    assert step.alive and only_step.alive


def test_a_sharded_graph_returned_alone_keeps_working(rng):
    def build():
        axpb = jaxgraph.Kernel(GRAPH_KERNELS, "axpb")

        def fn(x):
            y = jaxgraph.empty(x.shape)
            axpb[blocks(x.size), 256](y, x, 3.0, 1.0, x.size)
            return y

        sg = jaxgraph.capture_per_device(fn, [jax.ShapeDtypeStruct((N,), jnp.float32)], devices=[0])
        return sg, sg.replayable

    sg, _ = build()
    only_step = build()[1]
    gc.collect()
    gpu = jax.local_devices(backend="gpu")[0]
    for _ in range(2):
        x = rng.standard_normal(N).astype(np.float32)
        xd = jax.device_put(x, gpu)
        np.testing.assert_allclose(np.asarray(jax.jit(sg)(xd)), axpb_ref(x), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(jax.jit(only_step)(xd)), axpb_ref(x), rtol=1e-6, atol=1e-6)
    sg.close()
    assert not sg.alive and only_step.alive


def test_the_graph_keeps_the_kernels_it_launched(rng):
    g, x_s, y_s, _ = capture_in_a_function()
    gc.collect()  # the Kernel objects made inside are referenced only by the graph now
    x = rng.standard_normal(N).astype(np.float32)
    x_s.copy_(x)
    poison(y_s)
    g.replay()
    np.testing.assert_allclose(y_s.numpy(), axpb_ref(x), rtol=1e-6, atol=1e-6)
