"""Capture contexts: :class:`graph` (``torch.cuda.graph``), :class:`Graph`
(``torch.accelerator.Graph``) and :func:`is_current_stream_capturing`.

``graph`` captures on a side stream it makes current for the body::

    with jaxgraph.graph(g):
        kernel[grid, block](y, x, n)

``Graph`` captures on whatever stream is current, and pairs with one::

    with s, g:
        kernel[grid, block](y, x, n)

Both discard the capture cleanly when the body raises, or when the capture
cannot end (the body left another stream current), leaving the graph ready to
capture again.

Several threads may capture at once, each into its own graph, with
``capture_error_mode="thread_local"``: ``graph`` gives each thread its own side
stream, and a stream's ``with s:`` restores each thread's own previous stream.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from .._cuda import capture_registry as _captures, driver as _driver, memory as _memory, stream as _stream
from .._cuda.driver import check
from .._cuda.checks import CAPTURE_MODES, capture_mode
from .cuda_graph import CUDAGraph, handles_of
from .handles import CaptureState
from .hooks import RemovableHandle
from .._cuda.stream import Stream, current_stream

__all__ = ["Graph", "cuda_graph_of", "graph", "is_current_stream_capturing"]


# ----------------------------------------------------------------------------
# graph: the capture context manager
# ----------------------------------------------------------------------------


class graph:
    """Context manager that captures CUDA work into a :class:`CUDAGraph` for later replay.

    On entry it synchronizes the device, makes the capture stream current
    (after waiting for the previously current stream) and begins capture; on
    exit it ends the capture and restores the previous stream. If the body
    raises, the capture is discarded, the previous stream restored and the
    graph left recapturable, and the exception propagates. If the capture
    cannot end (the body made another stream current and left it so), it is
    discarded the same way (no stream left capturing, deferred frees run and
    Python's garbage collector back on) and a ``RuntimeError`` says why.

    While another jaxgraph capture is underway on the device (another
    thread's), entry does not synchronize the device, which would invalidate
    that capture (CUDA does, from any thread, in any mode): it waits for this
    thread's current stream only.

    Parameters
    ----------
    cuda_graph : CUDAGraph
        Graph object used for capture.
    pool : optional
        Opaque token (from :func:`~jaxgraph.graph_pool_handle` or
        ``other_graph.pool()``) hinting this capture may share memory with
        that pool. Graphs sharing a pool must be replayed in capture order.
    stream : Stream, optional
        If given, the stream made current and captured on. If not, a side
        stream of the device, made once per thread and shared by that
        thread's captures (a thread's side streams serve later threads once
        it ends), so threads capturing at once never share one. A stream
        of another device than the current one makes that device current for
        the body (as ``torch.cuda.stream`` does), so the capture and the
        kernels launched in it run there.
    capture_error_mode : {"global", "thread_local", "relaxed"}
        The ``cudaStreamCaptureMode``; see :meth:`CUDAGraph.capture_begin`.
        Threads capturing at once need ``"thread_local"`` (or ``"relaxed"``):
        under ``"global"``, one thread's unsafe call invalidates the other's capture.

    Notes
    -----
    For effective memory sharing, if you pass a ``pool`` used by a previous
    capture and the previous capture used an explicit ``stream``, pass the
    same ``stream`` to this capture.

    .. warning:: This API is in beta and may change in future releases.

    Examples
    --------
    >>> g = jaxgraph.CUDAGraph()
    >>> with jaxgraph.graph(g):
    ...     axpy[blocks, 256](y, x, np.float32(2.0), n)
    >>> g.replay()
    """

    def __init__(self, cuda_graph: CUDAGraph, pool: Any = None, stream: Stream | None = None,
                 capture_error_mode: str = "global"):
        if not isinstance(cuda_graph, CUDAGraph):
            raise TypeError(f"graph() captures into a jaxgraph.CUDAGraph, got {type(cuda_graph).__name__}")
        if stream is not None and not isinstance(stream, Stream):
            raise TypeError(f"stream must be a jaxgraph.Stream or None, got {type(stream).__name__}")
        capture_mode(capture_error_mode)
        self.cuda_graph = cuda_graph
        self.pool: tuple = () if pool is None else (_memory.pool_from_token(pool),)
        self.capture_stream = stream
        self.capture_error_mode = capture_error_mode
        self._stream_ctx: _stream.stream | None = None
        self._previous_device = 0

    def __enter__(self) -> None:
        self._previous_device = _driver.current_device()
        device = self.capture_stream.device if self.capture_stream is not None else self._previous_device
        if device != self._previous_device:
            _driver.set_device(device)
        try:
            capture_stream = self.capture_stream if self.capture_stream is not None else _side_stream(device)
            # One thread at a time from the quiet-device check to capture_begin: another thread's
            # device-wide synchronize must not land in this capture, nor this one's in another's.
            with _entering:
                quiet(device, capture_stream)
                self._stream_ctx = _stream.stream(capture_stream)
                self._stream_ctx.__enter__()
                try:
                    self.cuda_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)
                except BaseException:
                    self._stream_ctx.__exit__(None, None, None)
                    raise
        except BaseException:
            self._restore_device()
            raise

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is None:
                end_or_abandon(self.cuda_graph)
            else:
                handles_of(self.cuda_graph).abandon_capture()
        finally:
            self._stream_ctx.__exit__(exc_type, exc, tb)
            self._restore_device()
        # Returning None lets exceptions from the body or capture_end propagate.

    def _restore_device(self) -> None:
        if _driver.current_device() != self._previous_device:
            _driver.set_device(self._previous_device)


# ----------------------------------------------------------------------------
# Graph: torch.accelerator.Graph
# ----------------------------------------------------------------------------


class Graph:
    """A graph that captures on the *current* stream, as ``torch.accelerator.Graph``.

    Use it as a context manager together with a stream, ``with s, g: ...``:
    the work queued on ``s`` inside is captured, and ``g.replay()`` runs it
    again. Unlike :class:`graph` it does not synchronize or switch streams.
    As :class:`graph`, it discards a capture that cannot end (another stream
    left current in the body) and raises ``RuntimeError`` saying why.

    Parameters
    ----------
    keep_graph : bool, optional
        As for :class:`CUDAGraph`: keep the captured graph after
        :meth:`capture_end` and instantiate on demand.
    pool : tuple[int, int], optional
        Pool token (``other.pool()`` or :func:`~jaxgraph.graph_pool_handle`)
        to share memory with; graphs sharing a pool are replayed in capture order.
    capture_error_mode : {"default", "global", "thread_local", "relaxed"}
        Capture mode; ``"default"`` is ``"global"`` on CUDA.

    Examples
    --------
    >>> s = jaxgraph.Stream()
    >>> g = jaxgraph.Graph()
    >>> with s, g:
    ...     add_one[blocks, 256](x, x, n)
    >>> g.replay()
    """

    def __init__(self, keep_graph: bool = False, *, pool: Any = None, capture_error_mode: str = "default"):
        self._mode = "global" if capture_error_mode == "default" else capture_mode(
            capture_error_mode, valid=("default",) + CAPTURE_MODES)
        self._pool = None if pool is None else _memory.pool_from_token(pool)
        self._cuda_graph = CUDAGraph(keep_graph)

    def __repr__(self) -> str:
        return f"<jaxgraph.Graph {handles_of(self._cuda_graph).state.value} device={self._cuda_graph.device}>"

    def capture_begin(self) -> None:
        """Begin graph capture on the current stream, with the pool and mode given at construction."""
        self._cuda_graph.capture_begin(pool=self._pool, capture_error_mode=self._mode)

    def capture_end(self) -> None:
        """End graph capture on the current stream; the graph can then be replayed."""
        self._cuda_graph.capture_end()

    def instantiate(self) -> None:
        """Instantiate the graph (done by :meth:`capture_end` unless ``keep_graph=True``)."""
        self._cuda_graph.instantiate()

    def replay(self) -> None:
        """Replay the captured work on the current stream."""
        self._cuda_graph.replay()

    def reset(self) -> None:
        """Delete the captured graph; the object can capture again."""
        self._cuda_graph.reset()

    def pool(self) -> tuple[int, int]:
        """Return an opaque token naming this graph's memory pool, for sharing."""
        return self._cuda_graph.pool()

    def enable_debug_mode(self) -> None:
        """Keep the captured graph so :meth:`debug_dump` works (call before capture ends)."""
        self._cuda_graph.enable_debug_mode()

    def debug_dump(self, path: Any) -> None:
        """Dump the captured graph to ``path`` (Graphviz DOT); needs :meth:`enable_debug_mode`."""
        self._cuda_graph.debug_dump(path)

    def summary(self) -> str:
        """A compact text summary; see :meth:`CUDAGraph.summary`."""
        return self._cuda_graph.summary()

    def to_dot(self) -> str:
        """Graphviz DOT text of the captured graph; see :meth:`CUDAGraph.to_dot`."""
        return self._cuda_graph.to_dot()

    def render(self, path: Any, format: str | None = None) -> Any:
        """Draw the captured graph to ``path``; see :meth:`CUDAGraph.render`."""
        return self._cuda_graph.render(path, format)

    def node_count(self, nested: bool = True) -> int:
        """Number of nodes in the captured graph; see :meth:`CUDAGraph.node_count`."""
        return self._cuda_graph.node_count(nested)

    def __str__(self) -> str:
        return str(self._cuda_graph)

    def __enter__(self) -> "Graph":
        self.capture_begin()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            end_or_abandon(self._cuda_graph)  # a capture that cannot end is discarded, never left open
        else:
            handles_of(self._cuda_graph).abandon_capture()

    @property
    def device(self) -> int:
        """The device this graph was (or will be) captured on."""
        return self._cuda_graph.device

    def register_destroy_callback(self, callback: Callable[[], None]) -> RemovableHandle:
        """See :meth:`CUDAGraph.register_destroy_callback`."""
        return self._cuda_graph.register_destroy_callback(callback)


def cuda_graph_of(g: CUDAGraph | Graph) -> CUDAGraph:
    """The :class:`CUDAGraph` behind ``g`` (``g`` itself, or the one a :class:`Graph` wraps)."""
    return g._cuda_graph if isinstance(g, Graph) else g


# ----------------------------------------------------------------------------
# is_current_stream_capturing
# ----------------------------------------------------------------------------


def is_current_stream_capturing() -> bool:
    """Return True if CUDA graph capture is underway on the current stream, False otherwise.

    Makes no driver call (and creates no CUDA context) when the current
    stream is the legacy default stream, which never captures.
    """
    s = _stream.current_stream_if_set(_driver.current_device())
    if s is None or s.is_legacy_default:
        return False
    if _captures.capture_on(s) is not None:
        return True
    _driver.ensure_context(s.device)
    drv = _driver.driver()
    status = check(drv.cuStreamIsCapturing(s.handle), "cuStreamIsCapturing")
    return status != drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def end_or_abandon(cuda_graph: CUDAGraph) -> None:
    """``capture_end()``; where the capture cannot end (it is still underway), abandon it, then raise why.

    An abandoned capture leaves no stream capturing, its deferred frees run
    and Python's collector is back on (``_cuda/memory.py``); the graph can
    capture again. A capture CUDA refused to end is reset by ``capture_end``.
    """
    try:
        cuda_graph.capture_end()
    except BaseException as exc:
        h = handles_of(cuda_graph)
        if h.state is not CaptureState.CAPTURING:
            raise  # ended (or reset by capture_end): nothing is left open
        h.abandon_capture()
        if not isinstance(exc, Exception):
            raise  # KeyboardInterrupt and the like, after abandoning
        raise RuntimeError(f"the capture could not end at the end of its `with` block ({exc}), so it was discarded "
                           "and the graph can capture again; end the block with the capture stream current (exit "
                           "every `with s:` or jaxgraph.stream(s) opened inside it)") from exc


def quiet(device: int, capture_stream: Stream) -> None:
    """Order ``capture_stream`` after this thread's current stream on ``device``, with earlier work done.

    As PyTorch, the whole device is synchronized so no earlier work races the
    capture, unless a capture is underway on the device (another thread's):
    a device-wide synchronize would invalidate it, so only this thread's
    current stream (through ``capture_stream``, which waits for it) is waited for.
    """
    previous = current_stream(device)
    if _captures.underway_on(device):
        capture_stream.wait_stream(previous)
        capture_stream.synchronize()
    else:
        _stream.synchronize(device)
        capture_stream.wait_stream(previous)


_entering = threading.Lock()  # graph.__enter__: the quiet-device check and capture_begin, one thread at a time


class _SideStreams(dict):
    """One thread's side streams, by device; when the thread ends, they serve the threads that capture later."""

    def __del__(self) -> None:
        try:
            with _side_streams_lock:
                for device, s in self.items():
                    _idle_side_streams.setdefault(device, []).append(s)
        except Exception:  # at interpreter exit
            pass


class _ThreadSideStreams(threading.local):
    def __init__(self) -> None:  # runs once in each thread that looks
        self.streams = _SideStreams()


_thread_side_streams = _ThreadSideStreams()
_idle_side_streams: dict[int, list[Stream]] = {}  # device -> side streams of threads that ended
_side_streams_lock = threading.RLock()  # re-entrant: a thread's streams may come back (__del__) while it is held


def _side_stream(device: int) -> Stream:
    """The side stream :class:`graph` captures on by default: one per thread and device.

    Threads capturing at once each need their own stream (one stream cannot
    capture into two graphs); a thread's streams are reused by later threads
    once it ends, so a program that starts threads again and again makes no
    more streams than it ever ran capturing threads at once.
    """
    mine = _thread_side_streams.streams
    s = mine.get(device)
    if s is None:
        with _side_streams_lock:
            idle = _idle_side_streams.get(device, [])
            while idle and s is None:
                s = idle.pop()
                if (int(s), device) in _captures.streams_capturing:  # its thread ended mid-capture
                    s = None
        s = mine[device] = s if s is not None else Stream(device)
    return s
