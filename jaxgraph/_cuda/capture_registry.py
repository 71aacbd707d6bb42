"""Captures underway: the streams capturing into jaxgraph graphs, and what their work uses.

A capture begun by :meth:`CUDAGraph.capture_begin <jaxgraph.CUDAGraph.capture_begin>`
is a :class:`Capture` registered here until it ends. A capture may fork: a
stream that waits on an event recorded in the capture (``s2.wait_stream(s1)``)
joins it, and CUDA records its work into the same graph. Every stream of the
capture is treated alike (CUDA tells which capture a stream belongs to:
``cuStreamGetCaptureInfo`` gives its capture id). While a capture is underway:

- allocations on any of its streams come from the graph's pool (:func:`pool_for`);
- kernel launches, ``copy_`` and ``fill_`` on its streams report the arrays
  they use (:func:`note_operands`), so the graph can keep its *external
  inputs* (arrays it did not allocate) alive, or watch them;
- frees anywhere are deferred (``_cuda.memory.hold_frees``), because freeing may
  synchronize the device, which would invalidate the capture.

:func:`end` turns the registered capture into a ``CUgraph``; the capture's
record (its :class:`Capture`) settles into what the graph must hold on to.

The record of one capture: what its work used, and what the captured graph must hold.

A :class:`Capture` is made by :func:`begin` and fed while the capture
runs (operands, kernels, conditional nodes, embedded graphs); when it ends,
:meth:`Capture.settle` turns it into the graph's :class:`CaptureInputs`:
external inputs kept alive (or watched), pools, kernels and what its nodes
name. This module's functions (:func:`begin`, :func:`end`, :func:`capture_on`, ...)
keep the registry of captures underway.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any, Iterable

from . import driver as _driver, memory as _memory
from .driver import CudaError, check
from .memory import Allocation, MemPool

__all__ = [
    "Capture",
    "CaptureInputs",
    "abort",
    "any_underway",
    "attach",
    "begin",
    "capture_id_of",
    "capture_on",
    "detach",
    "end",
    "note_operands",
    "order_after",
    "pool_for",
    "streams_capturing",
    "underway_on",
]

# ----------------------------------------------------------------------------
# Capture
# ----------------------------------------------------------------------------


class Capture:
    """One capture underway: where it runs, its pool, and the operands of its work.

    Attributes
    ----------
    stream : Stream
        The stream the capture began on (and must end on).
    capture_id : int
        CUDA's id of the capture sequence; a forked stream reports the same id.
    streams : set of (int, int)
        ``(handle, device)`` of every stream seen taking part, the origin first.
    pool : MemPool
        Where allocations on the capture's stream come from.
    mode : str
        The ``capture_error_mode``.
    thread : int
        The thread that began it (``global``/``thread_local`` captures end there).
    watch : bool
        ``check_input_liveness``: watch external inputs instead of keeping them.
    operands : list of (label, where, array)
        External operands in first-use order: the parameter name, what used it
        (``"kernel axpy"``), and the array (a DeviceArray).
    regions : list
        Conditional regions open now, innermost last (``_graphs.conditional_nodes.Region``).
    conditionals : list of (int, str, tuple)
        Every conditional node added: its address, kind and body graphs' addresses.
    retained : list
        Owners kept for embedded graphs (their pools and inputs).
    broken : str or None
        Why the capture can no longer end well (an exception escaped a region).
    """

    __slots__ = ("stream", "capture_id", "streams", "pool", "mode", "thread", "watch", "operands", "kernels",
                 "held", "regions", "conditionals", "retained", "broken", "written", "_allocated", "_seen")

    def __init__(self, stream: Any, pool: MemPool, mode: str, watch: bool) -> None:
        self.stream = stream
        self.capture_id = 0
        self.streams = {(int(stream), stream.device)}  # as the registry keys streams (_key)
        self.pool = pool
        self.mode = mode
        self.thread = threading.get_ident()
        self.watch = watch
        self.operands: list[tuple[str, str, Any]] = []
        self.kernels: dict[int, str] = {}   # handle -> per-parameter flags (see note_kernel)
        self.held: dict[int, Any] = {}      # id -> objects the graph's nodes name (kernels, events)
        self.regions: list[Any] = []
        self.conditionals: list[tuple[int, str, tuple]] = []
        self.retained: list[Any] = []
        self.broken: str | None = None
        # (ptr, nbytes) -> (label, where, description) of external memory a kernel may write
        self.written: dict[tuple[int, int], tuple[str, str, str]] = {}
        self._allocated: "weakref.WeakSet[Allocation]" = weakref.WeakSet()
        self._seen: set[int] = set()   # id() of each recorded owner (kept alive by operands)

    def allocate(self, nbytes: int, stream: Any) -> Allocation:
        """A block of the capture's pool; it lives as long as the pool, so it is no external input."""
        alloc = _memory.allocate(nbytes, stream, self.pool)
        self._allocated.add(alloc)
        return alloc

    def note(self, label: str, where: str, array: Any, written: bool = False) -> None:
        """Record ``array`` (a DeviceArray) unless this capture allocated it or it is recorded.

        ``written``: the launch may write it (a pointer parameter without ``const``): external
        memory a step writes, which a speculative device stop must know of.
        """
        owner = array.owner
        if isinstance(owner, Allocation) and owner in self._allocated:
            return  # lives in the graph's pool: valid as long as the graph
        if written and array.nbytes > 0:
            self.written.setdefault((int(array.ptr), int(array.nbytes)), (label, where, _describe(array)))
        if id(owner) not in self._seen:
            self._seen.add(id(owner))
            self.operands.append((label, where, array))

    def note_kernel(self, handles: Iterable[int], flags: str, kernel: Any = None) -> None:
        """Record a jaxgraph kernel launched in the capture: its handles and, per
        parameter, ``r`` (a pointer it only reads), ``w`` (a pointer it may write) or
        ``s`` (a scalar). Replay inside jit binds XLA's operands only where kernels read them.
        ``kernel`` (the :class:`~jaxgraph.Kernel`) is kept with the graph: its
        loaded code must outlive every replay, even if the caller drops it."""
        if kernel is not None:
            self.hold(kernel)
        for handle in handles:
            self.kernels[int(handle)] = flags

    def hold(self, obj: Any) -> None:
        """Keep ``obj`` alive as long as the captured graph: something its nodes name."""
        self.held[id(obj)] = obj

    def settle(self) -> "CaptureInputs":
        """What the captured graph must hold: external inputs (kept or watched) and pools."""
        keep, watched = [], []
        for label, where, array in self.operands:
            if self.watch:
                try:
                    watched.append((label, where, _describe(array), weakref.ref(array.owner)))
                    continue
                except TypeError:  # not weakly referenceable: keep it alive instead
                    pass
            keep.append(array.owner)
        keep += [owner for owner in self.retained if not isinstance(owner, MemPool)]
        pools = [self.pool]
        for owner in keep + [p for p in self.retained if isinstance(p, MemPool)]:
            pool = owner if isinstance(owner, MemPool) else owner.pool if isinstance(owner, Allocation) else None
            if pool is not None and all(p is not pool for p in pools):
                pools.append(pool)  # an input from another graph's pool (or an embedded graph's) keeps that pool
        return CaptureInputs(tuple(keep), tuple(watched), tuple(pools), tuple(self.kernels.items()),
                             tuple(self.held.values()), tuple(self.conditionals),
                             tuple((ptr, nbytes, *what) for (ptr, nbytes), what in self.written.items()))


