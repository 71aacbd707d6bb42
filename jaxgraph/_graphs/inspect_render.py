"""Seeing a captured graph: a text summary, Graphviz DOT text, and pictures rendered from it.

Everything here works on the node list that ``_graphs.inspect_nodes.graph_data`` reads
from the driver (``{"nodes": [...], "edges": [...]}``), so it needs no GPU
and is tested on the CPU with made-up graphs. :meth:`CUDAGraph.summary`,
:meth:`CUDAGraph.to_dot` and :meth:`CUDAGraph.render` call it.

Pictures need Graphviz's ``dot`` program (the ``graphviz`` Python package
needs the same program); without it, :func:`render_dot` says so and how to
get it, and ``.dot`` files are still written.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["all_nodes", "longest_chain", "region_label", "render_dot", "summary_text", "to_dot"]

# Fill colours by node type (kernels blue, copies orange, memsets green, memory nodes grey).
_COLORS = {"kernel": "#d6e6f5", "memcpy": "#fbe3c4", "memset": "#dcefd0", "mem_alloc": "#e6e6e6",
           "mem_free": "#e6e6e6", "child_graph": "#eadcf2", "host": "#f6d6d6", "conditional": "#fff0b3"}


def _same(name: str | None) -> str | None:
    return name


# ----------------------------------------------------------------------------
# Text
# ----------------------------------------------------------------------------


def summary_text(title: str, data: dict | None, pools: Sequence[Any] = (), external_inputs: int = 0,
                 names: Callable[[str | None], str | None] = _same) -> str:
    """A few lines about a graph: node counts by type, kernels, dependencies, memory.

    Parameters
    ----------
    title : str
        The first line (what the graph is, its state).
    data : dict or None
        ``graph_data``'s result; ``None`` when nothing is captured.
    pools : sequence of MemPool
        The graph's own pool first, then pools its inputs came from.
    external_inputs : int
        Arrays the graph keeps alive (or watches) because its work uses them.
    names : callable
        Maps a kernel's symbol to the name to show (e.g. ``axpy<float>``).
    """
    lines = [title]
    if data is None:
        return lines[0] + ": nothing captured"
    nodes, edges = data["nodes"], data["edges"]
    types = collections.Counter(n["node_type"] for n in nodes)
    counts = ", ".join(f"{c} {t}" for t, c in types.most_common())
    lines.append(f"  {len(nodes)} nodes ({counts or 'none'}), {len(edges)} dependencies, "
                 f"longest chain {longest_chain(len(nodes), edges)} nodes")
    if any("conditional" in n for n in nodes):
        lines.append("  conditional regions (node, kind: bodies):")
        lines += _region_lines(nodes, "    ")
    kernels = collections.Counter(
        (_short(names(n["kernel_name"]) or "<unnamed>"), _dims(n["grid"]), _dims(n["block"]))
        for n in all_nodes(nodes) if n["node_type"] == "kernel")
    if kernels:
        width = max(len(name) for name, _, _ in kernels)
        where = ", in the graph and its bodies" if len(list(all_nodes(nodes))) > len(nodes) else ""
        lines.append(f"  kernels (launches x name, grid, block{where}):")
        lines += [f"    {c:>5} x {name:<{width}}  grid {grid}, block {block}"
                  for (name, grid, block), c in kernels.items()]
    for i, pool in enumerate(pools):
        whose = "its pool" if i == 0 else "an input's pool"
        lines.append(f"  memory: {whose} {tuple(pool.token())} holds {_bytes(pool.reserved_bytes)} "
                     f"({_bytes(pool.free_bytes)} free for later captures into it)")
    if external_inputs:
        lines.append(f"  keeps {external_inputs} external input array{'s' if external_inputs != 1 else ''} alive")
    return "\n".join(lines)


def to_dot(data: dict, title: str = "CUDA graph", names: Callable[[str | None], str | None] = _same) -> str:
    """Graphviz DOT text: one box per node (kernel name, grid and block), one arrow per dependency."""
    lines = [
        "digraph jaxgraph {",
        f'  graph [label="{_escape(title)}", labelloc=t, fontname="Helvetica", rankdir=TB];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
        '  edge [color="#555555"];',
    ]
    _dot_graph(data["nodes"], data["edges"], "", names, lines, "  ")
    lines.append("}")
    return "\n".join(lines) + "\n"


def all_nodes(nodes: Sequence[dict]) -> Any:
    """Every node of a node list and of its conditional bodies, at every depth."""
    for n in nodes:
        yield n
        for body in n.get("conditional", {}).get("bodies", ()):
            yield from all_nodes(body["nodes"])


def region_label(conditional: dict) -> str:
    """``"WHILE"``, ``"IF"``, ``"IF/ELSE"``, ``"SWITCH of 3 cases"`` for a node's ``"conditional"`` entry."""
    kind, count = conditional.get("kind") or "conditional", len(conditional.get("bodies", ()))
    if kind == "IF" and count == 2:
        return "IF/ELSE"
    return f"SWITCH of {count} cases" if kind == "SWITCH" else kind


