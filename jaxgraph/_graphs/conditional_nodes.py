"""Conditional nodes in a capture: the mechanism under ``_graphs/conditional_regions.py``.

A region (IF, IF/ELSE, WHILE, SWITCH) is opened on the stream that captures
now (the capture's own stream, or the body stream of the region around it):

1. a conditional handle is created on the graph that stream captures into
   (``cuGraphConditionalHandleCreate``);
2. a one-thread kernel on that stream reads the predicate array and calls
   ``cudaGraphSetConditional`` (``_graphs/conditional_predicates.py``), so the predicate is read
   on the device each time the node is reached, never on the host;
3. the conditional node is added after the kernel (``cuGraphAddNode``), and
   the stream's capture dependencies become the node, so later work on it
   runs after the whole region;
4. a body stream begins capturing into the node's first body graph
   (``cuStreamBeginCaptureToGraph``) and is made current, so jaxgraph
   launches, copies and draws inside go into the body.

A WHILE body ends with the predicate kernel again: the body's own kernels
update the predicate and the node tests it after every trip. This is
PyTorch's mechanism (``CUDAGraph.begin_capture_to_if_node`` and friends).
cuda.core's ``GraphBuilder.if_then``/``while_loop`` do steps 1-4 only for a
capture the builder began itself, so they cannot serve a capture begun by
``jaxgraph.graph()``; the driver calls are made here with ``cuda.bindings``.

:func:`add_node` (a node after the work captured so far on a stream) also
serves ``_graphs/embed.py``, where ``replay()`` during a capture adds a child graph.
"""

from __future__ import annotations

import threading
from typing import Any

from .._cuda import capture_registry as _captures, driver as _driver, memory as _memory, stream as _stream
from .._cuda.array import DeviceArray
from .._cuda.driver import CudaError, check
from .conditional_predicates import KINDS, Kind, check_support, relaxed, setter
from .._cuda.stream import Stream, current_stream

__all__ = ["Region", "add_node", "begin", "end", "next_body", "unfinished"]


# ----------------------------------------------------------------------------
# Region
# ----------------------------------------------------------------------------


class Region:
    """One conditional node whose bodies are being captured.

    Attributes
    ----------
    kind : Kind
    pred : DeviceArray
        The predicate (or SWITCH index) array.
    opener : str
        What opened it (``"begin_capture_to_while_node"``, ``"jaxgraph.while_loop"``), for messages.
    bodies : tuple of CUgraph
        The node's body graphs (owned by the node).
    body : int
        The body being captured now.
    stream : Stream
        The body stream, current while the region is open.
    """

    __slots__ = ("kind", "pred", "opener", "capture", "handle", "node", "bodies", "body", "stream", "previous",
                 "capture_id", "thread", "closed")

    def __init__(self, kind: Kind, pred: DeviceArray, opener: str, capture: Any) -> None:
        self.kind, self.pred, self.opener, self.capture = kind, pred, opener, capture
        self.handle = self.node = None
        self.bodies: tuple = ()
        self.body = 0
        self.stream: Stream | None = None
        self.previous: Stream | None = None   # the current stream before the region opened
        self.capture_id = 0
        self.thread = threading.get_ident()
        self.closed = False

    def describe(self) -> str:
        """``"the WHILE region opened by jaxgraph.while_loop (predicate int32 at 0x7f...)"``."""
        what = "index" if self.kind.node_type == "SWITCH" else "predicate"
        return (f"the {self.kind.label} region opened by {self.opener} ({what} {self.pred.dtype} "
                f"at {self.pred.ptr:#x})")

    def discard(self, reason: str | None = None) -> None:
        """End the body capture without the WHILE re-test, close the region; never raises.

        With ``reason`` the capture is marked broken: its nodes are half made,
        so ending it raises (and discards it) instead of giving a wrong graph.
        """
        if self.closed:
            return
        if reason is not None and self.capture.broken is None:
            self.capture.broken = reason
        try:
            _driver.ensure_context(self.stream.device)
            _driver.driver().cuStreamEndCapture(self.stream.handle)  # the body graph belongs to the node
        except Exception:
            pass
        _captures.detach(self.capture, self.stream, self.capture_id)
        self._close()

    # -- internals --------------------------------------------------------------

    def _begin_body(self, index: int) -> None:
        drv = _driver.driver()
        mode = getattr(drv.CUstreamCaptureMode, f"CU_STREAM_CAPTURE_MODE_{self.capture.mode.upper()}")
        check(drv.cuStreamBeginCaptureToGraph(self.stream.handle, self.bodies[index], None, None, 0, mode),
              "cuStreamBeginCaptureToGraph")
        self.body = index
        self.capture_id = _captures.attach(self.capture, self.stream)

    def _end_body(self) -> None:
        """End the capture of the current body (a WHILE body re-tests its predicate first)."""
        if self.kind.node_type == "WHILE":
            setter(self.pred, self.stream.device)[1, 1, 0, self.stream](int(self.handle), self.pred)
        drv = _driver.driver()
        try:
            err = drv.cuStreamEndCapture(self.stream.handle)[0]
        finally:
            _captures.detach(self.capture, self.stream, self.capture_id)
        if err == drv.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNJOINED:
            raise RuntimeError(f"work forked onto another stream inside {self.describe()} was not joined back "
                               "to the body's stream (CUDA_ERROR_STREAM_CAPTURE_UNJOINED): make the body's "
                               "stream wait for every stream it forked before the body ends")
        if err != drv.CUresult.CUDA_SUCCESS:
            raise CudaError("cuStreamEndCapture", err, f"capturing body {self.body} of {self.describe()} failed: "
                            "work not permitted in a conditional body (a synchronization, a host copy, an "
                            "allocation outside jaxgraph, or an unsafe call under capture_error_mode='global')")

    def _close(self) -> None:
        """Restore the current stream, give the body stream back, let the pool reuse blocks again."""
        self.closed = True
        regions = self.capture.regions
        if self in regions:
            regions.remove(self)
        if self.previous is not None and threading.get_ident() == self.thread:  # a finalizer may run elsewhere
            _stream.set_current(self.previous, self.stream.device)
        _give_stream(self.stream)
        _memory.release_reuse(self.capture.pool)