@dataclasses.dataclass(frozen=True)
class CaptureInputs:
    """What a captured graph holds on to so no replay reads freed memory.

    Attributes
    ----------
    keep : tuple
        Owners of the external inputs, kept alive.
    watched : tuple of (label, where, description, weakref)
        With ``check_input_liveness``: external inputs watched instead.
    pools : tuple of MemPool
        The graph's own pool first, then pools its inputs came from.
    kernels : tuple of (int, str)
        The jaxgraph kernels launched, by handle, with their parameter flags
        (see :meth:`Capture.note_kernel`).
    held : tuple
        What the graph's nodes name, kept alive with it: the
        :class:`~jaxgraph.Kernel` objects launched (their code stays loaded)
        and the events of external waits (:func:`order_after`).
    conditionals : tuple of (int, str, tuple)
        The conditional nodes of the graph (at any depth): node address, kind
        (``"IF"``, ``"WHILE"``, ``"SWITCH"``) and body graph addresses. Empty
        for a graph without branches or loops.
    written : tuple of (int, int, str, str, str)
        External memory (not the graph's pool) that jaxgraph kernels of the
        capture may write, through pointer parameters without ``const``:
        address, bytes, parameter, launch and a description of the array.
    """

    keep: tuple = ()
    watched: tuple = ()
    pools: tuple = ()
    kernels: tuple = ()
    held: tuple = ()
    conditionals: tuple = ()
    written: tuple = ()

    def check_watched(self) -> None:
        """Raise naming the first watched input that was freed."""
        for label, where, description, ref in self.watched:
            if ref() is None:
                raise RuntimeError(
                    f"input '{label}' ({description}, used by {where}) used in the capture was freed "
                    "before replay; keep it alive as long as the graph replays, or capture again")


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _describe(array: Any) -> str:
    """``"DeviceArray shape (4096,) float32 at 0x7f..."``, for error messages."""
    shape = tuple(getattr(array, "shape", ()))
    text = f"{type(array).__name__} shape {shape} {getattr(array, 'dtype', '')}"
    ptr = getattr(array, "ptr", None)
    return f"{text} at {ptr:#x}" if isinstance(ptr, int) else text