def longest_chain(count: int, edges: Sequence[Sequence[int]]) -> int:
    """Nodes on the longest dependency path of a DAG of ``count`` nodes (0 for an empty graph)."""
    depth = [1] * count
    after = collections.defaultdict(list)
    waiting = [0] * count
    for a, b in edges:
        after[a].append(b)
        waiting[b] += 1
    ready = [i for i in range(count) if waiting[i] == 0]
    while ready:
        a = ready.pop()
        for b in after[a]:
            depth[b] = max(depth[b], depth[a] + 1)
            waiting[b] -= 1
            if waiting[b] == 0:
                ready.append(b)
    return max(depth, default=0)


# ----------------------------------------------------------------------------
# Pictures
# ----------------------------------------------------------------------------


def render_dot(dot: str, path: Any, format: str | None = None) -> Path:
    """Write ``dot`` to ``path``: as DOT text (``.dot``, ``.gv``) or rendered by Graphviz (``.svg``, ``.png``, ...).

    Parameters
    ----------
    dot : str
        Graphviz DOT text (:func:`to_dot`).
    path : str or os.PathLike
        Where to write. Its suffix says the format unless ``format`` does.
    format : str, optional
        A Graphviz output format (``"svg"``, ``"png"``, ``"pdf"``) or ``"dot"``.

    Returns
    -------
    pathlib.Path
        The path written.

    Raises
    ------
    ValueError
        No format: neither ``format`` nor a suffix.
    RuntimeError
        Graphviz's ``dot`` program is not installed, or it failed.
    """
    path = Path(path)
    fmt = (format or path.suffix.lstrip(".")).lower()
    if not fmt:
        raise ValueError(f"render: say format= or give the path a suffix (.svg, .png, .pdf or .dot), got {str(path)!r}")
    if fmt in ("dot", "gv"):
        path.write_text(dot)
        return path
    program = shutil.which("dot")
    if program is None:
        raise RuntimeError(
            f"render: drawing a {fmt} needs Graphviz's `dot` program, which is not installed here (not on "
            "PATH). Install Graphviz (apt-get install graphviz, brew install graphviz or conda install "
            "graphviz; the `graphviz` Python package needs the same program), or write the DOT text with "
            "render('graph.dot') or to_dot() and draw it elsewhere, e.g. `dot -Tsvg graph.dot -o graph.svg`")
    try:
        done = subprocess.run([program, f"-T{fmt}", "-o", str(path)], input=dot.encode(), capture_output=True,
                              timeout=300)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"render: Graphviz's dot took more than 300 s to draw {path}") from None
    if done.returncode != 0:
        raise RuntimeError(f"render: Graphviz's dot could not draw {fmt} (exit {done.returncode}): "
                           f"{done.stderr.decode(errors='replace').strip()}")
    return path


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _body_names(conditional: dict) -> list[str]:
    count = len(conditional.get("bodies", ()))
    if conditional.get("kind") == "SWITCH":
        return [f"case {i}" for i in range(count)]
    if count == 2:
        return ["then", "else"]
    return ["body"] * count


