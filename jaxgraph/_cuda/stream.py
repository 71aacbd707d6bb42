"""Streams and events: jaxgraph's own streams, wrapped external ones, and the current stream.

Each thread has a current stream per device, the legacy default stream unless
changed with ``with jaxgraph.stream(s):`` or ``with s:``. Kernel launches,
copies and allocations go to the current stream, as in PyTorch. What ``with s:``
restores on exit is kept per thread too, so threads may enter the same stream
at once.
"""

from __future__ import annotations

import threading
from typing import Any

from . import driver as _driver
from .driver import check

__all__ = ["Event", "Stream", "current_stream", "current_stream_if_set", "set_current", "stream", "synchronize",
           "thread_streams", "wait_on_current"]


# ----------------------------------------------------------------------------
# Stream
# ----------------------------------------------------------------------------


class Stream:
    """A CUDA stream on one device.

    ``Stream()`` creates a new non-blocking stream owned by this object.
    :meth:`from_handle` wraps a stream created elsewhere (by XLA, PyTorch,
    CuPy or a C++ library) without taking ownership. A stream is a context
    manager that makes itself current: ``with s: ...``; each thread restores
    its own previous stream on exit, so several threads may use one stream
    object as a context at once.

    Parameters
    ----------
    device : int, optional
        Device ordinal; default: the current device.
    priority : int, optional
        Stream priority; lower numbers are higher priority. Default 0.
    """

    __slots__ = ("_h_stream", "_device", "_owner", "_owned", "_handle_int", "__weakref__")

    def __init__(self, device: int | None = None, *, priority: int = 0):
        device = _driver.ensure_context(device)
        drv = _driver.driver()
        flags = drv.CUstream_flags.CU_STREAM_NON_BLOCKING
        handle = check(drv.cuStreamCreateWithPriority(flags, int(priority)), "cuStreamCreateWithPriority")
        self._setup(handle, device, owner=None, owned=True)

    @classmethod
    def from_handle(cls, handle: Any, *, device: int | None = None, owner: Any = None) -> "Stream":
        """Wrap an existing ``CUstream`` / ``cudaStream_t`` (an int or a handle object).

        The stream is not destroyed by jaxgraph. ``owner`` is kept alive as long
        as the wrapper lives (e.g. the torch/CuPy stream object the handle came
        from). ``0`` names the legacy default stream.
        """
        device = _driver.ensure_context(device)
        drv = _driver.driver()
        self = cls.__new__(cls)
        self._setup(drv.CUstream(int(handle)), device, owner=owner, owned=False)
        return self

    @classmethod
    def legacy_default(cls, device: int | None = None) -> "Stream":
        """The legacy default stream (``0``) of ``device``; it cannot be captured."""
        return cls.from_handle(0, device=device)

    def _setup(self, handle: Any, device: int, owner: Any, owned: bool) -> None:
        self._h_stream = handle
        self._handle_int = int(handle)
        self._device = device
        self._owner = owner
        self._owned = owned

    @property
    def handle(self) -> Any:
        """The ``cuda.bindings.driver.CUstream``; use ``int(stream.handle)`` for the address."""
        return self._h_stream

    @property
    def device(self) -> int:
        """The device ordinal this stream belongs to."""
        return self._device

    @property
    def is_legacy_default(self) -> bool:
        """Whether this is the legacy default stream (handle 0)."""
        return self._handle_int == 0

    def __int__(self) -> int:
        return self._handle_int

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol, ``(0, address)``: how CuPy's ``Stream.from_external`` and cuda.core read it."""
        return (0, self._handle_int)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._handle_int == self._handle_int and (
            other._device == self._device
        )

    def __hash__(self) -> int:
        return hash((self._handle_int, self._device))

    def __repr__(self) -> str:
        kind = "owned" if self._owned else "external"
        return f"<jaxgraph.Stream {self._handle_int:#x} device={self._device} {kind}>"

    def synchronize(self) -> None:
        """Block the host until all work queued on this stream is done."""
        _driver.ensure_context(self._device)
        check(_driver.driver().cuStreamSynchronize(self._h_stream), "cuStreamSynchronize")

    def query(self) -> bool:
        """Whether all work queued on this stream is done (never blocks)."""
        _driver.ensure_context(self._device)
        drv = _driver.driver()
        (err,) = drv.cuStreamQuery(self._h_stream)
        if err == drv.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check((err,), "cuStreamQuery")
        return True

    def wait_event(self, event: "Event") -> None:
        """Make future work on this stream wait for ``event``."""
        _driver.ensure_context(self._device)
        check(_driver.driver().cuStreamWaitEvent(self._h_stream, event.handle, 0), "cuStreamWaitEvent")

    def wait_stream(self, other: "Stream") -> None:
        """Make future work on this stream wait for work queued so far on ``other``."""
        if other == self:
            return
        event = Event()
        event.record(other)
        self.wait_event(event)

    def record_event(self, event: "Event | None" = None) -> "Event":
        """Record ``event`` (a new one by default) on this stream and return it."""
        event = Event() if event is None else event
        event.record(self)
        return event

    def close(self) -> None:
        """Destroy an owned stream (idempotent; wrapped streams are only released)."""
        handle, self._h_stream = self._h_stream, None
        if handle is not None and self._owned:
            try:
                _driver.ensure_context(self._device)
                _driver.driver().cuStreamDestroy(handle)
            except Exception:
                pass
        self._owner = None

    def __del__(self) -> None:
        if getattr(self, "_owned", False) and getattr(self, "_h_stream", None) is not None:
            self.close()

    def __enter__(self) -> "Stream":
        _push_previous(self, set_current(self))
        return self

    def __exit__(self, *exc: Any) -> None:
        set_current(_pop_previous(self), self._device)


