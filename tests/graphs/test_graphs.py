"""CUDAGraph, graph() and Graph on the GPU: capture and replay, streams, keep_graph, hooks.

In the spirit of PyTorch's graph tests: every replay runs on fresh random
data, outputs are poisoned with NaN first, and results are checked against
numpy. Pools shared between graphs and kept inputs are in
test_graphs_pools.py; exceptions, capture modes, threads and Graph in
test_graphs_capture_modes.py.

Tests internals (listed in tests/README.md): ``_graphs.cuda_graph._native_graph_launch`` (patched): a failing
launch. A pool's reserved bytes and the template kept for splicing come from ``jaxgraph.diagnostics``.
"""

import gc
import weakref

import numpy as np
import pytest

import jaxgraph
from jaxgraph import diagnostics
from support.graph_helpers import BLOCK, N, blocks, capture_scale, load_kernels, poison, random_floats, replay_and_check


@pytest.fixture(scope="module")
def k():
    return load_kernels()


# ---------------------------------------------------------------------------
# Capture and replay
# ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_capture_then_replay_on_new_data(k, rng):
    x = jaxgraph.asarray(random_floats(rng))
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k.axpb[blocks(N), BLOCK](y, x, 2.0, 1.0, N)
    for _ in range(3):
        data = random_floats(rng)
        x.copy_(data)
        replay_and_check(g, y, 2.0 * data + 1.0)


@pytest.mark.gpu
def test_capture_records_memset_memcpy_and_a_reduction(k, rng):
    x = jaxgraph.asarray(random_floats(rng))
    total = jaxgraph.empty(1)
    copy = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        total.fill_(np.float32(0))
        k.block_sum[blocks(N), BLOCK](total, x, N)
        copy.copy_(x)
    for _ in range(2):
        data = random_floats(rng)
        x.copy_(data)
        poison(total)
        replay_and_check(g, copy, data, rtol=0)
        np.testing.assert_allclose(total.numpy()[0], data.astype(np.float64).sum(), rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
def test_capture_does_not_run_the_work(k, rng):
    data = random_floats(rng)
    x = jaxgraph.asarray(data)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k.axpb[blocks(N), BLOCK](x, x, 1.0, 1.0, N)   # x += 1, in place
    np.testing.assert_array_equal(x.numpy(), data)
    g.replay()
    g.replay()
    np.testing.assert_allclose(x.numpy(), data + 2.0, rtol=1e-6)


@pytest.mark.gpu
def test_allocations_during_capture_come_from_the_graph_pool(k, rng):
    data = random_floats(rng)
    x = jaxgraph.asarray(data)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        tmp = jaxgraph.empty(N)
        k.scale[blocks(N), BLOCK](tmp, x, 3.0, N)
        out = jaxgraph.empty(N)
        k.add[blocks(N), BLOCK](out, tmp, x, N)
        del tmp
    pool = diagnostics.memory_pool(g.pool())
    assert out.owner.pool is pool
    assert pool.reserved_bytes >= 2 * N * 4
    assert isinstance(g.pool(), tuple) and g.pool() == (0, pool.id)
    assert g.pools()[0] == g.pool()
    replay_and_check(g, out, 4.0 * data)


@pytest.mark.gpu
def test_graph_memory_stays_valid_while_graph_lives_and_returns_when_it_dies(k, rng):
    data = random_floats(rng)
    x = jaxgraph.asarray(data)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        out = jaxgraph.empty(N)
        k.scale[blocks(N), BLOCK](out, x, 2.0, N)
    pool_ref = weakref.ref(diagnostics.memory_pool(g.pool()))
    out_ref = weakref.ref(out.owner)
    del out                                  # the graph still writes it: the pool keeps it
    gc.collect()
    assert pool_ref() is not None
    g.replay()
    g.reset()
    del g
    gc.collect()
    assert out_ref() is None and pool_ref() is None


@pytest.mark.gpu
def test_replay_runs_on_the_current_stream(k, rng, side_stream):
    data, x, y, g = capture_scale(k, rng, -1.0)
    poison(y)
    jaxgraph.synchronize()
    with side_stream:
        g.replay()
        got = jaxgraph.to_host(y)            # waits for side_stream
    np.testing.assert_array_equal(got, -data)


@pytest.mark.gpu
def test_graph_with_explicit_stream_makes_it_current_and_restores(k, rng, side_stream):
    x = jaxgraph.asarray(random_floats(rng))
    y = jaxgraph.empty(N)
    before = jaxgraph.current_stream()
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g, stream=side_stream):
        assert jaxgraph.current_stream() == side_stream
        assert jaxgraph.is_current_stream_capturing()
        k.scale[blocks(N), BLOCK](y, x, 2.0, N)
    assert jaxgraph.current_stream() == before
    assert not jaxgraph.is_current_stream_capturing()
    assert g.device == side_stream.device


