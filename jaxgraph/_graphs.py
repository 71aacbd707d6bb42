"""CUDA graphs with PyTorch's API: :class:`CUDAGraph`, its lifecycle, pools and handles.

Capture records the work queued on a stream (our kernel launches, ``copy_``
and ``fill_``, allocations) into a CUDA graph instead of running it; a replay
runs all of it again with one ``cuGraphLaunch``. Memory allocated while
capturing comes from the graph's pool (:class:`~jaxgraph.MemPool`) and stays
valid while the graph lives. Graphs captured with the same pool token
(``pool=g1.pool()``) may reuse each other's memory, so they must be replayed
in the order they were captured. The capture contexts (``graph``, ``Graph``)
live in ``_capture.py``.
"""

from __future__ import annotations

import enum
import itertools
import threading
import warnings
from collections import OrderedDict
from typing import Any, Callable

from . import _driver, _introspect, _memory
from ._driver import CudaError, check
from ._hooks import RemovableHandle, fire_destroy_callbacks, register_hook, run_hooks
from ._memory import Allocation, CaptureTracker, MemPool, PoolHandle
from ._stream import Stream, current_stream

__all__ = ["CUDAGraph"]

# AUTO_FREE_ON_LAUNCH | USE_NODE_PRIORITY, as PyTorch instantiates its graphs.
_INSTANTIATE_FLAGS = 1 | 8

_CAPTURE_MODES = ("global", "thread_local", "relaxed")


class _CaptureState(enum.Enum):
    """Where a :class:`CUDAGraph` is in its capture lifecycle."""

    NOT_STARTED = "not started"
    CAPTURING = "capturing"
    ENDED = "ended"


# ----------------------------------------------------------------------------
# CUDAGraph
# ----------------------------------------------------------------------------


