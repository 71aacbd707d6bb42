"""Graph errors and API shape: the seeds' signatures, wrong-state errors, hooks.

The first half needs no device: signatures, argument validation (which
happens before any driver call) and errors before capture. The second half
checks PyTorch's error situations on the GPU.

Tests internals (listed in tests/README.md): ``_captures.any_underway``, ``_memory._pools``,
``_replay_args.source_of``; no capture or pool left behind after an error.
"""

import functools
import gc
import inspect
import threading
import warnings
import weakref

import numpy as np
import pytest

import jaxgraph
from graph_support import BLOCK, blocks, load_kernels
from jaxgraph import _captures, _memory
from jaxgraph._replay_args import source_of

N = 1024
EMPTY = inspect.Parameter.empty


def _params(fn):
    """[(name, default, kind)] of a callable, without ``self``."""
    sig = inspect.signature(fn)
    return [(p.name, p.default, p.kind) for p in sig.parameters.values() if p.name != "self"]


PK = inspect.Parameter.POSITIONAL_OR_KEYWORD
KW = inspect.Parameter.KEYWORD_ONLY


# ---------------------------------------------------------------------------
# CPU: the API has the seeds' shape
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("member, expected", [
    ("__init__", [("keep_graph", False, PK)]),
    ("capture_begin", [("pool", None, PK), ("capture_error_mode", "global", PK),
                       ("check_input_liveness", False, PK)]),
    ("capture_end", []),
    ("capture_end_pre", []),
    ("capture_end_post", []),
    ("debug_dump", [("debug_path", EMPTY, PK), ("verbose", True, KW)]),
    ("enable_debug_mode", []),
    ("get_graph_data", []),
    ("instantiate", []),
    ("pool", []),
    ("pools", []),
    ("raw_cuda_graph", []),
    ("raw_cuda_graph_exec", []),
    ("register_capture_end_hook", [("hook", EMPTY, PK)]),
    ("register_post_instantiate_hook", [("hook", EMPTY, PK)]),
    ("register_generator_state", [("generator", EMPTY, PK)]),
    ("register_replay_start_hook", [("hook", EMPTY, PK)]),
    ("register_replay_end_hook", [("hook", EMPTY, PK)]),
    ("register_destroy_callback", [("callback", EMPTY, PK)]),
    ("replay", []),
    ("reset", []),
])
def test_cudagraph_members_match_the_seeds(member, expected):
    assert _params(getattr(jaxgraph.CUDAGraph, member)) == expected


def test_graph_context_manager_signature():
    assert _params(jaxgraph.graph) == [("cuda_graph", EMPTY, PK), ("pool", None, PK), ("stream", None, PK),
                                       ("capture_error_mode", "global", PK)]


def test_accelerator_graph_signature():
    assert _params(jaxgraph.Graph) == [("keep_graph", False, PK), ("pool", None, KW),
                                       ("capture_error_mode", "default", KW)]
    for member in ("capture_begin", "capture_end", "instantiate", "pool", "replay", "reset",
                   "enable_debug_mode", "__enter__"):
        assert _params(getattr(jaxgraph.Graph, member)) == [], member
    assert _params(jaxgraph.Graph.debug_dump) == [("path", EMPTY, PK)]


def test_module_functions_exist():
    assert _params(jaxgraph.is_current_stream_capturing) == []
    assert callable(jaxgraph.graph_pool_handle)
    assert jaxgraph.CUDAGraph(keep_graph=True)._keep_graph is True


# ---------------------------------------------------------------------------
# CPU: errors before capture, validated before any driver call
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("call, match", [
    (lambda g: g.replay(), "replay: nothing has been captured"),
    (lambda g: g.instantiate(), "instantiate: nothing has been captured"),
    (lambda g: g.capture_end(), "capture_end: no capture is underway"),
    (lambda g: g.capture_end_pre(), "capture_end_pre: no capture is underway"),
    (lambda g: g.capture_end_post(), "capture_end_post: no capture has ended"),
    (lambda g: g.raw_cuda_graph(), "raw_cuda_graph: nothing has been captured"),
    (lambda g: g.raw_cuda_graph_exec(), "raw_cuda_graph_exec: the graph is not instantiated"),
    (lambda g: g.debug_dump("unused.dot"), "debug_dump: nothing has been captured"),
    (lambda g: g.get_graph_data(), "get_graph_data: nothing has been captured"),
    (lambda g: g.pool(), "pool: this graph has no memory pool"),
    (lambda g: source_of(g).template, "holds no captured graph"),
])
@pytest.mark.parametrize("keep_graph", [False, True])
def test_errors_before_capture(call, match, keep_graph):
    g = jaxgraph.CUDAGraph(keep_graph=keep_graph)
    with pytest.raises(RuntimeError, match=match):
        call(g)
    assert g.pools() == []


def test_unknown_capture_mode_is_rejected_before_the_driver():
    g = jaxgraph.CUDAGraph()
    with pytest.raises(ValueError, match="capture_error_mode must be one of 'global', 'thread_local', "
                                         "'relaxed', got 'strict'"):
        g.capture_begin(capture_error_mode="strict")
    with pytest.raises(ValueError, match="got 'default'"):
        g.capture_begin(capture_error_mode="default")       # only Graph accepts "default"
    with pytest.raises(ValueError, match="got 'GLOBAL'"):
        jaxgraph.graph(g, capture_error_mode="GLOBAL")
    with pytest.raises(ValueError, match="'default', 'global', 'thread_local', 'relaxed'"):
        jaxgraph.Graph(capture_error_mode="loose")


