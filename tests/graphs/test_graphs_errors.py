"""Graph errors on the GPU: PyTorch's error situations, wrong-state errors.

Every error must leave no capture or pool behind and the current stream as it
was. The errors that need no device are in test_graphs_api.py.

No capture or pool is left behind after an error (``jaxgraph.diagnostics.captures_underway``,
``live_pool_ids``, ``graph_template``).
"""

import gc
import threading
import warnings

import numpy as np
import pytest

import jaxgraph
from jaxgraph import diagnostics
from support.graph_helpers import BLOCK, blocks, load_kernels

N = 1024


# ---------------------------------------------------------------------------
# GPU: PyTorch's error situations
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def k():
    return load_kernels()


def _inputs(rng):
    return jaxgraph.asarray(rng.standard_normal(N, dtype=np.float32)), jaxgraph.empty(N)


def _scale_graph(k, rng, **options):
    """A CUDAGraph(**options) of one kernel, y = 2x, on fresh arrays."""
    x, y = _inputs(rng)
    g = jaxgraph.CUDAGraph(**options)
    with jaxgraph.graph(g):
        k.scale[blocks(N), BLOCK](y, x, 2.0, N)
    return g


@pytest.mark.gpu
def test_capture_on_the_legacy_default_stream_is_refused(k):
    g = jaxgraph.CUDAGraph()
    assert jaxgraph.current_stream().is_legacy_default
    with pytest.raises(RuntimeError, match="CUDA graphs must be captured on a non-default stream"):
        g.capture_begin()
    assert not diagnostics.captures_underway()
    with pytest.raises(RuntimeError, match="no memory pool"):
        g.pool()


@pytest.mark.gpu
def test_recapture_without_reset_is_refused_and_restores_the_stream(k, rng):
    g = _scale_graph(k, rng)
    before = jaxgraph.current_stream()
    with pytest.raises(RuntimeError, match="already holds a capture .* call reset"):
        with jaxgraph.graph(g):
            pass
    assert jaxgraph.current_stream() == before
    assert not jaxgraph.is_current_stream_capturing()
    g.replay()                                     # the first capture is intact


@pytest.mark.gpu
def test_template_gone_with_keep_graph_false(k, rng, tmp_path):
    g = _scale_graph(k, rng)
    for call in (g.raw_cuda_graph, lambda: g.debug_dump(tmp_path / "g.dot"), g.get_graph_data):
        with pytest.raises(RuntimeError, match="cudaGraph_t is not live.*keep_graph=True"):
            call()
    with pytest.raises(RuntimeError, match="instantiate: with keep_graph=False .* keep_graph=True"):
        g.instantiate()
    assert not (tmp_path / "g.dot").exists()


@pytest.mark.gpu
def test_get_graph_data_needs_instantiation(k, rng):
    g = _scale_graph(k, rng, keep_graph=True)
    with pytest.raises(RuntimeError, match="not instantiated yet; call instantiate"):
        g.get_graph_data()


@pytest.mark.gpu
def test_replay_after_reset_is_refused(k, rng):
    g = _scale_graph(k, rng)
    g.reset()
    for call, message in ((g.replay, "nothing has been captured yet"),
                          (g.raw_cuda_graph_exec, "the graph is not instantiated"),
                          (lambda: diagnostics.graph_template(g), "holds no captured graph")):
        with pytest.raises(RuntimeError, match=message):
            call()


@pytest.mark.gpu
def test_wrong_state_during_capture(k, rng, side_stream):
    x, y = _inputs(rng)
    g = jaxgraph.CUDAGraph()
    other = jaxgraph.CUDAGraph()
    jaxgraph.synchronize()
    with side_stream:
        g.capture_begin()
        assert jaxgraph.is_current_stream_capturing()
        k.scale[blocks(N), BLOCK](y, x, 2.0, N)
        with pytest.raises(RuntimeError, match="already holds a capture"):
            g.capture_begin()
        with pytest.raises(RuntimeError, match="already capturing into another graph"):
            other.capture_begin()
        for call in (g.replay, g.instantiate, g.capture_end_post):
            with pytest.raises(RuntimeError, match="underway|no capture has ended"):
                call()
    with pytest.raises(RuntimeError, match="same stream it began on"):
        g.capture_end()                            # the current stream is not side_stream
    errors = []
    t = threading.Thread(target=lambda: _end_capture_recording(g, side_stream, errors))
    t.start()
    t.join()
    assert "thread that began it" in str(errors[0])
    with side_stream:
        g.capture_end()
    g.replay()


def _end_capture_recording(g, stream, errors):
    try:
        with stream:
            g.capture_end()
    except RuntimeError as exc:
        errors.append(exc)


@pytest.mark.gpu
def test_failed_capture_in_graph_context_restores_stream_and_releases_pool(k, rng):
    x, y = _inputs(rng)
    before = jaxgraph.current_stream()
    g = jaxgraph.CUDAGraph()
    gc.collect()
    live_pools = len(diagnostics.live_pool_ids())
    for _ in range(5):
        with pytest.raises(jaxgraph.CudaError, match="cuStreamSynchronize"):
            with jaxgraph.graph(g):
                jaxgraph.empty(N)
                k.scale[blocks(N), BLOCK](y, x, 2.0, N)
                jaxgraph.current_stream().synchronize()    # not permitted while capturing
        assert jaxgraph.current_stream() == before
        assert not jaxgraph.is_current_stream_capturing()
    gc.collect()
    assert len(diagnostics.live_pool_ids()) <= live_pools
    assert not diagnostics.captures_underway()
    with jaxgraph.graph(g):
        k.scale[blocks(N), BLOCK](y, x, 2.0, N)
    g.replay()
    np.testing.assert_allclose(y.numpy(), 2.0 * x.numpy(), rtol=1e-6)


@pytest.mark.gpu
def test_invalidated_capture_makes_capture_end_raise_and_reset(k, rng, side_stream):
    x, y = _inputs(rng)
    g = jaxgraph.CUDAGraph()
    jaxgraph.synchronize()
    with side_stream:
        g.capture_begin()
        k.scale[blocks(N), BLOCK](y, x, 2.0, N)
        with pytest.raises(jaxgraph.CudaError):
            side_stream.synchronize()
        with pytest.raises(jaxgraph.CudaError, match="cuStreamEndCapture.*invalidated"):
            g.capture_end()
    assert not diagnostics.captures_underway()
    with pytest.raises(RuntimeError, match="no memory pool"):
        g.pool()
    with side_stream:
        g.capture_begin()
        k.scale[blocks(N), BLOCK](y, x, 2.0, N)
        g.capture_end()
    g.replay()


@pytest.mark.gpu
def test_host_copy_inside_capture_is_refused(rng):
    y = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    with pytest.raises(RuntimeError, match="copy_ from host memory cannot be captured"):
        with jaxgraph.graph(g):
            y.copy_(rng.standard_normal(N, dtype=np.float32))
    assert not jaxgraph.is_current_stream_capturing()


@pytest.mark.gpu
def test_empty_capture_by_hand_warns(side_stream):
    g = jaxgraph.CUDAGraph()
    with side_stream:
        g.capture_begin()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            g.capture_end()
    assert any("The CUDA Graph is empty" in str(w.message) for w in caught)