class CUDAGraph:
    """Wrapper around a CUDA graph, as ``torch.cuda.CUDAGraph``.

    Parameters
    ----------
    keep_graph : bool, optional
        If ``False`` (default), the ``cudaGraphExec_t`` is instantiated at the end
        of :meth:`capture_end` and the ``cudaGraph_t`` is no longer available
        (:meth:`raw_cuda_graph` raises). If ``True``, the ``cudaGraph_t`` stays
        available for inspection or editing, and the executable is made by an
        explicit :meth:`instantiate` (recommended: the first replay is then not
        slower) or by the first :meth:`replay`. After editing the raw graph,
        call :meth:`instantiate` again; jaxgraph cannot track the edits.

    Notes
    -----
    *Lifecycle.* NOT_STARTED, CAPTURING (between :meth:`capture_begin` and
    :meth:`capture_end`), ENDED; :meth:`reset` returns to NOT_STARTED.

    *The template after keep_graph=False.* PyTorch destroys the ``cudaGraph_t``
    once instantiated. jaxgraph keeps it *privately* (``_h_graph_private``):
    replay inside ``jax.jit`` splices the template into XLA's own command
    buffer as a child graph. The public behaviour is PyTorch's:
    :meth:`raw_cuda_graph`, :meth:`debug_dump` and :meth:`get_graph_data`
    raise once the public template is gone. :meth:`reset` destroys both.

    *Inputs.* Arrays the captured work uses that this capture did not allocate
    (*external inputs*) are kept alive by the graph, so no replay reads freed
    memory. With ``check_input_liveness=True`` they are watched instead, and
    :meth:`replay` raises naming the first one freed.

    .. warning:: This API is in beta and may change in future releases.

    Examples
    --------
    >>> g = jaxgraph.CUDAGraph()
    >>> with jaxgraph.graph(g):
    ...     add_one[blocks, 256](y, x, n)
    >>> g.replay()
    """

    def __init__(self, keep_graph: bool = False):
        self._keep_graph = bool(keep_graph)
        self._state = _CaptureState.NOT_STARTED
        self._h_graph = None            # CUgraph: the public template
        self._h_graph_private = None    # CUgraph: the template kept for splicing (see Notes)
        self._h_graph_exec = None       # CUgraphExec
        self._exec_serial = 0           # jaxgraph's id of the current exec graph
        self._device = _driver.current_device()
        self._stream: Stream | None = None
        self._thread = 0
        self._mode = "global"
        self._pool: MemPool | None = None
        self._retained_pools: list[MemPool] = []
        self._tracker: CaptureTracker | None = None
        self._check_liveness = False
        self._inputs: list = []         # owners of external inputs, kept alive
        self._watched: list = []        # (label, where, description, weakref) with check_input_liveness
        self._generators: list = []
        self._capture_end_hooks: OrderedDict = OrderedDict()
        self._post_instantiate_hooks: OrderedDict = OrderedDict()
        self._replay_start_hooks: OrderedDict = OrderedDict()
        self._replay_end_hooks: OrderedDict = OrderedDict()
        self._destroy_callbacks: OrderedDict = OrderedDict()

    def __repr__(self) -> str:
        return (f"<jaxgraph.CUDAGraph {self._state.value} device={self._device} "
                f"keep_graph={self._keep_graph} instantiated={self._h_graph_exec is not None}>")

    # -- capture ----------------------------------------------------------------

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global",
                      check_input_liveness: bool = False) -> None:
        """Begin capturing CUDA work on the current stream.

        Typically you don't call this yourself: :class:`~jaxgraph.graph` does.

        Parameters
        ----------
        pool : optional
            Token from :func:`~jaxgraph.graph_pool_handle` or another graph's
            :meth:`pool` (or a :class:`~jaxgraph.MemPool`) whose memory this
            graph may share. Default: a new private pool.
        capture_error_mode : {"global", "thread_local", "relaxed"}
            The ``cudaStreamCaptureMode``. Unsafe calls during capture (such as
            a synchronous ``cuMemAlloc``) fail in any thread under "global",
            only in this thread under "thread_local", nowhere under "relaxed".
        check_input_liveness : bool, optional
            Watch the capture's external inputs instead of keeping them alive;
            :meth:`replay` then raises if one was freed.

        Raises
        ------
        ValueError
            Unknown ``capture_error_mode``, or a pool of another device.
        TypeError
            ``pool`` is not a pool token.
        RuntimeError
            The graph already holds a capture (call :meth:`reset`), or the current
            stream is the legacy default stream or already capturing.
        """
        mode = _capture_mode(capture_error_mode)
        pool_obj = None if pool is None else _memory.pool_from_token(pool)
        if self._state is not _CaptureState.NOT_STARTED:
            raise RuntimeError(
                f"capture_begin: this CUDAGraph already holds a capture ({self._state.value}); "
                "call reset() before capturing again, or use a new CUDAGraph")
        CUDAGraph_capture_begin(self, current_stream(), pool_obj, mode, bool(check_input_liveness))

    def capture_end(self) -> None:
        """End CUDA graph capture on the current stream.

        Runs :meth:`capture_end_pre`, the capture-end hooks (the template is
        live in both ``keep_graph`` modes), :meth:`instantiate` if ``keep_graph``
        is ``False``, and :meth:`capture_end_post`. Then :meth:`replay` may be
        called. Raises :class:`~jaxgraph.CudaError` if the capture was
        invalidated; the graph is then reset and can capture again.
        """
        _require_capturing(self, "capture_end")
        CUDAGraph_capture_end_pre(self)
        run_hooks(self._capture_end_hooks, self)
        if not self._keep_graph:
            self.instantiate()
        self.capture_end_post()

    def capture_end_pre(self) -> None:
        """End capture but do not finalize: the ``cudaGraph_t`` stays live in both modes.

        With ``keep_graph=False``, call :meth:`instantiate` before :meth:`capture_end_post`.
        """
        _require_capturing(self, "capture_end_pre")
        CUDAGraph_capture_end_pre(self)

    def capture_end_post(self) -> None:
        """Finalize a capture ended by :meth:`capture_end_pre`.

        With ``keep_graph=False`` the graph must be instantiated; the public
        template is then gone (see the class Notes).
        """
        if self._state is not _CaptureState.ENDED:
            raise RuntimeError(f"capture_end_post: no capture has ended ({self._state.value}); "
                               "call capture_begin() and capture_end_pre() first")
        if self._keep_graph or self._h_graph is None:
            return
        if self._h_graph_exec is None:
            raise RuntimeError("capture_end_post: with keep_graph=False the graph must be instantiated "
                               "first: call instantiate() after capture_end_pre(), or use capture_end()")
        # Kept, not destroyed: replay inside jax.jit splices this template into XLA's graph.
        self._h_graph_private, self._h_graph = self._h_graph, None

    # -- instantiation and replay -----------------------------------------------

    def instantiate(self) -> None:
        """Instantiate the CUDA graph (again).

        Called by :meth:`capture_end` if ``keep_graph=False``, or by
        :meth:`replay` if ``keep_graph=True`` and it was not called already.
        Does not destroy the ``cudaGraph_t`` returned by :meth:`raw_cuda_graph`.
        A second call makes a fresh executable from the (possibly edited)
        template and destroys the previous one. Post-instantiate hooks run
        after each instantiation.

        Raises ``RuntimeError`` if nothing was captured yet, or if
        ``keep_graph=False`` (then :meth:`capture_end` instantiates).
        """
        _require_ended(self, "instantiate")
        if self._h_graph is None or (not self._keep_graph and self._h_graph_exec is not None):
            raise RuntimeError(
                "instantiate: with keep_graph=False the graph is instantiated by capture_end() and "
                "its cudaGraph_t is then gone; create the CUDAGraph with keep_graph=True to "
                "instantiate it by hand")
        CUDAGraph_instantiate(self)
        run_hooks(self._post_instantiate_hooks, self)

    def replay(self) -> None:
        """Replay the CUDA work captured by this graph, on the current stream.

        With ``keep_graph=True`` and no :meth:`instantiate` yet, instantiates
        first. Replay-start hooks run before the launch, replay-end hooks
        after it, even when the launch raises.

        Raises ``RuntimeError`` if nothing was captured, or (with
        ``check_input_liveness``) if an external input of the capture was freed.
        """
        h_exec = self._h_graph_exec
        if h_exec is None:
            h_exec = self._instantiate_for_replay()
        if self._watched:
            _memory.check_watched(self._watched)
        stream = current_stream(self._device)
        _driver.ensure_context(self._device)
        if self._replay_start_hooks:
            run_hooks(self._replay_start_hooks, self)
        try:
            err, = _driver.driver().cuGraphLaunch(h_exec, stream._h_stream)
        finally:
            if self._replay_end_hooks:
                run_hooks(self._replay_end_hooks, self)
        if err != 0:
            raise CudaError("cuGraphLaunch", err)

    def reset(self) -> None:
        """Delete the graph currently held by this instance.

        Ends a capture underway, fires the destroy callbacks, destroys the
        executable and templates and lets go of pools and inputs. Hooks stay.
        """
        if self._state is _CaptureState.CAPTURING:
            self._abort_capture()
        fire_destroy_callbacks(self._destroy_callbacks)
        CUDAGraph_release(self)

    # -- pools ------------------------------------------------------------------

    def pool(self) -> PoolHandle:
        """Return an opaque token naming this graph's memory pool.

        Pass it as ``pool=`` to another capture to let that graph share this
        graph's memory; the graphs must then be replayed in capture order.
        Raises ``RuntimeError`` before :meth:`capture_begin` and after :meth:`reset`.
        """
        if self._pool is None:
            raise RuntimeError("pool: this graph has no memory pool: it gets one at capture_begin(); "
                               "use jaxgraph.graph_pool_handle() for a token before capturing")
        return self._pool.token()

    def pools(self) -> list[PoolHandle]:
        """Return tokens for all memory pools this graph keeps alive (its own first)."""
        return [p.token() for p in self._retained_pools]

    # -- raw handles and introspection --------------------------------------------

    def raw_cuda_graph(self) -> int:
        """Return the underlying ``cudaGraph_t`` as an int address.

        The template must be live: ``keep_graph=True``, or a capture-end hook.

        .. caution:: A raw handle, valid until :meth:`reset`; wrap it with
           ``cuda.bindings.driver.CUgraph(address)``.
        """
        return int(self._live_template("raw_cuda_graph"))

    def raw_cuda_graph_exec(self) -> int:
        """Return the underlying ``cudaGraphExec_t`` as an int address.

        Needs :meth:`instantiate` (``keep_graph=True``) or :meth:`capture_end`.

        .. caution:: A raw handle, destroyed by the next :meth:`instantiate`;
           wrap it with ``cuda.bindings.driver.CUgraphExec(address)``.
        """
        if self._h_graph_exec is None:
            raise RuntimeError(f"raw_cuda_graph_exec: the graph is not instantiated ({self._state.value}); "
                               "call capture_end() (keep_graph=False) or instantiate() (keep_graph=True)")
        return int(self._h_graph_exec)

    def enable_debug_mode(self) -> None:
        """Retain the captured graph (as ``keep_graph=True``; call before :meth:`capture_end`)."""
        self._keep_graph = True

    def debug_dump(self, debug_path: Any, *, verbose: bool = True) -> None:
        """Dump the captured graph to ``debug_path`` in Graphviz DOT format.

        The template must be live: ``keep_graph=True`` (or
        :meth:`enable_debug_mode`), or a call from a capture-end hook.

        Parameters
        ----------
        debug_path : str or os.PathLike
        verbose : bool
            Use the driver's most verbose DOT output (default).
        """
        _introspect.dump_dot(self._live_template("debug_dump"), debug_path, bool(verbose))

    def get_graph_data(self) -> dict:
        """Return a dictionary describing the graph's topology and node metadata.

        The template must be live (``keep_graph=True``, or a post-instantiate
        hook) and the graph instantiated. The structure::

            {"exec_graph_id": int,
             "nodes": [{"index": int, "node_type": str, "tools_id": int, "graph_id": int,
                        "node_id": int, "kernel_name": str or None,
                        "grid": [x, y, z] or None, "block": [x, y, z] or None,
                        "dependencies": [int, ...], "dependents": [int, ...]}, ...],
             "edges": [[from_index, to_index], ...], "ids": "driver" or "jaxgraph"}

        Nodes are in creation order. ``graph_id`` is the exec graph's id, so
        ``tools_id`` (``graph_id << 32 | node_id``) matches what CUPTI-based
        profilers report. ``dependencies``/``dependents`` are indices into
        ``nodes``: they tell a true dependency from one a profile shows only
        because independent streams shared a hardware queue. ``"ids"`` is
        ``"jaxgraph"`` when the driver predates CUDA 13.1's id queries.
        """
        h_graph = self._live_template("get_graph_data")
        if self._h_graph_exec is None:
            raise RuntimeError("get_graph_data: the graph is not instantiated yet; call instantiate() first")
        _driver.ensure_context(self._device)
        return _introspect.graph_data(h_graph, self._h_graph_exec, self._exec_serial)

    # -- hooks ------------------------------------------------------------------

    def register_capture_end_hook(self, hook: Callable[["CUDAGraph"], None]) -> RemovableHandle:
        """Run ``hook(graph)`` when capture ends, before the graph is finalized.

        The ``cudaGraph_t`` is live (:meth:`raw_cuda_graph`) for both ``keep_graph``
        modes. Hooks fire in registration order; ``remove()`` on the handle deregisters.
        """
        return register_hook(self._capture_end_hooks, hook, "register_capture_end_hook")

    def register_post_instantiate_hook(self, hook: Callable[["CUDAGraph"], None]) -> RemovableHandle:
        """Run ``hook(graph)`` after each instantiation, re-instantiation included.

        The new executable is :meth:`raw_cuda_graph_exec`; hooks fire in registration order.
        """
        return register_hook(self._post_instantiate_hooks, hook, "register_post_instantiate_hook")

    def register_replay_start_hook(self, hook: Callable[["CUDAGraph"], None]) -> RemovableHandle:
        """Run ``hook(graph)`` at each :meth:`replay`, just before the launch."""
        return register_hook(self._replay_start_hooks, hook, "register_replay_start_hook")

    def register_replay_end_hook(self, hook: Callable[["CUDAGraph"], None]) -> RemovableHandle:
        """Run ``hook(graph)`` at each :meth:`replay`, after the launch, even when it raised."""
        return register_hook(self._replay_end_hooks, hook, "register_replay_end_hook")

    def register_destroy_callback(self, callback: Callable[[], None]) -> RemovableHandle:
        """Run ``callback()`` (no argument) when the captured graph is destroyed.

        That is at the next :meth:`reset` or when this object is collected,
        whichever comes first. Callbacks fire in registration order, each
        exactly once (register again after recapturing); one that raises is
        reported as a warning.
        """
        return register_hook(self._destroy_callbacks, callback, "register_destroy_callback")

    def register_generator_state(self, generator: Any) -> None:
        """Register a :class:`~jaxgraph.Generator` whose draws this graph captures.

        Generators keep seed and offset in device memory and advance the offset
        with a captured kernel, so every replay draws fresh numbers (they are
        graph-safe). Registering keeps the generator alive with this object.
        """
        from ._generator import Generator

        if not isinstance(generator, Generator):
            raise TypeError("register_generator_state expects a jaxgraph.Generator, "
                            f"got {type(generator).__name__}")
        if self._state is not _CaptureState.NOT_STARTED and generator.device != self._device:
            raise ValueError(f"register_generator_state: the generator is on device {generator.device}, "
                             f"the graph on device {self._device}")
        if not any(g is generator for g in self._generators):
            self._generators.append(generator)

    # -- for replay inside jax.jit ------------------------------------------------

    @property
    def device(self) -> int:
        """The device this graph was (or will be) captured on."""
        return self._device

    @property
    def _capture_stream(self) -> Stream | None:
        """The stream captured on, or ``None`` before capture."""
        return self._stream

    def _replay_template(self) -> int:
        """Address of the live ``cudaGraph_t`` (public or private) for splicing."""
        template = self._h_graph if self._h_graph is not None else self._h_graph_private
        if template is None or self._state is not _CaptureState.ENDED:
            raise RuntimeError(f"this CUDAGraph holds no captured graph ({self._state.value}); "
                               "capture it before replaying it inside jax.jit")
        return int(template)

    def _memory_owners(self) -> tuple:
        """Pool tokens and external inputs: what keeps this graph's memory valid (held by replayables)."""
        return tuple(self.pools()) + tuple(self._inputs)

    # -- internals --------------------------------------------------------------

    def _live_template(self, what: str) -> Any:
        if self._h_graph is not None:
            return self._h_graph
        _require_ended(self, what)
        raise RuntimeError(
            f"{what}: the graph's cudaGraph_t is not live: with keep_graph=False it is finalized at "
            "the end of capture_end(); use CUDAGraph(keep_graph=True) (or enable_debug_mode() "
            "before capture), or call it from a capture-end hook")

    def _instantiate_for_replay(self) -> Any:
        _require_ended(self, "replay")
        self.instantiate()
        return self._h_graph_exec

    def _abort_capture(self) -> None:
        """End a capture underway and discard it, leaving the graph recapturable; never raises."""
        if self._state is not _CaptureState.CAPTURING:
            return
        stream = self._stream
        try:
            _driver.ensure_context(stream.device)
            drv = _driver.driver()
            err, h_graph = drv.cuStreamEndCapture(stream.handle)[:2]
            if err == 0 and h_graph is not None and int(h_graph):
                drv.cuGraphDestroy(h_graph)
        except Exception:
            pass
        finally:
            _memory.end_capture_allocations(stream)
            _discard_capture(self)

    def __del__(self) -> None:
        try:
            if getattr(self, "_state", None) is None:
                return
            self._abort_capture()
            fire_destroy_callbacks(self._destroy_callbacks)
            CUDAGraph_release(self)
        except Exception:  # finalizers never raise
            pass


