"""Conditional nodes in a capture, and graphs embedded in one: the mechanism under ``_regions.py``.

A region (IF, IF/ELSE, WHILE, SWITCH) is opened on the stream that captures
now (the capture's own stream, or the body stream of the region around it):

1. a conditional handle is created on the graph that stream captures into
   (``cuGraphConditionalHandleCreate``);
2. a one-thread kernel on that stream reads the predicate array and calls
   ``cudaGraphSetConditional`` (so the predicate is read on the device each
   time the node is reached, never on the host);
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

:func:`embed` is what ``CUDAGraph.replay()`` does while the current stream
captures: it adds the graph's template as a child-graph node, since a graph
cannot be launched into a capturing stream.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Iterator

import numpy as np

from . import _captures, _driver, _stream
from ._array import DeviceArray, asarray
from ._driver import CudaError, check
from ._stream import Stream, current_stream

__all__ = ["KINDS", "Kind", "Region", "SET_CONDITIONAL_SOURCE", "begin", "check_predicate", "check_support",
           "driver_version", "embed", "end", "next_body", "setter_name"]

SET_CONDITIONAL_SOURCE = r"""
// cudaGraphSetConditional as <cuda_device_runtime_api.h> declares it (a builtin: no device
// runtime to link), spelled out because NVIDIA's runtime wheel lacks that header's crt/ includes.
extern "C" __device__ __attribute__((cudart_builtin)) void cudaGraphSetConditional(unsigned long long handle,
                                                                                 unsigned int value);
// Sets a conditional node's value from a one-element device array. Launched with
// one thread just before the node (and at the end of a WHILE body).
extern "C" __global__ void jaxgraph_set_conditional_int32(unsigned long long handle, const int* value) {
  cudaGraphSetConditional(handle, (unsigned int)*value);
}
extern "C" __global__ void jaxgraph_set_conditional_bool(unsigned long long handle, const bool* value) {
  cudaGraphSetConditional(handle, *value ? 1u : 0u);
}
"""


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of region: its name in messages, its CUDA node type, and the CUDA it needs."""

    label: str        # "IF/ELSE"
    node_type: str    # suffix of CU_GRAPH_COND_TYPE_*: "IF", "WHILE", "SWITCH"
    min_cuda: int     # cuDriverGetVersion encoding: 12040 is CUDA 12.4
    predicate: tuple  # accepted dtypes


KINDS = {
    "if": Kind("IF", "IF", 12040, ("bool", "int32")),
    "if_else": Kind("IF/ELSE", "IF", 12080, ("bool", "int32")),
    "while": Kind("WHILE", "WHILE", 12040, ("bool", "int32")),
    "switch": Kind("SWITCH", "SWITCH", 12080, ("int32",)),
}


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
            _setter(self.pred, self.stream.device)[1, 1, 0, self.stream](int(self.handle), self.pred)
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
        if self.previous is not None:
            _stream._set_current(self.previous, self.stream.device)
        _give_stream(self.stream)
        self.capture.pool._release_reuse()


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
    setter = _setter(pred, device)   # compiled and loaded before the graph changes
    body_stream = _take_stream(device)
    region = Region(kind, pred, opener, capture)
    region.stream = body_stream
    drv = _driver.driver()
    try:
        ctx = _driver.call("cuCtxGetCurrent")
        graph = _capture_graph(stream)
        region.handle = check(drv.cuGraphConditionalHandleCreate(graph, ctx, 0, 0),
                              "cuGraphConditionalHandleCreate")
        setter[1, 1, 0, stream](int(region.handle), pred)
        params = drv.CUgraphNodeParams()
        params.type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle = region.handle
        params.conditional.type = getattr(drv.CUgraphConditionalNodeType, f"CU_GRAPH_COND_TYPE_{kind.node_type}")
        params.conditional.size = num_bodies
        params.conditional.ctx = ctx
        region.node = _add_node(stream, params)
        region.bodies = tuple(params.conditional.phGraph_out[i] for i in range(num_bodies))
        capture.conditionals.append((int(region.node), kind.node_type, tuple(int(b) for b in region.bodies)))
        region._begin_body(0)
    except BaseException as exc:
        _give_stream(body_stream)
        capture.broken = capture.broken or f"{opener} failed halfway ({exc})"
        raise
    capture.pool._hold_reuse()
    capture.regions.append(region)
    region.previous = _stream._set_current(body_stream)
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
# Embedding a captured graph
# ----------------------------------------------------------------------------


def embed(handles: Any, stream: Stream, capture: Any) -> None:
    """Add the graph held by ``handles`` to ``capture`` as a child-graph node on ``stream``.

    The node holds a copy of the template as it is now; the capturing graph
    keeps the embedded graph's pools and inputs alive.
    """
    template = handles.template
    if template is None:
        raise RuntimeError("replay: this CUDAGraph holds no captured graph to embed in the capture underway "
                           "on the current stream; capture it first")
    if handles.device != capture.stream.device:
        raise ValueError(f"replay: this graph was captured on device {handles.device}, the capture underway "
                         f"on the current stream is on device {capture.stream.device}")
    inputs = handles.inputs
    if inputs.watched:
        inputs.check_watched()
    drv = _driver.driver()
    _driver.ensure_context(handles.device)
    params = drv.CUgraphNodeParams()
    params.type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_GRAPH
    params.graph.graph = template
    try:
        _add_node(stream, params)
    except CudaError as exc:
        if inputs.conditionals:
            raise RuntimeError(f"replay: this graph has conditional nodes, and CUDA cannot place those in a "
                               f"child graph ({exc}); capture its regions directly into this capture instead") from exc
        raise
    capture.retained += [*inputs.keep, *inputs.pools, *(r() for *_, r in inputs.watched if r() is not None)]
    capture.kernels.update(dict(inputs.kernels))


