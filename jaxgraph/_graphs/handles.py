"""The driver handles of one captured graph: beginning and ending its capture, and their release.

A :class:`~jaxgraph.CUDAGraph` is a thin API over a :class:`GraphHandles`:
the capture state, the templates (``CUgraph``), the executable
(``CUgraphExec``), the capture underway and what the captured graph holds on
to (its pools and inputs). The handles begin, end and abandon the capture;
the graph checks its arguments and runs its hooks around them.

The holder never refers to its CUDAGraph, so ``weakref.finalize`` can release
it after the graph object is gone, firing the destroy callbacks first, as
PyTorch retains its graph callbacks without the graph.
"""

from __future__ import annotations

import enum
import itertools
import threading
import warnings
import weakref
from typing import Any

from .._cuda import capture_registry as _captures, driver as _driver
from . import conditional_nodes as _conditional
from .._cuda.capture_registry import Capture, CaptureInputs
from .._cuda.driver import check
from .hooks import fire_destroy
from .._cuda.memory import MemPool
from .._cuda.stream import Stream, current_stream

__all__ = ["CaptureState", "GraphHandles", "instantiate_flags", "node_count", "require_capturing", "require_ended"]


class CaptureState(enum.Enum):
    """Where a :class:`~jaxgraph.CUDAGraph` is in its capture lifecycle."""

    NOT_STARTED = "not started"
    CAPTURING = "capturing"
    ENDED = "ended"


def require_capturing(state: CaptureState, what: str) -> None:
    """Raise unless a capture is underway."""
    if state is not CaptureState.CAPTURING:
        raise RuntimeError(f"{what}: no capture is underway ({state.value}); call capture_begin() first")


def require_ended(state: CaptureState, what: str) -> None:
    """Raise unless a capture has ended, saying what to do in ``state``."""
    if state is CaptureState.CAPTURING:
        raise RuntimeError(f"{what}: the capture is still underway; call capture_end() first")
    if state is not CaptureState.ENDED:
        raise RuntimeError(f"{what}: nothing has been captured yet; capture first with "
                           "jaxgraph.graph() or capture_begin()/capture_end()")


def node_count(h_graph: Any) -> int:
    """Number of top-level nodes in the ``CUgraph`` ``h_graph``."""
    result = check(_driver.driver().cuGraphGetNodes(h_graph, 0), "cuGraphGetNodes")
    return int(result[-1])


def instantiate_flags() -> int:
    """``AUTO_FREE_ON_LAUNCH | USE_NODE_PRIORITY``: how PyTorch instantiates its graphs."""
    flags = _driver.driver().CUgraphInstantiate_flags
    return int(flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) | int(
        flags.CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY)