def CUDAGraph_capture_begin(self: CUDAGraph, stream: Stream, pool: MemPool | None, mode: str,
                            check_input_liveness: bool) -> None:
    """Start capturing on ``stream`` into ``pool`` (a new private pool when ``None``)."""
    if stream.is_legacy_default:
        raise RuntimeError(
            "CUDA graphs must be captured on a non-default stream. (However, after capture, it's ok "
            "to replay them on the default stream.) Make a jaxgraph.Stream() current, or use "
            "jaxgraph.graph(), which captures on a side stream")
    if _memory.capturing_on(stream):
        raise RuntimeError(f"capture_begin: {stream!r} is already capturing into another graph; "
                           "end that capture first")
    device = _driver.ensure_context(stream.device)
    if pool is None:
        pool = MemPool(device)
    elif pool.device != device:
        raise ValueError(f"capture_begin: pool {tuple(pool.token())} is on device {pool.device}, "
                         f"the capture stream on device {device}")
    tracker = CaptureTracker(pool)
    drv = _driver.driver()
    _memory.begin_capture_allocations(stream, tracker)
    try:
        enum_mode = getattr(drv.CUstreamCaptureMode, f"CU_STREAM_CAPTURE_MODE_{mode.upper()}")
        check(drv.cuStreamBeginCapture(stream.handle, enum_mode), "cuStreamBeginCapture")
    except BaseException:
        _memory.end_capture_allocations(stream)
        raise
    self._state = _CaptureState.CAPTURING
    self._stream, self._device, self._pool, self._tracker = stream, device, pool, tracker
    self._mode, self._check_liveness, self._thread = mode, check_input_liveness, threading.get_ident()