def test_bad_pool_arguments_are_rejected_before_the_driver():
    g = jaxgraph.CUDAGraph()
    with pytest.raises(TypeError, match="pool must be a token"):
        g.capture_begin(pool="mine")
    with pytest.raises(ValueError, match=r"pool \(0, 987654321\) no longer exists"):
        g.capture_begin(pool=(0, 987654321))
    with pytest.raises(TypeError, match="pool must be a token"):
        jaxgraph.graph(g, pool=3.5)
    with pytest.raises(ValueError, match="no longer exists"):
        jaxgraph.Graph(pool=(0, 987654321))


def test_graph_checks_its_arguments():
    with pytest.raises(TypeError, match="captures into a jaxgraph.CUDAGraph, got Graph"):
        jaxgraph.graph(jaxgraph.Graph())
    with pytest.raises(TypeError, match="stream must be a jaxgraph.Stream or None, got int"):
        jaxgraph.graph(jaxgraph.CUDAGraph(), stream=0)


def test_register_checks_its_arguments():
    g = jaxgraph.CUDAGraph()
    for register in (g.register_capture_end_hook, g.register_post_instantiate_hook,
                     g.register_replay_start_hook, g.register_replay_end_hook, g.register_destroy_callback):
        with pytest.raises(TypeError, match="expects a callable, got int"):
            register(42)
    with pytest.raises(TypeError, match="expects a jaxgraph.Generator, got object"):
        g.register_generator_state(object())


def test_is_current_stream_capturing_is_false_outside_capture():
    assert jaxgraph.is_current_stream_capturing() is False


def test_accelerator_graph_errors_before_capture():
    g = jaxgraph.Graph()
    for call, message in ((g.replay, "nothing has been captured yet"),
                          (g.instantiate, "nothing has been captured yet"),
                          (g.capture_end, "no capture is underway"),
                          (g.pool, "this graph has no memory pool"),
                          (lambda: g.debug_dump("unused.dot"), "nothing has been captured yet")):
        with pytest.raises(RuntimeError, match=message):
            call()


# ---------------------------------------------------------------------------
# CPU: handles, hooks and destroy callbacks
# ---------------------------------------------------------------------------


def test_removable_handle_removes_once_and_is_a_context_manager():
    g = jaxgraph.CUDAGraph()
    calls = []
    first = g.register_destroy_callback(lambda: calls.append(1))
    with g.register_destroy_callback(lambda: calls.append(2)) as second:
        assert isinstance(second, jaxgraph.RemovableHandle) and second.id != first.id
    third = g.register_destroy_callback(lambda: calls.append(3))
    first.remove()
    first.remove()                      # idempotent
    g.reset()
    assert calls == [3]
    third.remove()                      # already fired: still harmless


def test_handles_do_not_keep_the_graph_alive():
    g = jaxgraph.CUDAGraph()
    handle = g.register_replay_start_hook(print)
    ref = weakref.ref(g)
    del g
    gc.collect()
    assert ref() is None
    handle.remove()                     # harmless once the graph is gone


def test_destroy_callbacks_fire_in_order_once_and_survive_a_failing_one():
    g = jaxgraph.CUDAGraph()
    calls = []

    def failing():
        calls.append("failing")
        raise OSError("callback failed")

    g.register_destroy_callback(lambda: calls.append("a"))
    g.register_destroy_callback(failing)
    g.register_destroy_callback(lambda: calls.append("c"))
    with pytest.warns(RuntimeWarning, match="callback failed"):
        g.reset()
    assert calls == ["a", "failing", "c"]
    g.reset()
    assert calls == ["a", "failing", "c"]


def test_destroy_callbacks_fire_when_the_graph_is_collected():
    calls = []
    g = jaxgraph.CUDAGraph()
    g.register_destroy_callback(lambda: calls.append("gone"))
    g.register_capture_end_hook(functools.partial(print, g))   # a cycle: only gc collects it
    del g
    gc.collect()
    assert calls == ["gone"]


def test_generator_arguments_are_checked_before_the_driver():
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\)"):
        jaxgraph.Generator(seed=-1)
    with pytest.raises(TypeError, match="seed must be an int, got str"):
        jaxgraph.Generator(seed="42")


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
    assert not _captures.any_underway()
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
                          (lambda: source_of(g), "holds no captured graph")):
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
    live_pools = len(_memory._pools)
    for _ in range(5):
        with pytest.raises(jaxgraph.CudaError, match="cuStreamSynchronize"):
            with jaxgraph.graph(g):
                jaxgraph.empty(N)
                k.scale[blocks(N), BLOCK](y, x, 2.0, N)
                jaxgraph.current_stream().synchronize()    # not permitted while capturing
        assert jaxgraph.current_stream() == before
        assert not jaxgraph.is_current_stream_capturing()
    gc.collect()
    assert len(_memory._pools) <= live_pools
    assert not _captures.any_underway()
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
    assert not _captures.any_underway()
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