# ----------------------------------------------------------------------------
# Opening, moving on, closing
# ----------------------------------------------------------------------------


def begin(capture: Any, kind_name: str, pred: DeviceArray, opener: str, num_bodies: int = 1) -> Region:
    """Open a region of ``capture`` on the current stream; its first body captures from now on.

    ``pred`` is checked already (:func:`check_predicate`). Raises ``RuntimeError``
    when the current stream does not capture into ``capture``'s innermost level,
    or when the driver lacks the node kind (:func:`check_support`).
    """
    kind = KINDS[kind_name]
    device = capture.stream.device
    if threading.get_ident() != capture.thread and capture.mode != "relaxed":
        raise RuntimeError(f"{opener}: a capture begun with capture_error_mode={capture.mode!r} captures on the "
                           "thread that began it; open regions there (or capture with 'relaxed')")
    if pred.device != device:
        raise ValueError(f"{opener}: the predicate is on device {pred.device}, the capture on device {device}")
    stream = current_stream(device)
    _check_level(capture, stream, opener)
    check_support(kind_name)
    _driver.ensure_context(device)
    set_value = setter(pred, device)   # compiled and loaded before the graph changes
    body_stream = _take_stream(device)
    region = Region(kind, pred, opener, capture)
    region.stream = body_stream
    drv = _driver.driver()
    try:
        ctx = _driver.call("cuCtxGetCurrent")
        graph = _capture_graph(stream)
        region.handle = check(drv.cuGraphConditionalHandleCreate(graph, ctx, 0, 0),
                              "cuGraphConditionalHandleCreate")
        set_value[1, 1, 0, stream](int(region.handle), pred)
        params = drv.CUgraphNodeParams()
        params.type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle = region.handle
        params.conditional.type = getattr(drv.CUgraphConditionalNodeType, f"CU_GRAPH_COND_TYPE_{kind.node_type}")
        params.conditional.size = num_bodies
        params.conditional.ctx = ctx
        region.node = add_node(stream, params)
        region.bodies = tuple(params.conditional.phGraph_out[i] for i in range(num_bodies))
        capture.conditionals.append((int(region.node), kind.node_type, tuple(int(b) for b in region.bodies)))
        region._begin_body(0)
    except BaseException as exc:
        _give_stream(body_stream)
        capture.broken = capture.broken or f"{opener} failed halfway ({exc})"
        raise
    _memory.hold_reuse(capture.pool)
    capture.regions.append(region)
    region.previous = _stream.set_current(body_stream)
    return region


