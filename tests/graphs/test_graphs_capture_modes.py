"""CUDAGraph on the GPU: exceptions in the body, capture modes and threads, Graph, empty captures.

Every replay runs on fresh random data, outputs are poisoned with NaN first,
and results are checked against numpy.

No capture is left behind by an exception, and Graph keeps its template
(``jaxgraph.diagnostics.captures_underway``, ``graph_template``).
"""

import threading

import numpy as np
import pytest

import jaxgraph
from jaxgraph import diagnostics
from support.graph_helpers import BLOCK, N, blocks, driver_call, load_kernels, random_floats, replay_and_check


@pytest.fixture(scope="module")
def k():
    return load_kernels()


# ---------------------------------------------------------------------------
# Exceptions in the body, capture modes and threads
# ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_garbage_in_reference_cycles_is_not_collected_in_the_middle_of_a_capture(k, rng):
    # Objects that die in cycles and free device memory when finalized, as other libraries'
    # buffers, streams and modules do: a collection inside the capture (the allocations below
    # cross the collector's threshold many times) would call cuMemFree, which invalidates it.
    freed = []

    class Cycle:
        def __init__(self):
            self.me = self
            (self.ptr,) = driver_call("cuMemAlloc", 256)

        def __del__(self):
            freed.append(driver_call("cuMemFree", self.ptr))

    data = random_floats(rng)
    x = jaxgraph.asarray(data)
    y = jaxgraph.empty(N)
    cycles = [Cycle() for _ in range(50)]        # allocated before: cuMemAlloc would invalidate it too
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        del cycles                              # garbage now, reachable only through their cycles
        churn = [[i] for i in range(100_000)]   # ~140 times the default gen-0 threshold
        k.scale[blocks(N), BLOCK](y, x, 2.0, N)
        assert freed == []                      # nothing finalized while capturing
    del churn
    import gc

    gc.collect()
    assert len(freed) == 50                     # collected once the capture ended
    replay_and_check(g, y, 2.0 * data)


@pytest.mark.gpu
def test_exception_in_body_discards_capture_and_restores_stream(k, rng):
    data = random_floats(rng)
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
    assert not diagnostics.captures_underway()
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
    data = random_floats(rng)
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
    data = random_floats(rng)
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
    data = random_floats(rng)
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
    data = random_floats(rng)
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
    assert g.device == jaxgraph.current_device() and diagnostics.graph_template(g) != 0


@pytest.mark.gpu
def test_empty_capture_warns_and_replays_as_a_no_op():
    g = jaxgraph.CUDAGraph()
    with pytest.warns(UserWarning, match="The CUDA Graph is empty"):
        with jaxgraph.graph(g):
            pass
    g.replay()
    jaxgraph.synchronize()