# ----------------------------------------------------------------------------
# Beginning and ending
# ----------------------------------------------------------------------------

_lock = threading.Lock()
# (stream handle, device) -> the capture underway there, for every stream seen
# taking part; empty unless a capture is underway.
_by_stream: dict[tuple[int, int], Capture] = {}
# The same dict, for the eager launch's fast path to test without a call (read only there).
streams_capturing: dict[tuple[int, int], Capture] = _by_stream
_by_id: dict[int, Capture] = {}   # CUDA capture id -> capture


def begin(stream: Any, pool: MemPool, mode: str, watch: bool) -> Capture:
    """Register a capture on ``stream`` and begin CUDA stream capture there.

    Raises ``RuntimeError`` if ``stream`` already captures into a jaxgraph graph.
    """
    key = _key(stream)
    capture = Capture(stream, pool, mode, watch)
    with _lock:
        if key in _by_stream:
            raise RuntimeError(f"capture_begin: {stream!r} is already capturing into another graph; "
                               "end that capture first")
        _by_stream[key] = capture
    _memory.hold_frees()
    try:
        drv = _driver.driver()
        enum_mode = getattr(drv.CUstreamCaptureMode, f"CU_STREAM_CAPTURE_MODE_{mode.upper()}")
        check(drv.cuStreamBeginCapture(stream.handle, enum_mode), "cuStreamBeginCapture")
        capture.capture_id = capture_id_of(stream)
    except BaseException:
        _unregister(capture)
        raise
    with _lock:
        _by_id[capture.capture_id] = capture
    return capture