def next_body(region: Region, what: str) -> None:
    """End the capture of ``region``'s current body and begin its next one."""
    _check_open(region, what)
    if region.body + 1 >= len(region.bodies):
        raise RuntimeError(
            f"{what}: {region.describe()} has {len(region.bodies)} "
            f"bod{'y' if len(region.bodies) == 1 else 'ies'} and its last (body {region.body}) is being "
            "captured; close the region with end_capture_to_conditional_node()")
    try:
        region._end_body()
        region._begin_body(region.body + 1)
    except BaseException as exc:
        region.discard(f"{what} failed ({exc})")
        raise


def end(region: Region, what: str) -> None:
    """End the capture of ``region``'s body and close it: the previous stream is current again."""
    _check_open(region, what)
    try:
        region._end_body()
    except BaseException as exc:
        region.discard(f"{what} failed ({exc})")
        raise
    region._close()


# ----------------------------------------------------------------------------
# Nodes added to a capture by hand
# ----------------------------------------------------------------------------


def add_node(stream: Stream, params: Any) -> Any:
    """Add a node (``CUgraphNodeParams``) after the work captured so far on ``stream``.

    Later work on ``stream`` depends on the new node alone. This is how a
    conditional node or an embedded graph enters a capture.
    """
    drv = _driver.driver()
    # (status, id, graph, dependencies, [edge data,] count): edge data came with CUDA 12.3's bindings.
    _, _, graph, *dependencies, count = check(drv.cuStreamGetCaptureInfo(stream.handle), "cuStreamGetCaptureInfo")
    if not count:  # nothing captured on the stream yet: the node is a root
        dependencies = [None] * len(dependencies)
    node = check(drv.cuGraphAddNode(graph, *dependencies, count, params), "cuGraphAddNode")
    check(drv.cuStreamUpdateCaptureDependencies(
        stream.handle, [node], None, 1,
        drv.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES),
        "cuStreamUpdateCaptureDependencies")
    return node


def unfinished(capture: Any) -> str:
    """Why ``capture`` cannot end: the innermost region still open, or what broke it."""
    if capture.regions:
        return (f"{capture.regions[-1].describe()} is still open: close it (end_capture_to_conditional_node(), "
                "or leave its `with` block) before the capture ends")
    return capture.broken


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _check_level(capture: Any, stream: Stream, what: str) -> None:
    """The current stream must capture into the innermost open level of ``capture``."""
    expected = capture.regions[-1].capture_id if capture.regions else capture.capture_id
    if _captures.capture_id_of(stream) != expected:
        where = capture.regions[-1].describe() if capture.regions else "the capture"
        raise RuntimeError(f"{what}: the current stream ({stream!r}) does not capture into {where}; open "
                           "regions on the stream the capture (or the innermost region) made current")


def _check_open(region: Region, what: str) -> None:
    if region.closed:
        raise RuntimeError(f"{what}: {region.describe()} is already closed")
    if threading.get_ident() != region.thread:
        raise RuntimeError(f"{what}: {region.describe()} was opened on another thread; close it there")
    current = current_stream(region.stream.device)
    if current != region.stream:
        raise RuntimeError(f"{what}: the current stream is {current!r}, not the stream {region.describe()} made "
                           f"current ({region.stream!r}); make it current again before closing the region")


def _capture_graph(stream: Stream) -> Any:
    """The graph ``stream`` captures into now."""
    status, _, graph, *_ = check(_driver.driver().cuStreamGetCaptureInfo(stream.handle), "cuStreamGetCaptureInfo")
    return graph


_streams: dict[int, list[Stream]] = {}   # device -> body streams not in use
_lock = threading.Lock()


def _take_stream(device: int) -> Stream:
    """A stream to capture a body on (reused: a stream is in one capture at a time)."""
    with _lock:
        free = _streams.setdefault(device, [])
        if free:
            return free.pop()
    with relaxed():
        return Stream(device)


def _give_stream(stream: Stream) -> None:
    """Back for reuse, unless it still captures (its capture could not be ended): then it is dropped."""
    try:
        _driver.ensure_context(stream.device)
        drv = _driver.driver()
        err, status = drv.cuStreamIsCapturing(stream.handle)
        if err != 0 or status != drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE:
            return
    except Exception:  # called from cleanup paths: never raises
        return
    with _lock:
        _streams.setdefault(stream.device, []).append(stream)