@pytest.mark.gpu
def test_default_capture_stream_is_a_side_stream(k, rng):
    x = jaxgraph.asarray(random_floats(rng))
    y = jaxgraph.empty(N)
    before = jaxgraph.current_stream()
    seen = []
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        seen.append(jaxgraph.current_stream())
        assert jaxgraph.is_current_stream_capturing()
        k.scale[blocks(N), BLOCK](y, x, 2.0, N)
    assert not seen[0].is_legacy_default and seen[0] != before
    assert jaxgraph.current_stream() == before
    assert not jaxgraph.is_current_stream_capturing()


# ---------------------------------------------------------------------------
# keep_graph, instantiate and the capture_end sequence
# ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_keep_graph_false_instantiates_at_capture_end(k, rng):
    data, x, y, g = capture_scale(k, rng, 5.0)
    assert g.raw_cuda_graph_exec() != 0
    with pytest.raises(RuntimeError, match="not live"):
        g.raw_cuda_graph()
    # The template is kept privately for splicing into XLA graphs.
    assert diagnostics.graph_template(g) != 0
    replay_and_check(g, y, 5.0 * data)


@pytest.mark.gpu
def test_keep_graph_true_instantiates_on_first_replay(k, rng):
    data = random_floats(rng)
    x = jaxgraph.asarray(data)
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph(keep_graph=True)
    instantiations = []
    g.register_post_instantiate_hook(lambda graph: instantiations.append(graph.raw_cuda_graph_exec()))
    with jaxgraph.graph(g):
        k.scale[blocks(N), BLOCK](y, x, 3.0, N)
    assert g.raw_cuda_graph() != 0
    assert instantiations == []
    with pytest.raises(RuntimeError, match="not instantiated"):
        g.raw_cuda_graph_exec()
    poison(y)
    g.replay()
    assert len(instantiations) == 1 and instantiations[0] == g.raw_cuda_graph_exec()
    np.testing.assert_allclose(y.numpy(), 3.0 * data, rtol=1e-6)
    g.replay()
    assert len(instantiations) == 1
    assert diagnostics.graph_template(g) == g.raw_cuda_graph()


@pytest.mark.gpu
def test_reinstantiate_after_editing_the_raw_graph(k):
    from cuda.bindings import driver

    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph(keep_graph=True)
    with jaxgraph.graph(g):
        y.fill_(np.float32(1.0))
    g.instantiate()
    first_exec = g.raw_cuda_graph_exec()
    replay_and_check(g, y, np.ones(N, np.float32), rtol=0)

    template = driver.CUgraph(g.raw_cuda_graph())
    err, nodes, count = driver.cuGraphGetNodes(template, 1)
    assert err == driver.CUresult.CUDA_SUCCESS and count == 1
    err, params = driver.cuGraphMemsetNodeGetParams(nodes[0])
    assert err == driver.CUresult.CUDA_SUCCESS
    params.value = int(np.array(5.0, np.float32).view(np.uint32))
    (err,) = driver.cuGraphMemsetNodeSetParams(nodes[0], params)
    assert err == driver.CUresult.CUDA_SUCCESS

    poison(y)
    g.replay()                       # the old exec does not have the edit
    np.testing.assert_array_equal(y.numpy(), np.ones(N, np.float32))
    g.instantiate()                  # a fresh exec that has it
    assert g.raw_cuda_graph_exec() != first_exec
    replay_and_check(g, y, np.full(N, 5.0, np.float32), rtol=0)


