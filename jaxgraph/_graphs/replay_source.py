"""What a captured graph hands to replay inside ``jax.jit``: :class:`ReplaySource`.

``_graphs.cuda_graph.replay_source(graph)`` makes one (``_jax_interop.replay_contract.source_of`` for a
:class:`~jaxgraph.Graph` too); ``_jax_interop/replayable.py`` and ``_jax_interop/replay_boundary.py``
register it in the native table.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .hooks import RemovableHandle

__all__ = ["ReplaySource"]


@dataclasses.dataclass(frozen=True)
class ReplaySource:
    """What a captured graph hands to replay inside ``jax.jit`` (``_graphs.cuda_graph.replay_source``).

    Attributes
    ----------
    template : int
        Address of the live ``cudaGraph_t`` (valid while the graph is not reset).
    device : int
        The device it was captured on.
    owners : tuple
        Pools, external inputs, and what the graph's nodes name (the
        :class:`~jaxgraph.Kernel` objects launched, events): hold them and
        every address, function and event in the graph stays valid.
    kernels : tuple of (int, str)
        The jaxgraph kernels it launches, by handle, with per-parameter flags
        (``r``: a pointer only read), so inputs are bound only where only read.
    on_destroy : callable
        ``register_destroy_callback`` of the graph: called when it is reset or collected.
    graph : CUDAGraph or None
        The graph itself. A replayable holds it, so the graph is collected (and
        its destroy callbacks fire) only once the replayable is gone; only an
        explicit :meth:`CUDAGraph.reset` retires the replayable earlier.
    bodies : tuple of int
        The ``CUgraph`` of every conditional-node body the capture made, nested
        ones too (``CaptureInputs.conditionals``), so replay inside jit can bind
        the kernels inside them on drivers that cannot list a node's bodies.
    exec : int
        Address of the graph's executable (0 if none): CUDA may allow only one
        executable of a graph with conditional nodes, and replay then shares it.
    """

    template: int
    device: int
    owners: tuple
    kernels: tuple
    on_destroy: Callable[[Callable[[], None]], RemovableHandle]
    graph: Any = None
    bodies: tuple = ()
    exec: int = 0
    lend_exec: Callable[[Any], None] | None = None