# ----------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------


def check_predicate(value: Any, what: str, dtypes: tuple = ("bool", "int32")) -> DeviceArray:
    """``value`` as a one-element device array of one of ``dtypes``, or a clear error (no driver call for bad input)."""
    allowed = " or ".join(dtypes)
    if not isinstance(value, DeviceArray):
        if isinstance(value, (np.ndarray, np.generic, bool, int, float, list, tuple)):
            raise TypeError(f"{what} must be a one-element {allowed} device array, got host data "
                            f"({type(value).__name__}): the device reads it at every replay, so copy it to "
                            "the GPU before the capture, e.g. jaxgraph.asarray(np.array([1], np.int32))")
        if not hasattr(value, "__cuda_array_interface__"):
            raise TypeError(f"{what} must be a one-element {allowed} device array (jaxgraph.DeviceArray, or a "
                            f"jax.Array on the GPU, CuPy or torch CUDA array), got {type(value).__name__}")
        value = asarray(value)
    if value.size != 1:
        raise ValueError(f"{what} must have exactly one element, got shape {value.shape}")
    if value.dtype.name not in dtypes:
        raise TypeError(f"{what} must be {'an' if allowed[0] in 'aeiou' else 'a'} {allowed} array, got {value.dtype}")
    return value


def driver_version() -> int:
    """``cuDriverGetVersion()``: 13000 for a CUDA 13.0 driver."""
    return int(_driver.call("cuDriverGetVersion"))


def check_support(kind_name: str) -> None:
    """Raise ``RuntimeError`` unless the driver and NVRTC support ``kind_name`` regions.

    IF and WHILE nodes need CUDA 12.4, IF/ELSE and SWITCH 12.8 (driver R570).
    """
    from ._compile import nvrtc_version

    kind = KINDS[kind_name]
    need = _version_text(kind.min_cuda)
    have = driver_version()
    if have < kind.min_cuda:
        raise RuntimeError(
            f"{kind.label} regions need a CUDA {need} driver or newer (conditional nodes), but this driver "
            f"supports CUDA {_version_text(have)} (cuDriverGetVersion() = {have}); update the NVIDIA driver "
            f"({'R570' if kind.min_cuda >= 12080 else 'R550'} or newer)")
    major, minor = nvrtc_version()
    if major * 1000 + minor * 10 < kind.min_cuda:
        raise RuntimeError(
            f"{kind.label} regions need NVRTC {need} or newer to compile the kernel that sets the condition "
            f"(cudaGraphSetConditional), but NVRTC is {major}.{minor}; pip install -U nvidia-cuda-nvrtc")


def setter_name(dtype: Any) -> str:
    """The set-conditional kernel for a predicate of ``dtype`` (bool or int32)."""
    return f"jaxgraph_set_conditional_{np.dtype(dtype).name}"


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _version_text(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def _check_level(capture: Any, stream: Stream, what: str) -> None:
    """The current stream must capture into the innermost open level of ``capture``."""
    expected = capture.regions[-1].capture_id if capture.regions else capture.capture_id
    if _captures._capture_id(stream) != expected:
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


def _add_node(stream: Stream, params: Any) -> Any:
    """Add a node after the work captured so far on ``stream``; later work there depends on it alone."""
    drv = _driver.driver()
    # (status, id, graph, dependencies, [edge data,] count): edge data came with CUDA 12.3's bindings.
    _, _, graph, *dependencies, count = check(drv.cuStreamGetCaptureInfo(stream.handle), "cuStreamGetCaptureInfo")
    node = check(drv.cuGraphAddNode(graph, *dependencies, count, params), "cuGraphAddNode")
    check(drv.cuStreamUpdateCaptureDependencies(
        stream.handle, [node], None, 1,
        drv.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES),
        "cuStreamUpdateCaptureDependencies")
    return node


@contextlib.contextmanager
def _relaxed() -> Iterator[None]:
    """This thread's capture mode relaxed for a few calls that may be unsafe under capture (loading, stream creation)."""
    drv = _driver.driver()
    relaxed = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    previous = check(drv.cuThreadExchangeStreamCaptureMode(relaxed), "cuThreadExchangeStreamCaptureMode")
    try:
        yield
    finally:
        check(drv.cuThreadExchangeStreamCaptureMode(previous), "cuThreadExchangeStreamCaptureMode")


_setters: dict[tuple[str, int], Any] = {}
_streams: dict[int, list[Stream]] = {}   # device -> body streams not in use
_lock = threading.Lock()


def _setter(pred: DeviceArray, device: int) -> Any:
    """The set-conditional kernel for ``pred``'s dtype, compiled once and loaded in ``device``'s context."""
    from ._kernel import Kernel

    name = setter_name(pred.dtype)
    kernel = _setters.get((name, device))
    if kernel is None:
        major, minor = _driver.compute_capability(device)
        kernel = Kernel(SET_CONDITIONAL_SOURCE, name, arch=f"sm_{major}{minor}")
        with _relaxed():  # loading a library may synchronize: not while the capture checks
            kernel.handle
            kernel._handles_on(device)
        _setters[(name, device)] = kernel
    return kernel


def _take_stream(device: int) -> Stream:
    """A stream to capture a body on (reused: a stream is in one capture at a time)."""
    with _lock:
        free = _streams.setdefault(device, [])
        if free:
            return free.pop()
    with _relaxed():
        return Stream(device)


def _give_stream(stream: Stream) -> None:
    with _lock:
        _streams.setdefault(stream.device, []).append(stream)
