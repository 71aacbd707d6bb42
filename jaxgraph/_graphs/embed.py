"""Embedding a captured graph in another capture: what ``CUDAGraph.replay()`` does while the stream captures.

CUDA cannot launch a graph into a capturing stream. So when the current
stream takes part in a jaxgraph capture (inside a conditional region too),
``replay()`` adds the graph's template to that capture as a child-graph
node instead: the node holds a copy of the template as it is at that moment,
and the capturing graph keeps the embedded graph's pools and inputs alive.
Replaying a captured step K times inside a WHILE body unrolls it K times
there, and one trip of the loop then runs all K. CUDA refuses a child graph
with conditional nodes (``CUDA_ERROR_NOT_SUPPORTED`` on the H100, driver 580),
so a graph with regions of its own cannot be embedded; the error says so.
"""

from __future__ import annotations

from typing import Any

from .._cuda import capture_registry as _captures, driver as _driver
from .conditional_nodes import add_node
from .._cuda.driver import CudaError
from .._cuda.stream import Stream

__all__ = ["embed"]


def embed(handles: Any, stream: Stream) -> None:
    """Add the graph held by ``handles`` (a ``GraphHandles``) as a child-graph node to the capture on ``stream``.

    Raises
    ------
    RuntimeError
        The graph holds no template, an input it watches was freed, or it has
        conditional nodes, which CUDA does not allow in a child graph.
    ValueError
        The graph and the capture are on different devices.
    """
    capture = _captures.capture_on(stream)
    template = handles.template
    if template is None:
        raise RuntimeError("replay: this CUDAGraph holds no captured graph to embed in the capture underway "
                           "on the current stream; capture it first")
    if handles.device != capture.stream.device:
        raise ValueError(f"replay: this graph was captured on device {handles.device}, the capture underway "
                         f"on the current stream is on device {capture.stream.device}")
    inputs = handles.inputs
    if inputs.watched:
        inputs.check_watched()
    drv = _driver.driver()
    _driver.ensure_context(handles.device)
    params = drv.CUgraphNodeParams()
    params.type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_GRAPH
    params.graph.graph = template
    try:
        add_node(stream, params)
    except CudaError as exc:
        if inputs.conditionals:
            raise RuntimeError(f"replay: this graph has conditional nodes, which CUDA does not allow in a child "
                               f"graph ({exc}); capture its regions directly into this capture instead") from exc
        raise
    # What keeps the embedded graph's addresses (and its kernels' code) valid now keeps this graph's too.
    watched = [ref() for *_, ref in inputs.watched]
    capture.retained += [*inputs.keep, *inputs.pools, *inputs.held, *(w for w in watched if w is not None)]
    capture.kernels.update(dict(inputs.kernels))