def CUDAGraph_capture_end_pre(self: CUDAGraph) -> None:
    """End the capture underway: keep the template, settle the inputs, warn if empty."""
    stream = self._stream
    if self._mode != "relaxed" and threading.get_ident() != self._thread:
        raise RuntimeError(f"capture_end: a capture begun with capture_error_mode={self._mode!r} must end "
                           "on the thread that began it; use 'relaxed' to end it from another thread")
    if current_stream(stream.device) != stream:
        raise RuntimeError(f"capture_end: capture must end on the same stream it began on ({stream!r}); "
                           "make it current again before ending the capture")
    _driver.ensure_context(stream.device)
    try:
        err, h_graph = _driver.driver().cuStreamEndCapture(stream.handle)[:2]
    finally:
        _memory.end_capture_allocations(stream)
    if err != 0 or h_graph is None or not int(h_graph):
        _discard_capture(self)
        raise CudaError("cuStreamEndCapture", err, "the capture was invalidated by work not permitted "
                        "while a stream captures (a synchronization, a synchronous copy or allocation, or "
                        "an unsafe call in another thread under capture_error_mode='global'); the graph "
                        "was reset and can be captured again")
    self._h_graph = h_graph
    self._state = _CaptureState.ENDED
    _settle_inputs(self)
    if _introspect.node_count(h_graph) == 0:
        warnings.warn("The CUDA Graph is empty. This usually means that the graph was attempted to be "
                      "captured on wrong device or stream.", UserWarning, stacklevel=4)