def _region_lines(nodes: Sequence[dict], indent: str) -> list[str]:
    """One line per conditional node, its bodies' contents, nested regions indented below."""
    lines = []
    for n in nodes:
        cond = n.get("conditional")
        if cond is None:
            continue
        parts = []
        for name, body in zip(_body_names(cond), cond["bodies"]):
            types = collections.Counter(b["node_type"] for b in body["nodes"])
            count = len(body["nodes"])
            inside = f" ({', '.join(f'{c} {t}' for t, c in types.most_common())})" if count else ""
            parts.append(f"{name} {count} node{'s' if count != 1 else ''}{inside}")
        lines.append(f"{indent}#{n['index']} {region_label(cond)}: {'; '.join(parts) or 'no bodies'}")
        for body in cond["bodies"]:
            lines += _region_lines(body["nodes"], indent + "  ")
    return lines


def _dot_graph(nodes: Sequence[dict], edges: Sequence, prefix: str, names: Callable, lines: list,
               indent: str) -> None:
    """DOT statements for one graph; each conditional body becomes a dashed cluster beside its node."""
    for n in nodes:
        kind, ident = n["node_type"], f"{prefix}n{n['index']}"
        if kind == "kernel":
            name = _short(names(n["kernel_name"]) or "<unnamed kernel>")
            label = f"{name}\\ngrid {_dims(n['grid'])}, block {_dims(n['block'])}"
        elif "conditional" in n:
            label = region_label(n["conditional"])
        else:
            label = kind.replace("_", " ")
        color = _COLORS.get(kind, "#ffffff")
        lines.append(f'{indent}{ident} [label="#{n["index"]} {_escape(label, keep_newlines=True)}", '
                     f'fillcolor="{color}"];')
        cond = n.get("conditional")
        for b, (name, body) in enumerate(zip(_body_names(cond or {}), (cond or {}).get("bodies", ()))):
            cluster = f"{ident}_b{b}"
            lines.append(f'{indent}subgraph cluster_{cluster} {{')
            kind = _escape(region_label(cond).split(" of ")[0])
            lines.append(f'{indent}  label="{kind} {name}"; style="rounded,dashed"; color="#999999";')
            if not body["nodes"]:
                lines.append(f'{indent}  {cluster}_n0 [label="(empty)", shape=plaintext, style=""];')
            _dot_graph(body["nodes"], body["edges"], f"{cluster}_", names, lines, indent + "  ")
            lines.append(f"{indent}}}")
            entries = [m["index"] for m in body["nodes"] if not m["dependencies"]] or [0]
            lines += [f'{indent}{ident} -> {cluster}_n{i} [style=dashed];' for i in entries]
    lines += [f"{indent}{prefix}n{a} -> {prefix}n{b};" for a, b in edges]


def _dims(dims: Sequence[int] | None) -> str:
    """``[256, 1, 1]`` -> ``256``; ``[16, 16, 1]`` -> ``16x16``."""
    if not dims:
        return "?"
    dims = list(dims)
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return "x".join(str(d) for d in dims)


def _short(name: str, limit: int = 72) -> str:
    """A kernel name cut to ``limit`` characters (library kernels' template names run to hundreds)."""
    return name if len(name) <= limit else name[: limit - 3] + "..."


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _escape(text: str, keep_newlines: bool = False) -> str:
    """Text inside a DOT double-quoted string (``\\n`` kept as a line break when asked)."""
    marker = "\x00"
    if keep_newlines:
        text = text.replace("\\n", marker)
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    return text.replace(marker, "\\n")
