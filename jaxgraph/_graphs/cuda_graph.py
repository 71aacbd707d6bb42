"""CUDA graphs with PyTorch's API: :class:`CUDAGraph`, its lifecycle, pools and handles.

Capture records the work queued on a stream (our kernel launches, ``copy_``
and ``fill_``, allocations) into a CUDA graph instead of running it; a replay
runs all of it again with one ``cuGraphLaunch``. Memory allocated while
capturing comes from the graph's pool (:class:`~jaxgraph.MemPool`) and stays
valid while the graph lives. Graphs captured with the same pool token
(``pool=g1.pool()``) may reuse each other's memory, so they must be replayed
in the order they were captured. The capture contexts (``graph``, ``Graph``)
live in ``_graphs/capture_contexts.py``.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Protocol, runtime_checkable

from .._cuda import capture_registry as _captures, driver as _driver, memory as _memory
from . import embed as _embed
from .._cuda.checks import capture_mode
from .._cuda.driver import CudaError
from .handles import CaptureState, GraphHandles, require_capturing, require_ended
from .hooks import GraphHookMethods, GraphHooks, fire_destroy
from .inspect_nodes import GraphIntrospection
from .._cuda.native import native
from .conditional_regions import ConditionalMethods
from .replay_source import ReplaySource
from .._cuda.stream import current_stream

__all__ = ["CUDAGraph", "GraphSafeGenerator", "handles_of", "replay_source"]


# ----------------------------------------------------------------------------
# CUDAGraph
# ----------------------------------------------------------------------------


class CUDAGraph(GraphHookMethods, GraphIntrospection, ConditionalMethods):
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
    once instantiated. jaxgraph keeps it *privately*: replay inside
    ``jax.jit`` reads it (a clone, or for a graph with conditional nodes the
    template itself), to rebind its kernels to XLA's buffers and to add its
    nodes to XLA's own command buffer. The public behaviour is PyTorch's:
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
        if not isinstance(keep_graph, bool):
            raise TypeError(f"keep_graph must be a bool, got {type(keep_graph).__name__} {keep_graph!r}")
        self._keep_graph = keep_graph
        self._handles = GraphHandles(_driver.current_device())
        self._hooks = GraphHooks()
        self._generators: list[GraphSafeGenerator] = []
        # Releases the handles when this object goes, without referring to it.
        # Collected in the middle of another graph's capture: released when it ends.
        self._finalizer = weakref.finalize(self, _memory.when_no_capture,
                                           functools.partial(self._handles.finalize, self._hooks.destroy))

    def __repr__(self) -> str:
        return (f"<jaxgraph.CUDAGraph {self._handles.state.value} device={self.device} "
                f"keep_graph={self._keep_graph} instantiated={self._handles.graph_exec is not None}>")

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
            Unknown ``capture_error_mode``, a pool of another device, or a
            pool token whose pool no longer exists.
        TypeError
            ``pool`` is not a pool token.
        RuntimeError
            The graph already holds a capture (call :meth:`reset`), or the current
            stream is the legacy default stream or already capturing.
        """
        mode = capture_mode(capture_error_mode)
        pool_obj = None if pool is None else _memory.pool_from_token(pool)
        if self._handles.state is not CaptureState.NOT_STARTED:
            raise RuntimeError(
                f"capture_begin: this CUDAGraph already holds a capture ({self._handles.state.value}); "
                "call reset() before capturing again, or use a new CUDAGraph")
        self._handles.begin_capture(current_stream(), pool_obj, mode, bool(check_input_liveness))

    def capture_end(self) -> None:
        """End CUDA graph capture on the current stream.

        Runs :meth:`capture_end_pre`, the capture-end hooks (the template is
        live in both ``keep_graph`` modes), :meth:`instantiate` if ``keep_graph``
        is ``False``, and :meth:`capture_end_post`. Then :meth:`replay` may be
        called. Raises :class:`~jaxgraph.CudaError` if the capture was
        invalidated; the graph is then reset and can capture again.

        Raises ``RuntimeError``, leaving the capture underway, when called on
        another stream than the capture's or (unless ``"relaxed"``) from
        another thread: make the capture stream current and call it again,
        or :meth:`reset` to discard the capture. :class:`~jaxgraph.graph`
        and :class:`~jaxgraph.Graph` discard it themselves.
        """
        require_capturing(self._handles.state, "capture_end")
        self._handles.end_capture()
        self._hooks.run("capture_end", self)
        if not self._keep_graph:
            self.instantiate()
        self.capture_end_post()

    def capture_end_pre(self) -> None:
        """End capture but do not finalize: the ``cudaGraph_t`` stays live in both modes.

        With ``keep_graph=False``, call :meth:`instantiate` before :meth:`capture_end_post`.
        """
        require_capturing(self._handles.state, "capture_end_pre")
        self._handles.end_capture()

    def capture_end_post(self) -> None:
        """Finalize a capture ended by :meth:`capture_end_pre`.

        With ``keep_graph=False`` the graph must be instantiated; the public
        template is then gone (see the class Notes).
        """
        if self._handles.state is not CaptureState.ENDED:
            raise RuntimeError(f"capture_end_post: no capture has ended ({self._handles.state.value}); "
                               "call capture_begin() and capture_end_pre() first")
        h = self._handles
        if self._keep_graph or h.graph is None:
            return
        if h.graph_exec is None:
            raise RuntimeError("capture_end_post: with keep_graph=False the graph must be instantiated "
                               "first: call instantiate() after capture_end_pre(), or use capture_end()")
        # Kept, not destroyed: replay inside jax.jit splices this template into XLA's graph.
        h.private_graph, h.graph = h.graph, None

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
        require_ended(self._handles.state, "instantiate")
        h = self._handles
        if h.graph is None or (not self._keep_graph and h.graph_exec is not None):
            raise RuntimeError(
                "instantiate: with keep_graph=False the graph is instantiated by capture_end() and "
                "its cudaGraph_t is then gone; create the CUDAGraph with keep_graph=True to "
                "instantiate it by hand")
        h.instantiate()
        self._hooks.run("post_instantiate", self)

    def replay(self) -> None:
        """Replay the CUDA work captured by this graph, on the current stream.

        With ``keep_graph=True`` and no :meth:`instantiate` yet, instantiates
        first. Replay-start hooks run before the launch, replay-end hooks
        after it, even when the launch raises.

        While the current stream captures, it embeds a copy of this graph there
        as a child-graph node instead (no hooks run; "Embedding" in the guide's
        branches-and-loops page). A graph with conditional nodes cannot be embedded:
        CUDA refuses them in child graphs, and this raises ``RuntimeError`` saying so.

        Raises ``RuntimeError`` if nothing was captured, or (with
        ``check_input_liveness``) if an external input of the capture was freed.
        """
        h = self._handles
        if _captures.any_underway() and _captures.capture_on(current_stream(h.device)) is not None:
            require_ended(self._handles.state, "replay")
            return _embed.embed(h, current_stream(h.device))
        if h.graph_exec is None:
            require_ended(self._handles.state, "replay")
            self.instantiate()
        if h.inputs.watched:
            h.inputs.check_watched()
        stream = current_stream(h.device)
        _driver.ensure_context(h.device)
        hooks = self._hooks
        if hooks.replay_start:
            hooks.run("replay_start", self)
        try:
            # The native entry point, not cuda.bindings': at one kernel per graph the
            # handle objects' marshalling was a fifth of a replay's host time.
            err = _graph_launch()(h.exec_address, int(stream))
        finally:
            if hooks.replay_end:
                hooks.run("replay_end", self)
        if err != 0:
            raise CudaError("cuGraphLaunch", _driver.driver().CUresult(err))

    def reset(self) -> None:
        """Delete the graph currently held by this instance.

        Ends a capture underway, fires the destroy callbacks, destroys the
        executable and templates and lets go of pools and inputs. Hooks stay.
        """
        self._handles.abort_capture()
        fire_destroy(self._hooks.destroy)
        self._handles.release()

    # -- pools ------------------------------------------------------------------

    def pool(self) -> tuple[int, int]:
        """Return an opaque token naming this graph's memory pool.

        Pass it as ``pool=`` to another capture to let that graph share this
        graph's memory; the graphs must then be replayed in capture order.
        Raises ``RuntimeError`` before :meth:`capture_begin` and after :meth:`reset`.
        """
        pools = self._handles.inputs.pools
        capture = self._handles.capture
        pool = capture.pool if capture is not None else (pools[0] if pools else None)
        if pool is None:
            raise RuntimeError("pool: this graph has no memory pool: it gets one at capture_begin(); "
                               "use jaxgraph.graph_pool_handle() for a token before capturing")
        return pool.token()

    def pools(self) -> list[tuple[int, int]]:
        """Return tokens for all memory pools this graph keeps alive (its own first)."""
        return [p.token() for p in self._handles.inputs.pools]

    # -- generators -------------------------------------------------------------

    def register_generator_state(self, generator: Any) -> None:
        """Register a :class:`~jaxgraph.Generator` whose draws this graph captures.

        Generators keep seed and offset in device memory and advance the offset
        with a captured kernel, so every replay draws fresh numbers (they are
        graph-safe). Registering keeps the generator alive with this object.
        Any object with the same state hooks (``device``, ``state``,
        ``get_state``, ``set_state``) is accepted too.
        """
        if not isinstance(generator, GraphSafeGenerator):
            raise TypeError("register_generator_state expects a jaxgraph.Generator, "
                            f"got {type(generator).__name__} (it has no device, state, get_state and set_state)")
        if self._handles.state is not CaptureState.NOT_STARTED and generator.device != self.device:
            raise ValueError(f"register_generator_state: the generator is on device {generator.device}, "
                             f"the graph on device {self.device}")
        if not any(g is generator for g in self._generators):
            self._generators.append(generator)

    # -- device -------------------------------------------------------------------

    @property
    def device(self) -> int:
        """The device this graph was (or will be) captured on."""
        return self._handles.device


