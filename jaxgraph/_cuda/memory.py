"""Device memory: allocations, graph memory pools and deferred frees.

Outside graph capture, memory comes from the device's stream-ordered pool
(``cuMemAllocAsync`` on the allocating stream) and goes back in that stream's
order. While a :class:`~jaxgraph.CUDAGraph` captures, allocations on its
streams come from the graph's :class:`MemPool` instead (the capture
bookkeeping in ``_cuda/capture_registry.py`` says which pool): their addresses are baked
into the graph, so the pool keeps them valid for as long as any graph (or
array) using it lives.

Freeing device memory is not permitted while a stream capture is underway
(it may synchronize the device), so frees requested then are deferred until
the last capture ends (:func:`hold_frees` / :func:`release_frees`), as
PyTorch's caching allocator does. Python's cyclic garbage collector is off for
as long (and back on after, if it was on): a collection in the middle of a
capture would run the finalizers of any library's objects that died in
reference cycles (a CUDA module unloaded, a stream or buffer destroyed), and
one of those calls is enough to invalidate the capture. On the H100 a test of
1000 capture cycles failed now and then with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
before this (tests/GPU_RESULTS.md, session 4).
"""

from __future__ import annotations

import gc
import itertools
import threading
import weakref
from typing import Any

from . import driver as _driver
from .driver import check

__all__ = [
    "Allocation",
    "MemPool",
    "PoolHandle",
    "allocate",
    "graph_pool_handle",
    "hold_frees",
    "hold_reuse",
    "live_pool_ids",
    "pool_from_token",
    "release_frees",
    "release_reuse",
]

_ALIGN = 512  # allocation granularity of pool blocks, bytes


# ----------------------------------------------------------------------------
# Allocation
# ----------------------------------------------------------------------------


class Allocation:
    """Owns one block of device memory; frees (or returns it to its pool) when dropped.

    The block is freed in the order of the stream it was allocated on, after
    the work queued on any stream named by :meth:`record_stream`.
    """

    __slots__ = ("ptr", "nbytes", "device", "_stream", "_pool", "_used_on", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, device: int, stream: Any, pool: "MemPool | None"):
        self.ptr = ptr
        self.nbytes = nbytes
        self.device = device
        self._stream = stream  # the Stream it was allocated on; freed in its order
        self._pool = pool
        self._used_on: list = []  # other streams whose work must finish before the free

    def record_stream(self, stream: Any) -> None:
        """Free only after the work queued on ``stream`` by then (not just the allocating stream's)."""
        if stream != self._stream and all(s != stream for s in self._used_on):
            self._used_on.append(stream)

    def __del__(self) -> None:
        try:
            if self._pool is not None:
                self._pool._release(self.ptr, self.nbytes)
            else:
                _free_async(self.ptr, self.device, self._stream, tuple(self._used_on))
        except Exception:  # finalizers never raise
            pass

    @property
    def pool(self) -> "MemPool | None":
        """The graph pool this block came from, or ``None``."""
        return self._pool