# ----------------------------------------------------------------------------
# Event
# ----------------------------------------------------------------------------


class Event:
    """A CUDA event, for ordering streams and timing on the device.

    Parameters
    ----------
    enable_timing : bool
        Record timestamps so :meth:`elapsed_time` works (slightly slower events).
    """

    __slots__ = ("_h_event", "_device")

    def __init__(self, enable_timing: bool = False, *, device: int | None = None):
        self._device = _driver.ensure_context(device)
        drv = _driver.driver()
        flags = 0 if enable_timing else drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        self._h_event = check(drv.cuEventCreate(flags), "cuEventCreate")

    @property
    def handle(self) -> Any:
        """The ``CUevent``; use ``int(event.handle)`` for the address."""
        return self._h_event

    def record(self, stream: Stream | None = None) -> None:
        """Record on ``stream`` (default: the current stream)."""
        stream = current_stream(self._device) if stream is None else stream
        _driver.ensure_context(self._device)
        check(_driver.driver().cuEventRecord(self._h_event, stream.handle), "cuEventRecord")

    def synchronize(self) -> None:
        """Block the host until the recorded work is done."""
        check(_driver.driver().cuEventSynchronize(self._h_event), "cuEventSynchronize")

    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds between this event and ``end`` (both recorded with timing enabled)."""
        return float(check(_driver.driver().cuEventElapsedTime(self._h_event, end._h_event),
                           "cuEventElapsedTime"))

    def __del__(self) -> None:
        handle = getattr(self, "_h_event", None)
        if handle is not None:
            try:
                _driver.driver().cuEventDestroy(handle)
            except Exception:
                pass


# ----------------------------------------------------------------------------
# The current stream
# ----------------------------------------------------------------------------


class _ThreadStreams(threading.local):
    """Per-thread current streams."""

    def __init__(self) -> None:  # runs once in each thread that looks
        self.streams: dict[int, Stream] = {}  # device -> the thread's current stream
        self.saved: dict[int, list[Stream]] = {}  # id(stream) -> what `with stream:` restores, innermost last


_local = _ThreadStreams()
# The same object under a public name: the eager launch reads the current stream without a call (read only).
thread_streams = _local


def current_stream(device: int | None = None) -> Stream:
    """The calling thread's current stream on ``device`` (default: current device).

    The legacy default stream unless ``with jaxgraph.stream(s):`` (or ``with s:``)
    is active.
    """
    if device is None:
        device = _driver.current_device()
    streams = _local.streams
    s = streams.get(device)
    if s is None:
        s = streams[device] = Stream.legacy_default(device)
    return s


def current_stream_if_set(device: int) -> Stream | None:
    """The calling thread's current stream on ``device`` if one was ever made current or asked for, else ``None``.

    Unlike :func:`current_stream` it creates nothing (no default stream, no context).
    """
    streams = getattr(_local, "streams", None)
    return streams.get(device) if streams else None


def set_current(s: Stream, device: int | None = None) -> Stream:
    """Make ``s`` current on its device; return the stream it replaced."""
    device = s.device if device is None else device
    previous = current_stream(device)
    _local.streams[device] = s
    return previous


class stream:
    """Context manager making ``s`` the current stream of its device for this thread.

    ``None`` is accepted and does nothing, as in ``torch.cuda.stream``.
    What it restores on exit is kept per thread, as for ``with s:``.

    Examples
    --------
    >>> s = jaxgraph.Stream()
    >>> with jaxgraph.stream(s):
    ...     kernel[grid, block](y, x)      # runs on s
    """

    def __init__(self, s: Stream | None):
        if s is not None and not isinstance(s, Stream):
            raise TypeError(f"stream() expects a jaxgraph.Stream or None, got {type(s).__name__}")
        self._stream = s

    def __enter__(self) -> Stream | None:
        if self._stream is not None:
            _push_previous(self, set_current(self._stream))
        return self._stream

    def __exit__(self, *exc: Any) -> None:
        if self._stream is not None:
            set_current(_pop_previous(self), self._stream.device)


def _push_previous(context: Any, previous: Stream) -> None:
    """Remember, for this thread, the stream ``context`` (a Stream or a ``stream``) made current replaced.

    Kept per thread: another thread entering the same object keeps its own.
    """
    _local.saved.setdefault(id(context), []).append(previous)


def _pop_previous(context: Any) -> Stream:
    """The stream to restore as ``context`` exits in this thread (the last one it replaced here)."""
    saved = _local.saved.get(id(context))  # alive while entered (the with statement holds it): the id is its own
    if not saved:
        raise RuntimeError(f"{context!r}.__exit__ without a matching __enter__ in this thread")
    previous = saved.pop()
    if not saved:
        del _local.saved[id(context)]
    return previous


def synchronize(device: int | None = None) -> None:
    """Block the host until all work on ``device`` (default: current device) is done."""
    _driver.ensure_context(device)
    check(_driver.driver().cuCtxSynchronize(), "cuCtxSynchronize")


def wait_on_current(device: int, consumer_stream: int | None) -> None:
    """Make a DLPack consumer's stream (a raw handle; ``None``: the legacy default stream) wait
    for this thread's current stream on ``device``."""
    ours = current_stream(device)
    # DLPack (CUDA): None and 1 mean the legacy default stream, 2 per-thread default.
    theirs = 1 if consumer_stream is None else int(consumer_stream)
    if theirs == int(ours) or (theirs == 1 and ours.is_legacy_default):
        return
    _driver.ensure_context(device)
    event = Event(device=device)
    event.record(ours)
    check(_driver.driver().cuStreamWaitEvent(theirs, event.handle, 0), "cuStreamWaitEvent")