# ----------------------------------------------------------------------------
# GraphSafeGenerator
# ----------------------------------------------------------------------------


@runtime_checkable
class GraphSafeGenerator(Protocol):
    """What :meth:`CUDAGraph.register_generator_state` accepts: a generator whose state lives on the device.

    :class:`~jaxgraph.Generator` is one: its draws read ``state`` (a device
    array) and advance it with a captured kernel, so replays draw fresh
    numbers; ``get_state`` and ``set_state`` copy it to and from the host.
    """

    @property
    def device(self) -> int: ...

    @property
    def state(self) -> Any: ...

    def get_state(self) -> Any: ...

    def set_state(self, state: Any) -> Any: ...


# ----------------------------------------------------------------------------
# For the other jaxgraph modules
# ----------------------------------------------------------------------------


def handles_of(graph: CUDAGraph) -> GraphHandles:
    """``graph``'s driver handles and capture state (for jaxgraph's own modules, never users)."""
    return graph._handles


def replay_source(graph: CUDAGraph) -> ReplaySource:
    """What replay inside ``jax.jit`` needs of ``graph``: the live template, the device, what keeps memory valid."""
    h = graph._handles
    template = h.template
    if template is None or h.state is not CaptureState.ENDED:
        raise RuntimeError(f"this CUDAGraph holds no captured graph ({h.state.value}); "
                           "capture it before replaying it inside jax.jit")
    bodies = tuple(b for _, _, node_bodies in h.inputs.conditionals for b in node_bodies)
    return ReplaySource(int(template), h.device, h.inputs.pools + h.inputs.keep + h.inputs.held,
                        h.inputs.kernels, graph.register_destroy_callback, graph, bodies=bodies, exec=h.exec_address,
                        lend_exec=h.lend_exec)


def _graph_launch() -> Callable[[int, int], int]:
    """The native ``cuGraphLaunch(exec, stream)`` (loaded on first replay, not at import)."""
    global _native_graph_launch
    if _native_graph_launch is None:
        _native_graph_launch = native("launch").graph_launch
    return _native_graph_launch


_native_graph_launch: Callable[[int, int], int] | None = None