def CUDAGraph_instantiate(self: CUDAGraph) -> None:
    """Make a fresh executable from the public template, replacing any previous one."""
    _driver.ensure_context(self._device)
    drv = _driver.driver()
    h_exec = check(drv.cuGraphInstantiate(self._h_graph, _INSTANTIATE_FLAGS), "cuGraphInstantiate")
    previous, self._h_graph_exec = self._h_graph_exec, h_exec
    self._exec_serial = next(_exec_serials)
    if previous is not None:
        check(drv.cuGraphExecDestroy(previous), "cuGraphExecDestroy")


def CUDAGraph_release(self: CUDAGraph) -> None:
    """Destroy the executable and templates; drop pools, inputs and capture state."""
    handles = [(self._h_graph_exec, "cuGraphExecDestroy"), (self._h_graph, "cuGraphDestroy"),
               (self._h_graph_private, "cuGraphDestroy")]
    self._h_graph_exec = self._h_graph = self._h_graph_private = None
    _discard_capture(self)
    first_error = None
    for handle, call in handles:
        if handle is None:
            continue
        try:
            _driver.ensure_context(self._device)
            check(getattr(_driver.driver(), call)(handle), call)
        except Exception as exc:  # destroy everything, then report the first failure
            first_error = first_error or exc
    if first_error is not None:
        raise first_error


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------

