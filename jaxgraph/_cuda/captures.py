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
record (``_cuda/capture_record.py``) settles into what the graph must hold on to.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable

from . import driver as _driver, memory as _memory
from .driver import CudaError, check
from .capture_record import Capture
from .memory import MemPool

__all__ = [
    "abort",
    "any_underway",
    "attach",
    "capture_id_of",
    "begin",
    "capture_on",
    "detach",
    "end",
    "note_operands",
    "order_after",
    "pool_for",
    "streams_capturing",
]


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

