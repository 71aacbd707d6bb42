"""A capture the context manager cannot end is abandoned, never left open.

When the body of ``with jaxgraph.graph(g):`` (or ``with s, jaxgraph.Graph():``)
makes another stream current and leaves it so, ``capture_end`` refuses to end
the capture on that stream. The context manager then abandons the capture: the
stream stops capturing, the frees deferred while it ran are made, Python's
garbage collector is back on, the previous stream is current again, and a
``RuntimeError`` says what happened; the graph captures again. (Called by hand,
``capture_end`` leaves the capture open so the caller can make the stream
current and retry: test_graphs_errors.py.)

The CPU test runs the real context managers and capture bookkeeping with the
driver stood in for (its calls recorded); the GPU test does it for real.

Tests internals (listed in tests/README.md): ``_cuda.driver.driver`` and ``ensure_context`` (stood in),
``_cuda.stream._local`` (the thread's current streams), ``_graphs.capture_contexts.quiet`` (stood in),
``_cuda.capture_registry.any_underway``, ``_cuda.memory._frees_held`` and ``_deferred_frees``,
``_graphs.cuda_graph.handles_of``, ``Stream._setup``; whether a stream still captures, and what
is deferred, have no public face without a GPU.
"""

import gc
from types import SimpleNamespace

import numpy as np
import pytest

import jaxgraph
from jaxgraph._cuda import capture_registry as _captures
from jaxgraph._cuda import driver as _driver
from jaxgraph._cuda import memory as _memory
from jaxgraph._cuda import stream as _stream
from jaxgraph._cuda.stream import Stream
from jaxgraph._graphs import capture_contexts as _capture
from jaxgraph._graphs.cuda_graph import handles_of
from support.graph_helpers import BLOCK, N, blocks, load_kernels, random_floats

LEFT_CURRENT = r"capture must end on the same stream it began on"
DISCARDED = (r"the capture could not end at the end of its `with` block \(capture_end: capture must end on the same "
             r"stream it began on .*\), so it was discarded and the graph can capture again; end the block with the "
             r"capture stream current")


def fake_stream(handle, device=0):
    s = Stream.__new__(Stream)
    s._setup(handle, device, None, False)
    return s


@pytest.fixture
def fake_driver(monkeypatch):
    """The driver calls of beginning and abandoning a capture stood in for: the calls made, by name and stream."""
    from cuda.bindings import driver as cu

    calls = []
    ok = cu.CUresult.CUDA_SUCCESS
    active = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
    fake = SimpleNamespace(
        CUresult=cu.CUresult, CUstreamCaptureMode=cu.CUstreamCaptureMode,
        CUstreamCaptureStatus=cu.CUstreamCaptureStatus,
        cuStreamBeginCapture=lambda handle, mode: calls.append(("begin", handle)) or (ok,),
        cuStreamGetCaptureInfo=lambda handle: (ok, active, 77),
        cuStreamEndCapture=lambda handle: calls.append(("end", handle)) or (ok, None),
    )
    monkeypatch.setattr(_driver, "driver", lambda: fake)
    monkeypatch.setattr(_driver, "ensure_context", lambda device=None: 0 if device is None else device)
    monkeypatch.setattr(_capture, "quiet", lambda device, capture_stream: None)  # no device to synchronize
    previous = fake_stream(0x9000)
    monkeypatch.setattr(_stream._local, "streams", {0: previous})
    return calls, previous


def enter_graph(g, capture_stream):
    """``with jaxgraph.graph(g, stream=capture_stream):``, returning the context manager entered."""
    ctx = jaxgraph.graph(g, stream=capture_stream)
    ctx.__enter__()
    return ctx


def enter_accelerator_graph(g, capture_stream):
    """``with capture_stream, g:`` for a ``jaxgraph.Graph``: the two context managers, innermost first."""
    capture_stream.__enter__()
    g.__enter__()
    return g


@pytest.mark.parametrize("kind", ["graph", "Graph"])
def test_a_capture_left_on_another_stream_is_abandoned_on_the_cpu(fake_driver, kind):
    calls, previous = fake_driver
    capture_stream, other = fake_stream(0x7000), fake_stream(0x7001)
    g = jaxgraph.CUDAGraph() if kind == "graph" else jaxgraph.Graph()
    was_enabled = gc.isenabled()
    ctx = (enter_graph if kind == "graph" else enter_accelerator_graph)(g, capture_stream)
    try:
        assert calls == [("begin", 0x7000)] and _captures.any_underway() and not gc.isenabled()
        _memory._free_sync(0xDEAD, 0)  # a free during the capture: deferred
        assert _memory._deferred_frees
        jaxgraph.stream(other).__enter__()  # the body leaves another stream current
        with pytest.raises(RuntimeError, match=LEFT_CURRENT) as info:
            ctx.__exit__(None, None, None)
        if kind == "Graph":
            capture_stream.__exit__(None, None, None)
        assert calls == [("begin", 0x7000), ("end", 0x7000)], "the capture stream was left capturing"
        assert not _captures.any_underway() and _memory._frees_held == 0
        assert gc.isenabled() == was_enabled, "the garbage collector was left off"
        assert jaxgraph.current_stream(0) is previous
        assert "not started" in repr(g)
        assert info.match(DISCARDED)
    finally:
        handles_of(g if kind == "graph" else g._cuda_graph).abandon_capture()  # whatever a failure left open
        _memory._deferred_frees[:] = [f for f in _memory._deferred_frees if f[0] != 0xDEAD]
        if was_enabled:
            gc.enable()


# ---------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def k():
    return load_kernels()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["graph", "Graph"])
def test_a_capture_left_on_another_stream_is_abandoned(k, rng, kind):
    x, y = jaxgraph.asarray(random_floats(rng)), jaxgraph.empty(N)
    before = jaxgraph.current_stream()
    other, capture_stream = jaxgraph.Stream(), jaxgraph.Stream()
    g = jaxgraph.CUDAGraph() if kind == "graph" else jaxgraph.Graph()
    doomed = jaxgraph.empty(N)
    jaxgraph.synchronize()
    was_enabled = gc.isenabled()
    with pytest.raises(RuntimeError, match=LEFT_CURRENT) as info:
        with (jaxgraph.graph(g) if kind == "graph" else capture_stream):
            if kind == "Graph":
                g.__enter__()
            k.scale[blocks(N), BLOCK](y, x, 2.0, N)
            del doomed  # freed during the capture: deferred
            jaxgraph.stream(other).__enter__()  # left current: capture_end refuses
            if kind == "Graph":
                g.__exit__(None, None, None)
    assert not _captures.any_underway(), "a capture was left open"
    assert _memory._frees_held == 0 and not _memory._deferred_frees, "frees stay deferred"
    assert gc.isenabled() == was_enabled, "the garbage collector was left off"
    assert jaxgraph.current_stream() == before and not jaxgraph.is_current_stream_capturing()
    assert info.match(DISCARDED)
    stream = capture_stream if kind == "Graph" else None
    # The graph (and the side stream, no longer capturing) capture again.
    with jaxgraph.stream(stream):
        with (jaxgraph.graph(g) if kind == "graph" else g):
            k.scale[blocks(N), BLOCK](y, x, 3.0, N)
    for _ in range(2):
        data = random_floats(rng)
        x.copy_(data)
        y.fill_(np.float32(np.nan))
        g.replay()
        jaxgraph.synchronize()
        np.testing.assert_allclose(y.numpy(), np.float32(3.0) * data, rtol=1e-6)
