"""The driver handles of one captured graph, and their release.

A :class:`~jaxgraph.CUDAGraph` is a thin lifecycle over a :class:`GraphHandles`:
the templates (``CUgraph``), the executable (``CUgraphExec``), the capture
underway and what the captured graph holds on to (its pools and inputs).

The holder never refers to its CUDAGraph, so ``weakref.finalize`` can release
it after the graph object is gone, firing the destroy callbacks first, as
PyTorch retains its graph callbacks without the graph.
"""

from __future__ import annotations

import enum
import itertools
import weakref
from typing import Any

from . import _captures, _driver
from ._capture_record import Capture, CaptureInputs
from ._driver import check
from ._hooks import fire_destroy

__all__ = ["CaptureState", "GraphHandles", "instantiate_flags", "require_capturing", "require_ended"]


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


def instantiate_flags() -> int:
    """``AUTO_FREE_ON_LAUNCH | USE_NODE_PRIORITY``: how PyTorch instantiates its graphs."""
    flags = _driver.driver().CUgraphInstantiate_flags
    return int(flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) | int(
        flags.CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY)


class GraphHandles:
    """Owns one graph's handles; :meth:`release` destroys them (idempotent).

    Attributes
    ----------
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

    __slots__ = ("device", "graph", "private_graph", "graph_exec", "exec_address", "exec_serial", "capture",
                 "inputs", "borrowers")

    _serials = itertools.count(1)

    def __init__(self, device: int) -> None:
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

    def abort_capture(self) -> None:
        """End a capture underway and discard it; never raises."""
        capture, self.capture = self.capture, None
        if capture is not None:
            _captures.abort(capture)

    def release(self) -> None:
        """Destroy the executable and templates and drop inputs and pools.

        Destroys everything, then raises the first failure.
        """
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
