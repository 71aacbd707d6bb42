"""The record of one capture: what its work used, and what the captured graph must hold.

A :class:`Capture` is made by ``_cuda.captures.begin`` and fed while the capture
runs (operands, kernels, conditional nodes, embedded graphs); when it ends,
:meth:`Capture.settle` turns it into the graph's :class:`CaptureInputs`:
external inputs kept alive (or watched), pools, kernels and what its nodes
name. ``_cuda/captures.py`` keeps the registry of captures underway.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any, Iterable

from . import memory as _memory
from .memory import Allocation, MemPool

__all__ = ["Capture", "CaptureInputs"]


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
        Conditional regions open now, innermost last (``_graphs.conditional.Region``).
    conditionals : list of (int, str, tuple)
        Every conditional node added: its address, kind and body graphs' addresses.
    retained : list
        Owners kept for embedded graphs (their pools and inputs).
    broken : str or None
        Why the capture can no longer end well (an exception escaped a region).
    """

    __slots__ = ("stream", "capture_id", "streams", "pool", "mode", "thread", "watch", "operands", "kernels",
                 "held", "regions", "conditionals", "retained", "broken", "_allocated", "_seen")

    def __init__(self, stream: Any, pool: MemPool, mode: str, watch: bool) -> None:
        self.stream = stream
        self.capture_id = 0
        self.streams = {(int(stream), stream.device)}  # as _captures keys streams
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
        self._allocated: "weakref.WeakSet[Allocation]" = weakref.WeakSet()
        self._seen: set[int] = set()   # id() of each recorded owner (kept alive by operands)

    def allocate(self, nbytes: int, stream: Any) -> Allocation:
        """A block of the capture's pool; it lives as long as the pool, so it is no external input."""
        alloc = _memory.allocate(nbytes, stream, self.pool)
        self._allocated.add(alloc)
        return alloc

    def note(self, label: str, where: str, array: Any) -> None:
        """Record ``array`` (a DeviceArray) unless this capture allocated it or it is recorded."""
        owner = array.owner
        if isinstance(owner, Allocation) and owner in self._allocated:
            return  # lives in the graph's pool: valid as long as the graph
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
                             tuple(self.held.values()), tuple(self.conditionals))


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
    """

    keep: tuple = ()
    watched: tuple = ()
    pools: tuple = ()
    kernels: tuple = ()
    held: tuple = ()
    conditionals: tuple = ()

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
