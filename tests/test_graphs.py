"""CUDAGraph, graph() and Graph on the GPU: capture, replay, pools, hooks, lifetimes.

In the spirit of PyTorch's graph tests: every replay runs on fresh random
data, outputs are poisoned with NaN first, and results are checked against
numpy.

Tests internals (listed in tests/README.md): ``_captures.any_underway``, ``_memory._pools``,
``_memory.pool_from_token``, ``_replay_args.source_of``, ``_graphs._native_graph_launch``
(patched); no capture or pool left behind, a pool's reserved bytes, the template kept for
splicing, a failing launch.
"""

import gc
import threading
import weakref

import numpy as np
import pytest

import jaxgraph
from graph_support import BLOCK, MiB, blocks, driver_call, free_device_bytes, load_kernels, poison, replay_and_check
from jaxgraph import _captures, _memory
from jaxgraph._replay_args import source_of

N = 4096


@pytest.fixture(scope="module")
def k():
    return load_kernels()


def _random(rng, n=N):
    return rng.standard_normal(n, dtype=np.float32)


def _pool_of(graph):
    return _memory.pool_from_token(graph.pool())


# ---------------------------------------------------------------------------
# Capture and replay
# ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_capture_then_replay_on_new_data(k, rng):
    x = jaxgraph.asarray(_random(rng))
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k.axpb[blocks(N), BLOCK](y, x, 2.0, 1.0, N)
    for _ in range(3):
        data = _random(rng)
        x.copy_(data)
        replay_and_check(g, y, 2.0 * data + 1.0)


