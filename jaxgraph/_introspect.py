"""Looking inside a captured graph: node lists, kernel names, edges and DOT dumps.

:meth:`CUDAGraph.get_graph_data` and :meth:`CUDAGraph.debug_dump` are thin
wrappers over the functions here, which walk a ``CUgraph`` template with raw
``cuda.bindings`` calls (cuda.core has no node introspection).

Node ids come from the driver where it can give them: ``cuGraphNodeGetToolsId``
and ``cuGraphExecGetId`` exist from CUDA 13.1. On an older driver the ids are
jaxgraph's own (the exec graph's instantiation serial and the node's index),
and the result says so in its ``"ids"`` entry.
"""

from __future__ import annotations

import os
from typing import Any

from . import _driver
from ._driver import check

__all__ = ["dump_dot", "graph_data", "node_count"]

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
# Graph data
# ----------------------------------------------------------------------------


def graph_data(h_graph: Any, h_graph_exec: Any, fallback_exec_id: int) -> dict:
    """Describe ``h_graph``'s nodes and edges, with ids remapped to ``h_graph_exec``.

    Returns the dictionary documented in :meth:`CUDAGraph.get_graph_data`.
    ``fallback_exec_id`` names the exec graph when the driver cannot.
    """
    drv = _driver.driver()
    nodes = _graph_nodes(h_graph)
    position = {int(node): i for i, node in enumerate(nodes)}
    driver_exec_id = _optional(drv, "cuGraphExecGetId", h_graph_exec)
    exec_id = int(driver_exec_id) if driver_exec_id is not None else int(fallback_exec_id)
    infos = [_node_info(drv, i, node, exec_id) for i, node in enumerate(nodes)]
    edges = []
    for src, dst in _graph_edges(h_graph):
        a, b = position.get(int(src)), position.get(int(dst))
        if a is None or b is None:
            continue
        infos[a]["dependents"].append(b)
        infos[b]["dependencies"].append(a)
        edges.append([a, b])
    return {
        "exec_graph_id": exec_id,
        "nodes": infos,
        "edges": edges,
        "ids": "driver" if driver_exec_id is not None else "jaxgraph",
    }


def dump_dot(h_graph: Any, path: Any, verbose: bool) -> None:
    """Write ``h_graph`` to ``path`` in Graphviz DOT format (``cuGraphDebugDotPrint``)."""
    drv = _driver.driver()
    flags = int(drv.CUgraphDebugDot_flags.CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE) if verbose else 0
    check(drv.cuGraphDebugDotPrint(h_graph, os.fsencode(os.fspath(path)), flags), "cuGraphDebugDotPrint")


def node_count(h_graph: Any) -> int:
    """Number of nodes in ``h_graph``."""
    result = check(_driver.driver().cuGraphGetNodes(h_graph, 0), "cuGraphGetNodes")
    return int(result[-1])


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


def _node_info(drv: Any, index: int, node: Any, exec_id: int) -> dict:
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