class GraphHandles:
    """Owns one graph's handles; :meth:`release` destroys them (idempotent).

    Attributes
    ----------
    state : CaptureState
        Where the graph is in its capture lifecycle.
    device : int
    graph : CUgraph or None
        The public template (``raw_cuda_graph``).
    private_graph : CUgraph or None
        The template kept after ``keep_graph=False`` finalizes the public one,
        so replay inside ``jax.jit`` can splice it into XLA's command buffer.
    graph_exec : CUgraphExec or None
    exec_address : int
        ``int(graph_exec)`` (0 when none): what the native launch takes.
    exec_serial : int
        jaxgraph's id of the current executable (for ``get_graph_data``).
    capture : Capture or None
        The capture underway, if any.
    inputs : CaptureInputs
        What the captured graph holds on to: external inputs and pools.
    borrowers : list of weakref
        Replayables (their states) that launch ``graph_exec`` itself: CUDA
        allows one executable of a graph with conditional nodes, so replay
        inside jit shares it, and it must not be replaced under them.
    """

    __slots__ = ("state", "device", "graph", "private_graph", "graph_exec", "exec_address", "exec_serial",
                 "capture", "inputs", "borrowers")

    _serials = itertools.count(1)

    def __init__(self, device: int) -> None:
        self.state = CaptureState.NOT_STARTED
        self.device = device
        self.graph = self.private_graph = self.graph_exec = None
        self.exec_address = 0  # int(graph_exec), for the native launch
        self.exec_serial = 0
        self.capture: Capture | None = None
        self.inputs = CaptureInputs()
        self.borrowers: list = []

    @property
    def template(self) -> Any:
        """The live template, public or private (``None`` if there is none)."""
        return self.graph if self.graph is not None else self.private_graph

    # -- capture ----------------------------------------------------------------

    def begin_capture(self, stream: Stream, pool: MemPool | None, mode: str, check_input_liveness: bool) -> None:
        """Start capturing on ``stream`` into ``pool`` (a new private pool when ``None``)."""
        if stream.is_legacy_default:
            raise RuntimeError(
                "CUDA graphs must be captured on a non-default stream. (However, after capture, it's ok "
                "to replay them on the default stream.) Make a jaxgraph.Stream() current, or use "
                "jaxgraph.graph(), which captures on a side stream")
        device = _driver.ensure_context(stream.device)
        if pool is None:
            pool = MemPool(device)
        elif pool.device != device:
            raise ValueError(f"capture_begin: pool {tuple(pool.token())} is on device {pool.device}, "
                             f"the capture stream on device {device}")
        capture = _captures.begin(stream, pool, mode, check_input_liveness)
        self.device = device
        self.capture = capture
        self.state = CaptureState.CAPTURING

    def end_capture(self) -> None:
        """End the capture underway: keep the template, settle the inputs, warn if empty."""
        capture = self.capture
        stream = capture.stream
        if capture.regions or capture.broken:
            problem = _conditional.unfinished(capture)
            self.abandon_capture()
            raise RuntimeError(f"capture_end: {problem}. The capture was discarded; the graph can capture again")
        if capture.mode != "relaxed" and threading.get_ident() != capture.thread:
            raise RuntimeError(f"capture_end: a capture begun with capture_error_mode={capture.mode!r} must end "
                               "on the thread that began it; use 'relaxed' to end it from another thread")
        if current_stream(stream.device) != stream:
            raise RuntimeError(f"capture_end: capture must end on the same stream it began on ({stream!r}); "
                               "make it current again before ending the capture")
        self.capture = None
        try:
            h_graph = _captures.end(capture)
        except Exception:  # invalidated or unjoined: the graph can capture again
            self.release()
            raise
        self.graph = h_graph
        self.inputs = capture.settle()
        self.state = CaptureState.ENDED
        if node_count(h_graph) == 0:
            warnings.warn("The CUDA Graph is empty. This usually means that the graph was attempted to be "
                          "captured on wrong device or stream.", UserWarning, stacklevel=4)

    def abandon_capture(self) -> None:
        """End a capture underway and discard it, leaving the graph able to capture again; never raises."""
        if self.state is CaptureState.CAPTURING:
            self.abort_capture()
            self.release()

    def abort_capture(self) -> None:
        """End a capture underway and discard it (the state stays as it is); never raises."""
        capture, self.capture = self.capture, None
        if capture is not None:
            _captures.abort(capture)

    # -- executable and release ---------------------------------------------------

    def instantiate(self) -> None:
        """Make a fresh executable from the public template, replacing any previous one."""
        if self.graph_exec is not None and any(getattr(r(), "alive", False) for r in self.borrowers):
            raise RuntimeError(
                "instantiate: a replayable launches this graph's executable itself (CUDA allows one "
                "executable of a graph with conditional nodes, so replay inside jax.jit shares it); "
                "close that replayable (step.close()) before instantiating again")
        _driver.ensure_context(self.device)
        drv = _driver.driver()
        err, h_exec = drv.cuGraphInstantiate(self.graph, instantiate_flags())
        if err == drv.CUresult.CUDA_ERROR_NOT_SUPPORTED and self.graph_exec is not None:
            # A graph with conditional nodes may have one executable at a time: the old one goes first.
            previous, self.graph_exec, self.exec_address = self.graph_exec, None, 0
            check(drv.cuGraphExecDestroy(previous), "cuGraphExecDestroy")
            err, h_exec = drv.cuGraphInstantiate(self.graph, instantiate_flags())
        h_exec = check((err, h_exec), "cuGraphInstantiate")
        previous, self.graph_exec = self.graph_exec, h_exec
        self.exec_address = int(h_exec)
        self.exec_serial = next(GraphHandles._serials)
        if previous is not None:
            check(drv.cuGraphExecDestroy(previous), "cuGraphExecDestroy")

    def lend_exec(self, state: Any) -> None:
        """Note that a replayable (its ``ReplayState``) launches ``graph_exec`` itself."""
        self.borrowers = [r for r in self.borrowers if r() is not None] + [weakref.ref(state)]

    def release(self) -> None:
        """Destroy the executable and templates and drop inputs and pools, back to ``NOT_STARTED``.

        Destroys everything, then raises the first failure.
        """
        self.state = CaptureState.NOT_STARTED
        handles = [(self.graph_exec, "cuGraphExecDestroy"), (self.graph, "cuGraphDestroy"),
                   (self.private_graph, "cuGraphDestroy")]
        self.graph_exec = self.graph = self.private_graph = None
        self.exec_address = 0
        self.inputs = CaptureInputs()
        first_error = None
        for handle, call in handles:
            if handle is None:
                continue
            try:
                _driver.ensure_context(self.device)
                check(getattr(_driver.driver(), call)(handle), call)
            except Exception as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def finalize(self, destroy_callbacks: Any) -> None:
        """The graph is gone: abort its capture, fire its destroy callbacks, release; never raises."""
        try:
            self.abort_capture()
            fire_destroy(destroy_callbacks)
            self.release()
        except Exception:  # finalizers never raise
            pass