@pytest.mark.gpu
def test_capture_records_memset_memcpy_and_a_reduction(k, rng):
    x = jaxgraph.asarray(_random(rng))
    total = jaxgraph.empty(1)
    copy = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        total.fill_(np.float32(0))
        k.block_sum[blocks(N), BLOCK](total, x, N)
        copy.copy_(x)
    for _ in range(2):
        data = _random(rng)
        x.copy_(data)
        poison(total)
        replay_and_check(g, copy, data, rtol=0)
        np.testing.assert_allclose(total.numpy()[0], data.astype(np.float64).sum(), rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
def test_capture_does_not_run_the_work(k, rng):
    data = _random(rng)
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
    data = _random(rng)
    x = jaxgraph.asarray(data)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        tmp = jaxgraph.empty(N)
        k.scale[blocks(N), BLOCK](tmp, x, 3.0, N)
        out = jaxgraph.empty(N)
        k.add[blocks(N), BLOCK](out, tmp, x, N)
        del tmp
    pool = _pool_of(g)
    assert out.owner.pool is pool
    assert pool.reserved_bytes >= 2 * N * 4
    assert isinstance(g.pool(), tuple) and g.pool() == (0, pool.id)
    assert g.pools()[0] == g.pool()
    replay_and_check(g, out, 4.0 * data)


@pytest.mark.gpu
def test_graph_memory_stays_valid_while_graph_lives_and_returns_when_it_dies(k, rng):
    data = _random(rng)
    x = jaxgraph.asarray(data)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        out = jaxgraph.empty(N)
        k.scale[blocks(N), BLOCK](out, x, 2.0, N)
    pool_ref = weakref.ref(_pool_of(g))
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
    data = _random(rng)
    x = jaxgraph.asarray(data)
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k.scale[blocks(N), BLOCK](y, x, -1.0, N)
    poison(y)
    jaxgraph.synchronize()
    with side_stream:
        g.replay()
        got = jaxgraph.to_host(y)            # waits for side_stream
    np.testing.assert_array_equal(got, -data)


@pytest.mark.gpu
def test_graph_with_explicit_stream_makes_it_current_and_restores(k, rng, side_stream):
    x = jaxgraph.asarray(_random(rng))
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
    x = jaxgraph.asarray(_random(rng))
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
    data = _random(rng)
    x = jaxgraph.asarray(data)
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k.scale[blocks(N), BLOCK](y, x, 5.0, N)
    assert g.raw_cuda_graph_exec() != 0
    with pytest.raises(RuntimeError, match="not live"):
        g.raw_cuda_graph()
    # The template is kept privately for splicing into XLA graphs.
    assert source_of(g).template != 0
    replay_and_check(g, y, 5.0 * data)


@pytest.mark.gpu
def test_keep_graph_true_instantiates_on_first_replay(k, rng):
    data = _random(rng)
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
    assert source_of(g).template == g.raw_cuda_graph()


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
    data = _random(rng)
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
    x = jaxgraph.asarray(_random(rng))
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
    x = jaxgraph.asarray(_random(rng))
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
    monkeypatch.setattr(jaxgraph._graphs, "_native_graph_launch", lambda graph_exec, stream: invalid_value)
    with pytest.raises(jaxgraph.CudaError, match="cuGraphLaunch failed with CUDA_ERROR_INVALID_VALUE"):
        g.replay()
    assert events == ["start", "end"]
    monkeypatch.undo()
    g.replay()
    assert events == ["start", "end", "start", "end"]


@pytest.mark.gpu
def test_destroy_callbacks_fire_once_on_reset_and_on_collection(k, rng):
    x = jaxgraph.asarray(_random(rng))
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
    data = _random(rng, m)
    x = jaxgraph.asarray(data)
    block = m * 4

    base = free_device_bytes()
    g1, out1 = _capture_temp_chain(k, x, m, 3.0)
    g2, out2 = _capture_temp_chain(k, x, m, 5.0, pool=g1.pool())
    used_shared = base - free_device_bytes()
    shared_reserved = _pool_of(g1).reserved_bytes
    assert g2.pool() == g1.pool()
    assert shared_reserved == 3 * block          # g2's temporary reused g1's

    # Replayed in capture order, both results are right.
    poison(out1)
    poison(out2)
    g1.replay()
    g2.replay()
    np.testing.assert_allclose(out1.numpy(), 4.0 * data, rtol=1e-6)
    np.testing.assert_allclose(out2.numpy(), 6.0 * data, rtol=1e-6)

    pool_ref = weakref.ref(_pool_of(g1))
    del g1, g2, out1, out2
    gc.collect()
    assert pool_ref() is None
    assert free_device_bytes() >= base - 8 * MiB  # the memory went back

    base = free_device_bytes()
    g3, out3 = _capture_temp_chain(k, x, m, 3.0)
    g4, out4 = _capture_temp_chain(k, x, m, 5.0)
    used_separate = base - free_device_bytes()
    separate_reserved = _pool_of(g3).reserved_bytes + _pool_of(g4).reserved_bytes
    assert separate_reserved == 4 * block
    assert shared_reserved < separate_reserved
    assert used_separate - used_shared >= 24 * MiB, (used_shared, used_separate)
    del g3, g4, out3, out4
    gc.collect()
    assert free_device_bytes() >= base - 8 * MiB


@pytest.mark.gpu
def test_three_successive_graphs_with_a_pool_handle(k, rng):
    data = _random(rng)
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
        data = _random(rng)
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
    x = jaxgraph.asarray(_random(rng))
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
    data = _random(rng)
    x.copy_(data)
    replay_and_check(g, y, 3.0 * data - 1.0, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_thousand_capture_reset_cycles_return_memory(k, rng):
    data = _random(rng)
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
    live_pools = len(_memory._pools)
    for _ in range(1000):
        cycle()
    gc.collect()
    assert base - free_device_bytes() <= 8 * MiB
    assert len(_memory._pools) <= live_pools
    np.testing.assert_allclose(y.numpy(), 3.0 * data, rtol=1e-6)


# ---------------------------------------------------------------------------
# Inputs: kept alive, or checked with check_input_liveness
# ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_external_inputs_are_kept_alive_by_the_graph(k, rng):
    data = _random(rng)
    x = jaxgraph.asarray(data)
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k.scale[blocks(N), BLOCK](y, x, 2.0, N)
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
    x = jaxgraph.asarray(_random(rng))
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


# ---------------------------------------------------------------------------
# Exceptions in the body, capture modes and threads
# ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_exception_in_body_discards_capture_and_restores_stream(k, rng):
    data = _random(rng)
    x = jaxgraph.asarray(data)
    y = jaxgraph.empty(N)
    before = jaxgraph.current_stream()
    g = jaxgraph.CUDAGraph()
    with pytest.raises(ValueError, match="boom"):
        with jaxgraph.graph(g):
            capture_stream = jaxgraph.current_stream()
            jaxgraph.empty(N)                       # a pool allocation, released with the capture
            k.scale[blocks(N), BLOCK](y, x, 2.0, N)
            raise ValueError("boom")
    assert jaxgraph.current_stream() == before
    assert not jaxgraph.is_current_stream_capturing()
    assert not _captures.any_underway()
    from cuda.bindings import driver

    (status,) = driver_call("cuStreamIsCapturing", capture_stream.handle)
    assert status == driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
    with pytest.raises(RuntimeError, match="no memory pool"):
        g.pool()
    with jaxgraph.graph(g):                          # recapturable
        k.scale[blocks(N), BLOCK](y, x, 4.0, N)
    replay_and_check(g, y, 4.0 * data)


def _alloc_in_other_thread(device):
    """cuMemAlloc (a "potentially unsafe" call during capture) from a new thread."""
    result = {}

    def work():
        from cuda.bindings import driver

        jaxgraph.set_device(device)  # the device's primary context, current on this thread
        err, ptr = driver.cuMemAlloc(1 << 20)
        result["err"], result["ptr"] = err, ptr

    t = threading.Thread(target=work)
    t.start()
    t.join()
    return result


@pytest.mark.gpu
def test_unsafe_call_from_another_thread_fails_under_global(k, rng):
    data = _random(rng)
    x = jaxgraph.asarray(data)
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    result = {}
    try:
        with jaxgraph.graph(g, capture_error_mode="global"):
            k.scale[blocks(N), BLOCK](y, x, 2.0, N)
            result = _alloc_in_other_thread(jaxgraph.current_device())
    except jaxgraph.CudaError:
        pass  # the driver may also invalidate the capture; the graph is then reset
    err = result["err"]
    assert err != 0 and err.name.startswith("CUDA_ERROR_STREAM_CAPTURE"), err
    g.reset()
    with jaxgraph.graph(g, capture_error_mode="global"):
        k.scale[blocks(N), BLOCK](y, x, 2.0, N)
    replay_and_check(g, y, 2.0 * data)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["relaxed", "thread_local"])
def test_unsafe_call_from_another_thread_passes_under_relaxed_modes(k, rng, mode):
    data = _random(rng)
    x = jaxgraph.asarray(data)
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g, capture_error_mode=mode):
        k.scale[blocks(N), BLOCK](y, x, 2.0, N)
        result = _alloc_in_other_thread(jaxgraph.current_device())
    assert result["err"] == 0, result["err"]
    driver_call("cuMemFree", result["ptr"])
    replay_and_check(g, y, 2.0 * data)