def allocate(nbytes: int, stream: Any, pool: "MemPool | None" = None) -> Allocation:
    """Allocate ``nbytes`` of device memory for use on ``stream`` (a :class:`Stream`).

    With ``pool`` (a capture underway on ``stream``), the block comes from that
    graph pool; otherwise from the device's stream-ordered pool, in the order
    of ``stream``.
    """
    device = stream.device
    _driver.ensure_context(device)
    if pool is not None:
        return Allocation(pool._acquire(nbytes), nbytes, device, stream, pool)
    ptr = check(_driver.driver().cuMemAllocAsync(max(nbytes, 1), stream.handle), "cuMemAllocAsync")
    return Allocation(int(ptr), nbytes, device, stream, None)


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

    Parameters
    ----------
    device : int, optional
        The device whose memory it holds (default: the current device).

    Attributes
    ----------
    device : int
        The device ordinal.
    id : int
        The pool's number in this process, the ``id`` of its ``(0, id)`` handle.
    """

    _ids = itertools.count(1)

    def __init__(self, device: int | None = None):
        self.device = _driver.ensure_context(device)
        self.id = next(MemPool._ids)
        self._lock = threading.Lock()
        self._free: dict[int, list[int]] = {}   # rounded size -> free block addresses
        self._blocks: dict[int, int] = {}       # address -> rounded size (every block owned)
        self._holds = 0                         # conditional regions open in captures into this pool
        self._set_aside: list[int] = []         # blocks released while a region was open
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

    def token(self) -> tuple[int, int]:
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
            if size is None:
                return
            if self._holds:
                self._set_aside.append(ptr)
            else:
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


def hold_reuse(pool: MemPool) -> None:
    """A conditional region opened: blocks ``pool`` frees from now on wait until it closes.

    A WHILE body runs its nodes again after later ones: a block freed inside
    (or before) the loop and handed to a later allocation of the same body
    would be overwritten while an earlier node of the next trip still reads
    it. Freed blocks therefore return to the pool only once the outermost
    region has closed, after which every later node runs after the whole loop.
    """
    with pool._lock:
        pool._holds += 1


def release_reuse(pool: MemPool) -> None:
    """Undo one :func:`hold_reuse`; the last one returns the set-aside blocks to ``pool``."""
    with pool._lock:
        pool._holds -= 1
        if pool._holds == 0:
            for ptr in pool._set_aside:
                pool._free.setdefault(pool._blocks[ptr], []).append(ptr)
            pool._set_aside.clear()


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


def live_pool_ids() -> frozenset[int]:
    """The ids of the :class:`MemPool` objects alive now (``jaxgraph.diagnostics.live_pool_ids``)."""
    return frozenset(_pools.keys())


def graph_pool_handle(device: int | None = None) -> tuple[int, int]:
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
# Deferred frees
# ----------------------------------------------------------------------------

_frees_lock = threading.Lock()
_frees_held = 0   # captures underway: frees wait until the last one ends
_deferred_frees: list[tuple[int, int, Any, tuple]] = []
_deferred_calls: list[Any] = []  # when_no_capture
_gc_was_enabled = False  # whether the first hold_frees turned Python's collector off


def hold_frees() -> None:
    """Defer frees from now on (a capture began): freeing memory may synchronize the device.

    The first hold also turns Python's cyclic garbage collector off until the last release
    (see the module's docstring)."""
    global _frees_held, _gc_was_enabled
    with _frees_lock:
        _frees_held += 1
        if _frees_held == 1:
            _gc_was_enabled = gc.isenabled()
            gc.disable()


def release_frees() -> None:
    """Undo one :func:`hold_frees`; run the deferred frees when none is held any more."""
    global _frees_held
    with _frees_lock:
        _frees_held -= 1
        pending, calls = [], []
        if _frees_held == 0:
            pending, _deferred_frees[:] = list(_deferred_frees), []
            calls, _deferred_calls[:] = list(_deferred_calls), []
            if _gc_was_enabled:
                gc.enable()
    for ptr, device, s, used_on in pending:
        try:
            _free_async(ptr, device, s, used_on) if s is not None else _free_sync(ptr, device)
        except Exception:
            pass
    for fn in calls:
        try:
            fn()
        except Exception:  # releases run from finalizers: they never raise
            pass


def when_no_capture(fn: Any) -> None:
    """Call ``fn()`` now, or when the last capture underway ends.

    For releases that garbage collection may start in the middle of a capture
    (a collected graph's executable, a replayable's native entry): destroying
    an executable may synchronize, which would invalidate the capture.
    """
    with _frees_lock:
        if _frees_held:
            _deferred_calls.append(fn)
            return
    fn()


def _free_async(ptr: int, device: int, stream: Any, used_on: tuple = ()) -> None:
    """Free in ``stream``'s order, after the work already queued on each of ``used_on``."""
    with _frees_lock:
        if _frees_held:
            _deferred_frees.append((ptr, device, stream, used_on))
            return
    _driver.ensure_context(device)
    drv = _driver.driver()
    for other in used_on:
        # The allocating stream waits for the other's work so far: a later
        # allocation there that reuses the block cannot overtake that work.
        flags = drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        event = check(drv.cuEventCreate(flags), "cuEventCreate")
        try:
            check(drv.cuEventRecord(event, other.handle), "cuEventRecord")
            check(drv.cuStreamWaitEvent(stream.handle, event, 0), "cuStreamWaitEvent")
        finally:
            drv.cuEventDestroy(event)
    check(drv.cuMemFreeAsync(ptr, stream.handle), "cuMemFreeAsync")


def _free_sync(ptr: int, device: int) -> None:
    with _frees_lock:
        if _frees_held:
            _deferred_frees.append((ptr, device, None, ()))
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