_exec_serials = itertools.count(1)


def _capture_mode(mode: Any, valid: tuple = _CAPTURE_MODES) -> str:
    """Validate a ``capture_error_mode`` string (before any driver call)."""
    if mode not in valid:
        raise ValueError(f"capture_error_mode must be one of {', '.join(map(repr, valid))}, got {mode!r}")
    return mode


def _require_capturing(self: CUDAGraph, what: str) -> None:
    """Raise unless a capture is underway."""
    if self._state is not _CaptureState.CAPTURING:
        raise RuntimeError(f"{what}: no capture is underway ({self._state.value}); call capture_begin() first")


def _require_ended(self: CUDAGraph, what: str) -> None:
    """Raise unless a capture has ended, saying what to do in the current state."""
    if self._state is _CaptureState.CAPTURING:
        raise RuntimeError(f"{what}: the capture is still underway; call capture_end() first")
    if self._state is not _CaptureState.ENDED:
        raise RuntimeError(f"{what}: nothing has been captured yet; capture first with "
                           "jaxgraph.graph() or capture_begin()/capture_end()")


def _discard_capture(self: CUDAGraph) -> None:
    """Forget capture state, pools and inputs (handles are destroyed by the caller)."""
    self._state = _CaptureState.NOT_STARTED
    self._stream = self._pool = self._tracker = None
    self._retained_pools, self._inputs, self._watched = [], [], []


def _settle_inputs(self: CUDAGraph) -> None:
    """Keep the capture's external inputs alive, or watch them with ``check_input_liveness``."""
    tracker, self._tracker = self._tracker, None
    self._inputs, self._watched = tracker.settle(watch=self._check_liveness)
    pools = [self._pool]
    for owner in self._inputs:
        pool = owner.pool if isinstance(owner, Allocation) else None
        if pool is not None and all(p is not pool for p in pools):
            pools.append(pool)
    self._retained_pools = pools