def end(capture: Capture) -> Any:
    """End ``capture``: return its ``CUgraph``, or raise if CUDA refused it.

    The capture is unregistered either way, and no stream is left capturing.

    Raises
    ------
    RuntimeError
        Work forked onto another stream was not joined back (CUDA's "unjoined" error).
    CudaError
        The capture was invalidated.
    """
    _driver.ensure_context(capture.stream.device)
    try:
        err, h_graph = _driver.driver().cuStreamEndCapture(capture.stream.handle)[:2]
    finally:
        _unregister(capture)
    if err == _driver.driver().CUresult.CUDA_ERROR_STREAM_CAPTURE_UNJOINED:
        others = sorted(f"{handle:#x}" for handle, _ in capture.streams - {_key(capture.stream)})
        raise RuntimeError(
            "capture_end: work forked onto another stream during the capture was not joined back "
            f"(CUDA_ERROR_STREAM_CAPTURE_UNJOINED; streams seen in the capture: {', '.join(others) or 'none'}): "
            "make the capture stream wait for every stream it forked (capture_stream.wait_stream(other)) "
            "before the capture ends. The capture was discarded; the graph can be captured again")
    if err != 0 or h_graph is None or not int(h_graph):
        raise CudaError("cuStreamEndCapture", err, "the capture was invalidated by work not permitted "
                        "while a stream captures (a synchronization, a synchronous copy or allocation, or "
                        "an unsafe call in another thread under capture_error_mode='global'); the graph "
                        "was reset and can be captured again")
    return h_graph


def abort(capture: Capture) -> None:
    """End ``capture`` and discard what it recorded (open regions first); never raises."""
    for region in reversed(list(capture.regions)):
        try:
            region.discard()
        except Exception:
            pass
    try:
        _driver.ensure_context(capture.stream.device)
        drv = _driver.driver()
        err, h_graph = drv.cuStreamEndCapture(capture.stream.handle)[:2]
        if err == 0 and h_graph is not None and int(h_graph):
            drv.cuGraphDestroy(h_graph)
    except Exception:
        pass
    finally:
        _unregister(capture)


def attach(capture: Capture, stream: Any) -> int:
    """Count ``stream`` (now capturing a conditional body of ``capture``) as part of it; return its capture id."""
    key = _key(stream)
    capture_id = capture_id_of(stream)
    with _lock:
        capture.streams.add(key)
        _by_stream[key] = capture
        if capture_id:
            _by_id[capture_id] = capture
    return capture_id


def detach(capture: Capture, stream: Any, capture_id: int) -> None:
    """Undo :func:`attach` once the body capture on ``stream`` has ended."""
    key = _key(stream)
    with _lock:
        capture.streams.discard(key)
        if _by_stream.get(key) is capture:
            del _by_stream[key]
        if capture_id and _by_id.get(capture_id) is capture:
            del _by_id[capture_id]


def _unregister(capture: Capture) -> None:
    with _lock:
        if _by_stream.get(_key(capture.stream)) is not capture:
            return
        for key in capture.streams:
            if _by_stream.get(key) is capture:
                del _by_stream[key]
        if _by_id.get(capture.capture_id) is capture:
            del _by_id[capture.capture_id]
    _memory.release_frees()


# ----------------------------------------------------------------------------
# Queries from the work being captured
# ----------------------------------------------------------------------------


def any_underway() -> bool:
    """Whether any jaxgraph capture is underway (no driver call: the eager fast path)."""
    return bool(_by_stream)


def underway_on(device: int) -> bool:
    """Whether a jaxgraph capture is underway on ``device``, in any thread (no driver call).

    A device-wide synchronize (``cuCtxSynchronize``) from any thread
    invalidates a capture underway on the device, whatever its mode.
    """
    with _lock:
        return any(key[1] == device for key in _by_stream)


def capture_on(stream: Any) -> Capture | None:
    """The jaxgraph capture ``stream`` takes part in, or ``None``.

    No driver call when no capture is underway, or for a stream already seen
    in one; otherwise one ``cuStreamGetCaptureInfo``, which tells whether the
    stream joined a capture by waiting on its work.
    """
    if not _by_stream:
        return None
    key = _key(stream)
    capture = _by_stream.get(key)
    if capture is not None or key[0] == 0:  # the legacy default stream never captures
        return capture
    return _joined(stream, key)


def pool_for(stream: Any) -> Capture | None:
    """The capture an allocation on ``stream`` must come from, or ``None`` for ordinary memory.

    Raises
    ------
    RuntimeError
        ``stream`` captures, but not into a jaxgraph graph: the memory would
        have no pool to keep it valid.
    """
    capture = capture_on(stream)
    if capture is not None:
        return capture
    if int(stream) != 0 and _is_capturing(stream):
        raise RuntimeError(
            "cannot allocate on a stream captured outside jaxgraph: capture with "
            "jaxgraph.graph() / CUDAGraph.capture_begin() so allocations come from a graph pool")
    return None


