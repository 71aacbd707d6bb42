"""Graph API shape and errors that need no device: the seeds' signatures, argument checks, hooks.

Signatures, argument validation (which happens before any driver call),
errors before capture, handles and destroy callbacks, all on the CPU.
PyTorch's error situations on the GPU are in test_graphs_errors.py.

A graph with no captured graph has no template either (``jaxgraph.diagnostics.graph_template``).
"""

import functools
import gc
import inspect
import weakref

import pytest

import jaxgraph
from jaxgraph import diagnostics

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
    (lambda g: diagnostics.graph_template(g), "holds no captured graph"),
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
