"""Device memory: allocations, graph memory pools and deferred frees.

Outside graph capture, memory comes from the device's stream-ordered pool
(``cuMemAllocAsync`` on the current stream). While a :class:`~jaxgraph.CUDAGraph`
captures on a stream, allocations on that stream come from the graph's
:class:`MemPool` instead: their addresses are baked into the graph, so the
pool keeps them valid for as long as any graph (or array) using it lives.

Freeing device memory is not permitted while a stream capture is underway
(it may synchronize the device), so frees requested then are deferred until
the last capture ends, as PyTorch's caching allocator does.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

from . import _driver
from ._driver import check

__all__ = [
    "Allocation",
    "CaptureTracker",
    "MemPool",
    "allocate",
    "capturing_on",
    "check_watched",
    "graph_pool_handle",
    "note_capture_operands",
    "pool_from_token",
]

_ALIGN = 512  # allocation granularity of pool blocks, bytes


# ----------------------------------------------------------------------------
# Allocation
# ----------------------------------------------------------------------------


class Allocation:
    """Owns one block of device memory; frees (or returns it to its pool) when dropped."""

    __slots__ = ("ptr", "nbytes", "device", "_stream", "_pool", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, device: int, stream: Any, pool: "MemPool | None"):
        self.ptr = ptr
        self.nbytes = nbytes
        self.device = device
        self._stream = stream  # the Stream it was allocated on; freed in its order
        self._pool = pool

    def __del__(self) -> None:
        try:
            if self._pool is not None:
                self._pool._release(self.ptr, self.nbytes)
            else:
                _free_async(self.ptr, self.device, self._stream)
        except Exception:  # finalizers never raise
            pass

    @property
    def pool(self) -> "MemPool | None":
        """The graph pool this block came from, or ``None``."""
        return self._pool


def allocate(nbytes: int, stream: Any) -> Allocation:
    """Allocate ``nbytes`` of device memory for use on ``stream`` (a :class:`Stream`).

    While a jaxgraph capture is underway on ``stream``, the block comes from
    the capturing graph's pool.
    """
    device = stream.device
    _driver.ensure_context(device)
    tracker = _captures.get((int(stream), device))
    if tracker is not None:
        pool = tracker.pool
        alloc = Allocation(pool._acquire(nbytes), nbytes, device, stream, pool)
        tracker.allocated.add(alloc)
        return alloc
    drv = _driver.driver()
    if int(stream) != 0 and _is_capturing(stream):
        raise RuntimeError(
            "cannot allocate on a stream captured outside jaxgraph: capture with "
            "jaxgraph.graph() / CUDAGraph.capture_begin() so allocations come from a graph pool"
        )
    ptr = check(drv.cuMemAllocAsync(max(nbytes, 1), stream.handle), "cuMemAllocAsync")
    return Allocation(int(ptr), nbytes, device, stream, None)


def _is_capturing(stream: Any) -> bool:
    drv = _driver.driver()
    status = check(drv.cuStreamIsCapturing(stream.handle), "cuStreamIsCapturing")
    return status != drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


# ----------------------------------------------------------------------------
# Graph memory pools
# ----------------------------------------------------------------------------


class MemPool:
    """A private pool of device memory for graph captures.

    Blocks are obtained with ``cuMemAlloc`` and never returned to the driver
    while the pool lives: an array freed after capture returns its block to
    the pool, where a *later capture into the same pool* may reuse it. That is
    why graphs sharing a pool must be replayed in the order they were captured
    (as in PyTorch). The pool's memory goes back to the driver when the pool
    and every graph and array using it are gone.

    Users rarely make one directly: use :func:`graph_pool_handle` or
    :meth:`CUDAGraph.pool`.
    """

    _ids = itertools.count(1)

    def __init__(self, device: int | None = None):
        self.device = _driver.ensure_context(device)
        self.id = next(MemPool._ids)
        self._lock = threading.Lock()
        self._free: dict[int, list[int]] = {}   # rounded size -> free block addresses
        self._blocks: dict[int, int] = {}       # address -> rounded size (every block owned)
        _pools[self.id] = self

    @property
    def reserved_bytes(self) -> int:
        """Device memory held by this pool (in use or free for reuse)."""
        with self._lock:
            return sum(self._blocks.values())

    @property
    def free_bytes(self) -> int:
        """Bytes of blocks available for reuse by the next capture."""
        with self._lock:
            return sum(size * len(addrs) for size, addrs in self._free.items())

    def token(self) -> "PoolHandle":
        """The opaque token naming this pool (what :meth:`CUDAGraph.pool` returns)."""
        return PoolHandle(self)

    def _acquire(self, nbytes: int) -> int:
        size = max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
        with self._lock:
            free = self._free.get(size)
            if free:
                return free.pop()
        ptr = _alloc_during_capture(size, self.device)
        with self._lock:
            self._blocks[ptr] = size
        return ptr

    def _release(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            size = self._blocks.get(ptr)
            if size is not None:
                self._free.setdefault(size, []).append(ptr)

    def __del__(self) -> None:
        blocks = getattr(self, "_blocks", None)
        if not blocks:
            return
        for ptr in list(blocks):
            try:
                _free_sync(ptr, self.device)
            except Exception:
                pass
        blocks.clear()

    def __repr__(self) -> str:
        return f"<jaxgraph.MemPool id={self.id} device={self.device} reserved={self.reserved_bytes}>"


class PoolHandle(tuple):
    """Opaque token naming a graph memory pool: ``(0, id)``, like PyTorch's.

    It compares equal to the plain tuple, and while it lives it keeps its pool
    alive, so a ``graph_pool_handle()`` made before any capture stays valid.
    """

    def __new__(cls, pool: MemPool) -> "PoolHandle":
        self = super().__new__(cls, (0, pool.id))
        self._pool = pool
        return self

    def __repr__(self) -> str:
        return f"PoolHandle{tuple(self)!r}"


_pools: "weakref.WeakValueDictionary[int, MemPool]" = weakref.WeakValueDictionary()


def graph_pool_handle(device: int | None = None) -> PoolHandle:
    """Return a token for a new graph memory pool, to share between captures.

    Pass it as ``pool=`` to several :func:`graph` / :meth:`CUDAGraph.capture_begin`
    calls to let those graphs share memory. Graphs sharing a pool must be
    replayed in the order they were captured.
    """
    return PoolHandle(MemPool(device))


def pool_from_token(token: Any) -> MemPool:
    """Resolve a pool token (a :class:`PoolHandle`, ``(0, id)`` tuple or :class:`MemPool`)."""
    if isinstance(token, MemPool):
        return token
    if isinstance(token, PoolHandle):
        return token._pool
    if isinstance(token, tuple) and len(token) == 2 and all(isinstance(v, int) for v in token):
        pool = _pools.get(token[1])
        if pool is not None:
            return pool
        raise ValueError(f"pool {tuple(token)!r} no longer exists: its graphs and handles are gone")
    raise TypeError(
        "pool must be a token from graph_pool_handle() or CUDAGraph.pool(), "
        f"got {type(token).__name__}"
    )


# ----------------------------------------------------------------------------
# Capture bookkeeping
# ----------------------------------------------------------------------------

class CaptureTracker:
    """One capture underway: its pool, the operands of its work and the blocks it allocated.

    A graph bakes the addresses of every array its work reads or writes. Those
    allocated from the graph's pool *during* the capture live as long as the
    pool; any other operand (an *external input*) must be kept alive by the
    graph, or checked before each replay. Kernel launches, ``copy_`` and
    ``fill_`` report their operands here through :func:`note_capture_operands`.

    Attributes
    ----------
    pool : MemPool
        Where allocations on the capturing stream come from.
    operands : list of (label, where, array)
        External operands in first-use order: the parameter name, what used it
        (``"kernel axpy"``), and the array as passed (a DeviceArray or a foreign
        array such as a ``jax.Array``).
    allocated : weakref.WeakSet of Allocation
        Blocks this capture allocated from its pool.
    """

    __slots__ = ("pool", "operands", "allocated", "_seen")

    def __init__(self, pool: MemPool) -> None:
        self.pool = pool
        self.operands: list[tuple[str, str, Any]] = []
        self.allocated: "weakref.WeakSet[Allocation]" = weakref.WeakSet()
        self._seen: set[int] = set()   # id() of each recorded owner (kept alive by operands)

    def note(self, label: str, where: str, array: Any) -> None:
        """Record ``array`` unless it was allocated by this capture or already recorded."""
        owner = _owner_of(array)
        if isinstance(owner, Allocation) and owner in self.allocated:
            return  # lives in the graph's pool: valid as long as the graph
        key = id(owner)
        if key not in self._seen:
            self._seen.add(key)
            self.operands.append((label, where, array))

    def settle(self, watch: bool) -> tuple[list, list]:
        """Turn the external inputs into what a captured graph holds on to.

        Returns the owners to keep alive, and with ``watch`` (the graph's
        ``check_input_liveness``) the ``(label, where, description, weakref)``
        entries to check before each replay instead. An owner that cannot be
        weakly referenced is kept alive even when watching.
        """
        keep, watched = [], []
        for label, where, array in self.operands:
            owner = _owner_of(array)
            if watch:
                try:
                    watched.append((label, where, _describe(array), weakref.ref(owner)))
                    continue
                except TypeError:
                    pass
            keep.append(owner)
        return keep, watched


_capture_lock = threading.Lock()
# (stream handle, device) -> the capture underway there; empty unless one is.
_captures: dict[tuple[int, int], CaptureTracker] = {}
_captures_underway = 0
_deferred_frees: list[tuple[int, int, Any]] = []


def begin_capture_allocations(stream: Any, tracker: CaptureTracker) -> None:
    """Route allocations on ``stream`` to ``tracker.pool``, record the capture's operands
    into ``tracker``, and defer frees until capture ends."""
    global _captures_underway
    with _capture_lock:
        _captures[(int(stream), stream.device)] = tracker
        _captures_underway += 1


def end_capture_allocations(stream: Any) -> None:
    """Undo :func:`begin_capture_allocations`; run deferred frees after the last capture."""
    global _captures_underway
    with _capture_lock:
        _captures.pop((int(stream), stream.device), None)
        _captures_underway -= 1
        pending = []
        if _captures_underway == 0:
            pending, _deferred_frees[:] = list(_deferred_frees), []
    for ptr, device, s in pending:
        try:
            _free_async(ptr, device, s) if s is not None else _free_sync(ptr, device)
        except Exception:
            pass


def capturing_on(stream: Any) -> bool:
    """Whether a jaxgraph capture is underway on ``stream`` (no driver call)."""
    return (int(stream), stream.device) in _captures


def note_capture_operands(stream: Any, operands: Any, where: str) -> None:
    """Tell the capture underway on ``stream`` (if any) which arrays some work uses.

    ``operands`` is an iterable of ``(label, array)``. Callers test
    ``_memory._captures`` first, so eager work pays one dict check.
    """
    tracker = _captures.get((int(stream), stream.device))
    if tracker is None:
        return
    for label, array in operands:
        tracker.note(label, where, array)


def check_watched(watched: list) -> None:
    """Raise naming the first watched input (see :meth:`CaptureTracker.settle`) that was freed."""
    for label, where, description, ref in watched:
        if ref() is None:
            raise RuntimeError(
                f"input '{label}' ({description}, used by {where}) used in the capture was freed "
                "before replay; keep it alive as long as the graph replays, or capture again")


def _describe(array: Any) -> str:
    """``"DeviceArray shape (4096,) float32 at 0x7f..."``, for error messages."""
    shape = tuple(getattr(array, "shape", ()))
    text = f"{type(array).__name__} shape {shape} {getattr(array, 'dtype', '')}"
    ptr = getattr(array, "ptr", None)
    return f"{text} at {ptr:#x}" if isinstance(ptr, int) else text


def _owner_of(array: Any) -> Any:
    """The object keeping ``array``'s memory alive: a DeviceArray's owner, else the array."""
    from ._array import DeviceArray  # _array imports this module

    return array.owner if isinstance(array, DeviceArray) else array


def _free_async(ptr: int, device: int, stream: Any) -> None:
    with _capture_lock:
        if _captures_underway:
            _deferred_frees.append((ptr, device, stream))
            return
    _driver.ensure_context(device)
    check(_driver.driver().cuMemFreeAsync(ptr, stream.handle), "cuMemFreeAsync")


def _free_sync(ptr: int, device: int) -> None:
    with _capture_lock:
        if _captures_underway:
            _deferred_frees.append((ptr, device, None))
            return
    _driver.ensure_context(device)
    check(_driver.driver().cuMemFree(ptr), "cuMemFree")


def _alloc_during_capture(nbytes: int, device: int) -> int:
    """``cuMemAlloc`` with this thread's capture mode relaxed for the call.

    A synchronous allocation is a "potentially unsafe" call under global or
    thread-local capture; relaxing the mode for this one call is what
    ``cuThreadExchangeStreamCaptureMode`` exists for.
    """
    drv = _driver.driver()
    _driver.ensure_context(device)
    relaxed = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    previous = check(drv.cuThreadExchangeStreamCaptureMode(relaxed), "cuThreadExchangeStreamCaptureMode")
    try:
        return int(check(drv.cuMemAlloc(nbytes), "cuMemAlloc"))
    finally:
        check(drv.cuThreadExchangeStreamCaptureMode(previous), "cuThreadExchangeStreamCaptureMode")