def note_operands(stream: Any, operands: Iterable[tuple[str, Any]], where: str) -> None:
    """Tell the capture underway on ``stream`` (if any) which arrays some work uses.

    ``operands`` holds ``(label, DeviceArray)`` pairs.
    """
    capture = capture_on(stream)
    if capture is None:
        return
    for label, array in operands:
        capture.note(label, where, array)


def order_after(producer: Any, consumer: Any) -> bool:
    """Order ``consumer``'s next work after the work queued so far on ``producer``, during a capture.

    What the CUDA Array Interface (v3 ``stream``) asks of a consumer. Nothing
    may synchronize while a stream captures (CUDA refuses, and a refused call
    invalidates a global-mode capture), so the order is kept on the device:

    - ``producer`` is ``consumer``: nothing to do;
    - both take part in the same capture: an event recorded on ``producer``
      and waited on by ``consumer`` (an edge in the graph);
    - ``consumer`` captures into a jaxgraph graph and ``producer`` does not
      capture: an *external* event wait recorded into the graph, so its
      replays (the first one, in effect) wait for the producer's work; the
      graph keeps the event;
    - ``producer`` captures into another graph: nothing (its work has not
      run, and waiting on it would merge two captures); nor when ``consumer``
      captures into a graph jaxgraph did not begin (it could not keep the event);
    - ``consumer`` does not capture (another stream does): an event wait on
      the device instead of a host synchronization.

    Returns ``False``, doing nothing, when no stream captures: the caller then
    synchronizes the producer from the host, as outside captures always.
    """
    consumer_id = 0 if int(consumer) == 0 else capture_id_of(consumer)
    if not _by_stream and consumer_id == 0:
        return False
    if int(producer) == int(consumer) and producer.device == consumer.device:
        return True
    # The legacy default stream (1 in the CUDA Array Interface) never captures.
    producer_id = 0 if int(producer) in (0, 1) else capture_id_of(producer)
    drv = _driver.driver()
    if producer_id != 0 and producer_id != consumer_id:
        return True
    if consumer_id != 0 and producer_id == 0:
        capture = _by_id.get(consumer_id)
        if capture is None:
            return True
        flags = int(drv.CUevent_wait_flags.CU_EVENT_WAIT_EXTERNAL)
    else:
        capture, flags = None, 0
    from .stream import Event

    event = Event(device=consumer.device)
    event.record(producer)
    check(drv.cuStreamWaitEvent(consumer.handle, event.handle, flags), "cuStreamWaitEvent")
    if capture is not None:
        capture.hold(event)  # the graph's wait node names it
    return True


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _key(stream: Any) -> tuple[int, int]:
    return (int(stream), stream.device)


def capture_id_of(stream: Any) -> int:
    """CUDA's id of the capture ``stream`` takes part in (0 when it is not capturing)."""
    drv = _driver.driver()
    _driver.ensure_context(stream.device)
    result = drv.cuStreamGetCaptureInfo(stream.handle)
    if result[0] != 0 or result[1] != drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
        return 0
    return int(result[2])


def _joined(stream: Any, key: tuple[int, int]) -> Capture | None:
    """The jaxgraph capture a stream forked into, remembered for the rest of the capture."""
    capture_id = capture_id_of(stream)
    capture = _by_id.get(capture_id) if capture_id else None
    if capture is not None:
        with _lock:
            if _by_id.get(capture.capture_id) is capture:
                capture.streams.add(key)
                _by_stream[key] = capture
    return capture


def _is_capturing(stream: Any) -> bool:
    drv = _driver.driver()
    status = check(drv.cuStreamIsCapturing(stream.handle), "cuStreamIsCapturing")
    return status != drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
