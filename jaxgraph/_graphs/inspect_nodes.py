"""Looking inside a captured graph: node lists, kernel names, edges, DOT dumps, summaries, pictures.

:meth:`CUDAGraph.get_graph_data` and :meth:`CUDAGraph.debug_dump` are thin
wrappers over the functions here, which walk a ``CUgraph`` template with raw
``cuda.bindings`` calls (cuda.core has no node introspection).
:meth:`CUDAGraph.summary`, :meth:`CUDAGraph.to_dot` and :meth:`CUDAGraph.render`
turn the same node list into text and pictures (``_graphs/inspect_render.py``).

Node ids come from the driver where it can give them: ``cuGraphNodeGetToolsId``
and ``cuGraphExecGetId`` exist from CUDA 13.1. On an older driver the ids are
jaxgraph's own (the exec graph's instantiation serial and the node's index),
and the result says so in its ``"ids"`` entry.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .._cuda import driver as _driver
from . import inspect_render as _views
from .._kernels.compile import kernel_display_name
from .._cuda.driver import check
from .handles import CaptureState, GraphHandles, node_count, require_ended

__all__ = ["GraphIntrospection", "dump_dot", "graph_data", "nested_node_count"]

_NODE_TYPE_NAMES = {
    "KERNEL": "kernel",
    "MEMCPY": "memcpy",
    "MEMSET": "memset",
    "HOST": "host",
    "GRAPH": "child_graph",
    "EMPTY": "empty",
    "WAIT_EVENT": "wait_event",
    "EVENT_RECORD": "event_record",
    "EXT_SEMAS_SIGNAL": "ext_semas_signal",
    "EXT_SEMAS_WAIT": "ext_semas_wait",
    "MEM_ALLOC": "mem_alloc",
    "MEM_FREE": "mem_free",
    "BATCH_MEM_OP": "batch_mem_op",
    "CONDITIONAL": "conditional",
}


# ----------------------------------------------------------------------------
# GraphIntrospection
# ----------------------------------------------------------------------------


class GraphIntrospection:
    """Raw handles and introspection of :class:`~jaxgraph.CUDAGraph` (which owns
    ``self._handles``, its state included, and ``self._keep_graph``)."""

    _handles: GraphHandles
    _keep_graph: bool

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
        if self._handles.graph_exec is None:
            raise RuntimeError(f"raw_cuda_graph_exec: the graph is not instantiated ({self._handles.state.value}); "
                               "call capture_end() (keep_graph=False) or instantiate() (keep_graph=True)")
        return int(self._handles.graph_exec)

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
        dump_dot(self._live_template("debug_dump"), debug_path, bool(verbose))

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

        A conditional node (``node_type`` ``"conditional"``, from
        :func:`~jaxgraph.if_then` and friends) also has ``"conditional":
        {"kind": "IF" | "WHILE" | "SWITCH", "bodies": [{"nodes": [...],
        "edges": [...]}, ...]}``: one entry per body (an IF/ELSE node is an IF
        with two), described like the graph itself, nested regions included.
        """
        h_graph = self._live_template("get_graph_data")
        h = self._handles
        if h.graph_exec is None:
            raise RuntimeError("get_graph_data: the graph is not instantiated yet; call instantiate() first")
        _driver.ensure_context(h.device)
        return graph_data(h_graph, h.graph_exec, h.exec_serial, h.inputs.conditionals)

    # -- summaries and pictures (jaxgraph's own; work after keep_graph=False too) --

    def summary(self) -> str:
        """A compact text summary of the captured graph; ``print(g)`` shows it too.

        Node counts by type, the dependencies and the longest chain of them,
        each kernel with its launch count, grid and block, the memory its pool
        holds and the external arrays it keeps alive. Unlike
        :meth:`get_graph_data` it needs no ``keep_graph=True``.
        """
        h = self._handles
        state = self._handles.state.value + (", instantiated" if h.graph_exec is not None else "")
        title = f"CUDAGraph on device {h.device} ({state}, keep_graph={self._keep_graph})"
        data = self._layout() if self._handles.state is CaptureState.ENDED else None
        return _views.summary_text(title, data, h.inputs.pools, len(h.inputs.keep) + len(h.inputs.watched),
                                         kernel_display_name)

    def to_dot(self) -> str:
        """Graphviz DOT text of the captured graph: each node labelled with its kernel's
        name, grid and block (or its type), each dependency an arrow.

        More compact than :meth:`debug_dump`'s driver output, and it needs no
        ``keep_graph=True``. Raises ``RuntimeError`` before a capture has ended.
        """
        require_ended(self._handles.state, "to_dot")
        h = self._handles
        data = self._layout()
        title = f"CUDAGraph on device {h.device}: {len(data['nodes'])} nodes"
        return _views.to_dot(data, title, kernel_display_name)

    def render(self, path: Any, format: str | None = None) -> Path:
        """Draw the captured graph (:meth:`to_dot`) to ``path``: ``.svg``, ``.png``, ``.pdf`` or ``.dot``.

        Pictures need Graphviz's ``dot`` program; without it this raises a
        ``RuntimeError`` saying how to install it (``.dot`` files need nothing).
        Returns the path written.
        """
        return _views.render_dot(self.to_dot(), path, format)

    def node_count(self, nested: bool = True) -> int:
        """Number of nodes in the captured graph.

        With ``nested`` (default), nodes inside conditional bodies count too, at
        every depth (a child-graph node counts as one). Needs no ``keep_graph=True``;
        raises ``RuntimeError`` before a capture has ended.
        """
        require_ended(self._handles.state, "node_count")
        if not nested:
            _driver.ensure_context(self._handles.device)
            return node_count(self._handles.template)
        return nested_node_count(self._layout())

    def __str__(self) -> str:
        try:
            return self.summary()
        except Exception as exc:  # printing never raises
            return f"{self!r} (no summary: {exc})"

    def _layout(self) -> dict:
        """``graph_data`` of the live template, public or private (the graph must be captured)."""
        h = self._handles
        _driver.ensure_context(h.device)
        return graph_data(h.template, h.graph_exec, h.exec_serial, h.inputs.conditionals)

    def _live_template(self, what: str) -> Any:
        if self._handles.graph is not None:
            return self._handles.graph
        require_ended(self._handles.state, what)
        raise RuntimeError(
            f"{what}: the graph's cudaGraph_t is not live: with keep_graph=False it is finalized at "
            "the end of capture_end(); use CUDAGraph(keep_graph=True) (or enable_debug_mode() "
            "before capture), or call it from a capture-end hook")