# ---------------------------------------------------------------------------
# Graph (torch.accelerator.Graph) and empty captures
# ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_accelerator_graph_captures_on_the_current_stream(k, rng, side_stream):
    data = _random(rng)
    x = jaxgraph.asarray(data)
    g = jaxgraph.Graph()
    jaxgraph.synchronize()
    with side_stream, g:
        assert jaxgraph.current_stream() == side_stream
        assert jaxgraph.is_current_stream_capturing()
        k.axpb[blocks(N), BLOCK](x, x, 1.0, 1.0, N)   # x += 1
    assert not jaxgraph.is_current_stream_capturing()
    np.testing.assert_array_equal(x.numpy(), data)
    g.replay()
    g.replay()
    np.testing.assert_allclose(x.numpy(), data + 2.0, rtol=1e-6)

    g2 = jaxgraph.Graph(pool=g.pool())
    with side_stream, g2:
        out = jaxgraph.empty(N)
        k.scale[blocks(N), BLOCK](out, x, 2.0, N)
    assert g2.pool() == g.pool()
    g.replay()
    g2.replay()
    np.testing.assert_allclose(out.numpy(), 2.0 * (data + 3.0), rtol=1e-6)
    g.reset()
    with pytest.raises(RuntimeError, match="nothing has been captured yet"):
        g.replay()


@pytest.mark.gpu
def test_accelerator_graph_keep_graph_and_exception(k, rng, side_stream):
    data = _random(rng)
    x = jaxgraph.asarray(data)
    g = jaxgraph.Graph(keep_graph=True, capture_error_mode="relaxed")
    with pytest.raises(KeyError):
        with side_stream, g:
            k.axpb[blocks(N), BLOCK](x, x, 1.0, 1.0, N)
            raise KeyError("inside")
    assert jaxgraph.current_stream() != side_stream
    with side_stream, g:
        k.axpb[blocks(N), BLOCK](x, x, 1.0, 1.0, N)
    g.instantiate()
    np.testing.assert_array_equal(x.numpy(), data)   # neither capture ran the work
    g.replay()
    np.testing.assert_allclose(x.numpy(), data + 1.0, rtol=1e-6)
    assert g.device == jaxgraph.current_device() and source_of(g).template != 0


@pytest.mark.gpu
def test_empty_capture_warns_and_replays_as_a_no_op():
    g = jaxgraph.CUDAGraph()
    with pytest.warns(UserWarning, match="The CUDA Graph is empty"):
        with jaxgraph.graph(g):
            pass
    g.replay()
    jaxgraph.synchronize()
