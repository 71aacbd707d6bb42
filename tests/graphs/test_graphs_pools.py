"""CUDAGraph on the GPU: pools shared between graphs, reset and recapture, inputs kept alive.

Every replay runs on fresh random data, outputs are poisoned with NaN first,
and results are checked against numpy; memory is checked with the driver's
free-memory figure and the pools' reserved bytes.

A pool's reserved bytes, and no pool left behind by capture and reset cycles, come from
``jaxgraph.diagnostics.memory_pool`` and ``live_pool_ids``.
"""

import gc
import weakref

import numpy as np
import pytest

import jaxgraph
from jaxgraph import diagnostics
from support.graph_helpers import (BLOCK, MiB, N, blocks, capture_scale, free_device_bytes, load_kernels, poison, random_floats,
                           replay_and_check)


@pytest.fixture(scope="module")
def k():
    return load_kernels()


# ---------------------------------------------------------------------------
# Pools shared between graphs
# ---------------------------------------------------------------------------


def _capture_temp_chain(k, x, n, factor, pool=None):
    """out = factor * x + x through a temporary that dies at the end of the capture."""
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g, pool=pool):
        tmp = jaxgraph.empty(n)
        k.scale[blocks(n), BLOCK](tmp, x, factor, n)
        out = jaxgraph.empty(n)
        k.add[blocks(n), BLOCK](out, tmp, x, n)
        del tmp
    return g, out


@pytest.mark.gpu
def test_two_successive_graphs_sharing_a_pool_use_less_memory(k, rng):
    m = 8 * MiB                 # float32 elements: 32 MiB per array, far above allocator noise
    data = random_floats(rng, m)
    x = jaxgraph.asarray(data)
    block = m * 4

    base = free_device_bytes()
    g1, out1 = _capture_temp_chain(k, x, m, 3.0)
    g2, out2 = _capture_temp_chain(k, x, m, 5.0, pool=g1.pool())
    used_shared = base - free_device_bytes()
    shared_reserved = diagnostics.memory_pool(g1.pool()).reserved_bytes
    assert g2.pool() == g1.pool()
    assert shared_reserved == 3 * block          # g2's temporary reused g1's

    # Replayed in capture order, both results are right.
    poison(out1)
    poison(out2)
    g1.replay()
    g2.replay()
    np.testing.assert_allclose(out1.numpy(), 4.0 * data, rtol=1e-6)
    np.testing.assert_allclose(out2.numpy(), 6.0 * data, rtol=1e-6)

    pool_ref = weakref.ref(diagnostics.memory_pool(g1.pool()))
    del g1, g2, out1, out2
    gc.collect()
    assert pool_ref() is None
    assert free_device_bytes() >= base - 8 * MiB  # the memory went back

    base = free_device_bytes()
    g3, out3 = _capture_temp_chain(k, x, m, 3.0)
    g4, out4 = _capture_temp_chain(k, x, m, 5.0)
    used_separate = base - free_device_bytes()
    separate_reserved = (diagnostics.memory_pool(g3.pool()).reserved_bytes
                         + diagnostics.memory_pool(g4.pool()).reserved_bytes)
    assert separate_reserved == 4 * block
    assert shared_reserved < separate_reserved
    assert used_separate - used_shared >= 24 * MiB, (used_shared, used_separate)
    del g3, g4, out3, out4
    gc.collect()
    assert free_device_bytes() >= base - 8 * MiB


@pytest.mark.gpu
def test_three_successive_graphs_with_a_pool_handle(k, rng):
    data = random_floats(rng)
    x = jaxgraph.asarray(data)
    pool = jaxgraph.graph_pool_handle()
    graphs = []
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g, pool=pool):
        a = jaxgraph.empty(N)
        k.scale[blocks(N), BLOCK](a, x, 2.0, N)        # a = 2x
    graphs.append(g)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g, pool=pool):
        b = jaxgraph.empty(N)
        k.add[blocks(N), BLOCK](b, a, x, N)             # b = 3x (reads g1's output)
    graphs.append(g)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g, pool=pool):
        c = jaxgraph.empty(N)
        k.axpb[blocks(N), BLOCK](c, b, 3.0, 1.0, N)     # c = 9x + 1
    graphs.append(g)
    assert all(gr.pool() == pool for gr in graphs)
    assert graphs[1].pools() == [pool]                  # a lives in the same pool
    for _ in range(2):
        data = random_floats(rng)
        x.copy_(data)
        for arr in (a, b, c):
            poison(arr)
        for gr in graphs:                               # capture order
            gr.replay()
        np.testing.assert_allclose(a.numpy(), 2.0 * data, rtol=1e-6)
        np.testing.assert_allclose(b.numpy(), 3.0 * data, rtol=1e-6)
        np.testing.assert_allclose(c.numpy(), 9.0 * data + 1.0, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_reset_and_recapture(k, rng):
    x = jaxgraph.asarray(random_floats(rng))
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k.axpb[blocks(N), BLOCK](y, x, 2.0, 1.0, N)
    first_pool = g.pool()
    g.replay()
    g.reset()
    with pytest.raises(RuntimeError, match="nothing has been captured"):
        g.replay()
    with pytest.raises(RuntimeError, match="no memory pool"):
        g.pool()
    with jaxgraph.graph(g):
        k.axpb[blocks(N), BLOCK](y, x, 3.0, -1.0, N)
    assert g.pool() != first_pool
    data = random_floats(rng)
    x.copy_(data)
    replay_and_check(g, y, 3.0 * data - 1.0, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_thousand_capture_reset_cycles_return_memory(k, rng):
    data = random_floats(rng)
    x = jaxgraph.asarray(data)
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()

    def cycle():
        with jaxgraph.graph(g):
            tmp = jaxgraph.empty(N)
            k.scale[blocks(N), BLOCK](tmp, x, 2.0, N)
            k.add[blocks(N), BLOCK](y, tmp, x, N)
        g.replay()
        g.reset()

    for _ in range(10):
        cycle()
    gc.collect()
    base = free_device_bytes()
    live_pools = len(diagnostics.live_pool_ids())
    for _ in range(1000):
        cycle()
    gc.collect()
    assert base - free_device_bytes() <= 8 * MiB
    assert len(diagnostics.live_pool_ids()) <= live_pools
    np.testing.assert_allclose(y.numpy(), 3.0 * data, rtol=1e-6)


# ---------------------------------------------------------------------------
# Inputs: kept alive, or checked with check_input_liveness
# ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_external_inputs_are_kept_alive_by_the_graph(k, rng):
    data, x, y, g = capture_scale(k, rng, 2.0)
    owner = weakref.ref(x.owner)
    del x
    gc.collect()
    assert owner() is not None
    replay_and_check(g, y, 2.0 * data)
    g.reset()
    gc.collect()
    assert owner() is None


@pytest.mark.gpu
def test_check_input_liveness_names_the_freed_input(k, rng, side_stream):
    x = jaxgraph.asarray(random_floats(rng))
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    jaxgraph.synchronize()
    with side_stream:
        g.capture_begin(check_input_liveness=True)
        k.scale[blocks(N), BLOCK](y, x, 2.0, N)
        g.capture_end()
    g.replay()
    ptr = x.ptr
    del x
    gc.collect()
    with pytest.raises(RuntimeError, match=rf"input 'x' \(DeviceArray shape \({N},\) float32 at {ptr:#x}, "
                                           r"used by kernel scale\) used in the capture was freed before replay"):
        g.replay()