# ----------------------------------------------------------------------------
# Graph data
# ----------------------------------------------------------------------------


def graph_data(h_graph: Any, h_graph_exec: Any, fallback_exec_id: int, conditionals: tuple = ()) -> dict:
    """Describe ``h_graph``'s nodes and edges, with ids remapped to ``h_graph_exec``.

    Returns the dictionary documented in :meth:`CUDAGraph.get_graph_data`.
    ``fallback_exec_id`` names the exec graph when the driver cannot (or when
    ``h_graph_exec`` is ``None``: not instantiated yet). ``conditionals``
    (``CaptureInputs.conditionals``) says what jaxgraph knows of the graph's
    conditional nodes, for drivers that cannot describe them (before CUDA 13.2).
    """
    drv = _driver.driver()
    driver_exec_id = _optional(drv, "cuGraphExecGetId", h_graph_exec) if h_graph_exec is not None else None
    exec_id = int(driver_exec_id) if driver_exec_id is not None else int(fallback_exec_id)
    known = {node: (kind, bodies) for node, kind, bodies in conditionals}
    infos, edges = _describe(drv, h_graph, exec_id, known)
    return {
        "exec_graph_id": exec_id,
        "nodes": infos,
        "edges": edges,
        "ids": "driver" if driver_exec_id is not None else "jaxgraph",
    }


def nested_node_count(data: dict) -> int:
    """Nodes of a ``graph_data`` result, counting those in conditional bodies at every depth."""
    return sum(1 + sum(nested_node_count(body) for body in n["conditional"]["bodies"]) if "conditional" in n else 1
               for n in data["nodes"])


def dump_dot(h_graph: Any, path: Any, verbose: bool) -> None:
    """Write ``h_graph`` to ``path`` in Graphviz DOT format (``cuGraphDebugDotPrint``)."""
    drv = _driver.driver()
    flags = int(drv.CUgraphDebugDot_flags.CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE) if verbose else 0
    check(drv.cuGraphDebugDotPrint(h_graph, os.fsencode(os.fspath(path)), flags), "cuGraphDebugDotPrint")


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _graph_nodes(h_graph: Any) -> list:
    """The graph's nodes, in creation order."""
    count = node_count(h_graph)
    if count == 0:
        return []
    nodes, count = check(_driver.driver().cuGraphGetNodes(h_graph, count), "cuGraphGetNodes")
    return list(nodes)[: int(count)]


def _graph_edges(h_graph: Any) -> list:
    """``(from, to)`` node pairs: ``to`` depends on ``from``."""
    drv = _driver.driver()
    count = int(check(drv.cuGraphGetEdges(h_graph, 0), "cuGraphGetEdges")[-1])
    if count == 0:
        return []
    result = check(drv.cuGraphGetEdges(h_graph, count), "cuGraphGetEdges")
    sources, targets, count = result[0], result[1], int(result[-1])
    return list(zip(list(sources)[:count], list(targets)[:count]))