@pytest.mark.gpu
def test_capture_end_pre_and_post_by_hand(k, rng, side_stream):
    data = random_floats(rng)
    x = jaxgraph.asarray(data)
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    jaxgraph.synchronize()
    with side_stream:
        g.capture_begin()
        k.scale[blocks(N), BLOCK](y, x, 7.0, N)
        g.capture_end_pre()
    assert g.raw_cuda_graph() != 0           # live in both modes
    with pytest.raises(RuntimeError, match="instantiated first"):
        g.capture_end_post()
    g.instantiate()
    g.capture_end_post()
    with pytest.raises(RuntimeError, match="not live"):
        g.raw_cuda_graph()
    replay_and_check(g, y, 7.0 * data)


@pytest.mark.gpu
@pytest.mark.parametrize("keep_graph", [False, True])
def test_hook_order(k, rng, keep_graph):
    x = jaxgraph.asarray(random_floats(rng))
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph(keep_graph=keep_graph)
    events = []
    g.register_capture_end_hook(lambda gr: events.append(("capture_end", gr.raw_cuda_graph() != 0)))
    g.register_capture_end_hook(lambda gr: events.append(("capture_end_2",)))
    g.register_post_instantiate_hook(
        lambda gr: events.append(("post_instantiate", gr.raw_cuda_graph() != 0, gr.raw_cuda_graph_exec() != 0)))
    g.register_replay_start_hook(lambda gr: events.append(("replay_start",)))
    g.register_replay_end_hook(lambda gr: events.append(("replay_end",)))
    removed = g.register_capture_end_hook(lambda gr: events.append(("removed",)))
    removed.remove()
    with jaxgraph.graph(g):
        k.scale[blocks(N), BLOCK](y, x, 2.0, N)
    expected = [("capture_end", True), ("capture_end_2",)]
    if not keep_graph:  # instantiated inside capture_end, template still live for the hook
        expected.append(("post_instantiate", True, True))
    assert events == expected
    g.replay()
    if keep_graph:
        expected.append(("post_instantiate", True, True))
    expected += [("replay_start",), ("replay_end",)]
    assert events == expected


@pytest.mark.gpu
def test_replay_end_hook_fires_when_the_launch_fails(k, rng, monkeypatch):
    x = jaxgraph.asarray(random_floats(rng))
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k.scale[blocks(N), BLOCK](y, x, 2.0, N)
    events = []
    g.register_replay_start_hook(lambda gr: events.append("start"))
    g.register_replay_end_hook(lambda gr: events.append("end"))
    from cuda.bindings import driver

    invalid_value = int(driver.CUresult.CUDA_ERROR_INVALID_VALUE)
    # replay() launches through the native cuGraphLaunch: make that one fail.
    monkeypatch.setattr(jaxgraph._graphs.cuda_graph, "_native_graph_launch", lambda graph_exec, stream: invalid_value)
    with pytest.raises(jaxgraph.CudaError, match="cuGraphLaunch failed with CUDA_ERROR_INVALID_VALUE"):
        g.replay()
    assert events == ["start", "end"]
    monkeypatch.undo()
    g.replay()
    assert events == ["start", "end", "start", "end"]


@pytest.mark.gpu
def test_destroy_callbacks_fire_once_on_reset_and_on_collection(k, rng):
    x = jaxgraph.asarray(random_floats(rng))
    y = jaxgraph.empty(N)
    calls = []

    def capture():
        g = jaxgraph.CUDAGraph()
        with jaxgraph.graph(g):
            k.scale[blocks(N), BLOCK](y, x, 2.0, N)
        return g

    g = capture()
    g.register_destroy_callback(lambda: calls.append("a"))
    g.register_destroy_callback(lambda: calls.append("b"))
    g.register_destroy_callback(lambda: calls.append("removed")).remove()
    g.reset()
    assert calls == ["a", "b"]
    g.reset()
    assert calls == ["a", "b"]

    g2 = capture()
    g2.register_destroy_callback(lambda: calls.append("collected"))
    del g2
    gc.collect()
    assert calls == ["a", "b", "collected"]