def _describe(drv: Any, h_graph: Any, exec_id: int, known: dict) -> tuple[list, list]:
    """``(nodes, edges)`` of one graph (a conditional node's bodies described inside its entry)."""
    nodes = _graph_nodes(h_graph)
    position = {int(node): i for i, node in enumerate(nodes)}
    infos = [_node_info(drv, i, node, exec_id, known) for i, node in enumerate(nodes)]
    edges = []
    for src, dst in _graph_edges(h_graph):
        a, b = position.get(int(src)), position.get(int(dst))
        if a is None or b is None:
            continue
        infos[a]["dependents"].append(b)
        infos[b]["dependencies"].append(a)
        edges.append([a, b])
    return infos, edges


def _conditional_info(drv: Any, node: Any, exec_id: int, known: dict) -> dict:
    """``{"kind": "IF"/"WHILE"/"SWITCH", "bodies": [{"nodes", "edges"}, ...]}`` of a conditional node."""
    kind, bodies = known.get(int(node), (None, ()))
    bodies = [drv.CUgraph(b) for b in bodies]
    if kind is None:  # not made by jaxgraph: ask the driver (CUDA 13.2 and newer can say)
        params = _optional(drv, "cuGraphNodeGetParams", node)
        if params is not None:
            cond = params.conditional
            kind = getattr(cond.type, "name", str(cond.type)).replace("CU_GRAPH_COND_TYPE_", "")
            bodies = list(cond.phGraph_out)[: int(cond.size)]
    described = [_describe(drv, body, exec_id, known) for body in bodies]
    return {"kind": kind, "bodies": [{"nodes": n, "edges": e} for n, e in described]}


def _node_info(drv: Any, index: int, node: Any, exec_id: int, known: dict) -> dict:
    """One entry of ``get_graph_data()["nodes"]``."""
    node_type = check(drv.cuGraphNodeGetType(node), "cuGraphNodeGetType")
    tools_id = _optional(drv, "cuGraphNodeGetToolsId", node)
    if tools_id is not None:
        local_id = int(tools_id) & 0xFFFFFFFF
    else:
        local = _optional(drv, "cuGraphNodeGetLocalId", node)
        local_id = int(local) if local is not None else index
    info = {
        "index": index,
        "node_type": _type_name(node_type),
        # Remapped to the exec graph, so ids match what CUPTI-based profilers report.
        "tools_id": (exec_id << 32) | local_id,
        "graph_id": exec_id,
        "node_id": local_id,
        "kernel_name": None,
        "grid": None,
        "block": None,
        "dependencies": [],
        "dependents": [],
    }
    if node_type == drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
        info["kernel_name"], info["grid"], info["block"] = _kernel_info(drv, node)
    elif node_type == drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL:
        info["conditional"] = _conditional_info(drv, node, exec_id, known)
    return info


def _type_name(node_type: Any) -> str:
    name = getattr(node_type, "name", str(node_type)).replace("CU_GRAPH_NODE_TYPE_", "")
    return _NODE_TYPE_NAMES.get(name, name.lower())


def _kernel_info(drv: Any, node: Any) -> tuple[str | None, list | None, list | None]:
    """A kernel node's function name, grid and block dimensions."""
    err, params = drv.cuGraphKernelNodeGetParams(node)[:2]
    if err != 0:
        # The generic query also covers kernels given as CUkernel handles.
        err, generic = drv.cuGraphNodeGetParams(node)[:2]
        if err != 0:
            return None, None, None
        params = generic.kernel
    grid = [int(params.gridDimX), int(params.gridDimY), int(params.gridDimZ)]
    block = [int(params.blockDimX), int(params.blockDimY), int(params.blockDimZ)]
    return _function_name(drv, params), grid, block


def _function_name(drv: Any, params: Any) -> str | None:
    """Name of the kernel a node launches: from ``func`` (a CUfunction) or ``kern`` (a CUkernel)."""
    func = getattr(params, "func", None)
    if func is not None and int(func):
        name = _optional(drv, "cuFuncGetName", func)
        if name is None:  # a CUkernel passed where a CUfunction goes
            name = _optional(drv, "cuKernelGetName", drv.CUkernel(int(func)))
        if name is not None:
            return name.decode() if isinstance(name, bytes) else str(name)
    kern = getattr(params, "kern", None)
    if kern is not None and int(kern):
        name = _optional(drv, "cuKernelGetName", kern)
        if name is not None:
            return name.decode() if isinstance(name, bytes) else str(name)
    return None


def _optional(drv: Any, name: str, *args: Any) -> Any:
    """``drv.<name>(*args)``'s value, or ``None`` where the driver lacks or refuses the call."""
    fn = getattr(drv, name, None)
    if fn is None:
        return None
    try:
        result = fn(*args)
    except Exception:  # cuda.bindings raises when the installed driver predates the call
        return None
    if result[0] != 0:
        return None
    return result[1]
