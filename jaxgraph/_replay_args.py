"""The user contract of a replayable's arguments: the graph, its static arrays, their aliases.

Checked in :func:`~jaxgraph.replayable` and :meth:`Replayable.add_device
<jaxgraph.Replayable.add_device>` before anything is registered: the graph is
a captured :class:`~jaxgraph.CUDAGraph` or :class:`~jaxgraph.Graph`, the
static arrays live on its device, and which inputs and outputs XLA may give
one buffer (a static array that is both, and the caller's ``input_output_aliases``).
"""

from __future__ import annotations

from typing import Any, Sequence

from ._capture import Graph
from ._checks import arrays_overlap
from ._graphs import CUDAGraph
from ._jax_replay import fmt

__all__ = ["alias_pairs", "check_alias_indices", "check_devices", "check_graph_type", "distinct_aliases",
           "renumber_aliases", "replay_source"]


def alias_pairs(inputs: tuple, outputs: tuple, user: dict[int, int] | None) -> tuple:
    """The ``(input, output)`` pairs XLA gives one buffer: shared static arrays, then ``user``'s.

    Raises ``ValueError`` for a static array given twice among the inputs or
    the outputs, static arrays that overlap without being the same, and bad
    or conflicting user aliases; ``TypeError`` when ``user`` is not a dict.
    """
    if user is not None and not isinstance(user, dict):
        raise TypeError(f"input_output_aliases must be a dict {{input index: output index}}, "
                        f"got {type(user).__name__}")
    for what, arrays in (("inputs", inputs), ("outputs", outputs)):
        for i, a in enumerate(arrays):
            for j in range(i):
                if arrays_overlap(a, arrays[j]):
                    raise ValueError(f"{what}[{j}] and {what}[{i}] use the same device memory; "
                                     "give each static array once")
    pairs = {}
    for i, a in enumerate(inputs):
        for j, b in enumerate(outputs):
            if (a.ptr, a.nbytes) == (b.ptr, b.nbytes) and a.nbytes:
                if (a.shape, a.dtype) != (b.shape, b.dtype):
                    raise ValueError(f"inputs[{i}] and outputs[{j}] are the same memory with different "
                                     "shapes or dtypes; pass the same array for both")
                pairs[i] = j
            elif arrays_overlap(a, b):
                raise ValueError(f"inputs[{i}] and outputs[{j}] overlap without being the same array")
    for i, j in (user or {}).items():
        if not (isinstance(i, int) and isinstance(j, int) and 0 <= i < len(inputs) and 0 <= j < len(outputs)):
            raise ValueError(f"input_output_aliases: {i!r} -> {j!r} does not name an input and an output")
        if pairs.get(i, j) != j or j in (v for k, v in pairs.items() if k != i):
            raise ValueError(f"input_output_aliases: input {i} or output {j} is already aliased")
        if (inputs[i].shape, inputs[i].dtype) != (outputs[j].shape, outputs[j].dtype):
            raise ValueError(f"input_output_aliases: input {i} is {fmt(inputs[i])}, output {j} is "
                             f"{fmt(outputs[j])}; aliased buffers must match")
        pairs[i] = j
    return tuple(sorted(pairs.items()))


def distinct_aliases(pairs: Sequence[tuple[int, int]], inputs: tuple, outputs: tuple) -> list:
    """The alias ``pairs`` between different static arrays (the native table copies those inputs)."""
    return [(i, j) for i, j in pairs if inputs[i].ptr != outputs[j].ptr]


def renumber_aliases(user_aliases: dict[int, int] | None, kept: Sequence[bool]) -> dict[int, int] | None:
    """``user_aliases`` with inputs numbered among the kept ones (aliased inputs are always kept)."""
    if not user_aliases:
        return user_aliases
    index = {old: sum(kept[:old]) for old in range(len(kept)) if kept[old]}
    return {index[i]: j for i, j in user_aliases.items()}


def check_graph_type(graph: Any) -> None:
    """``TypeError`` unless ``graph`` is a :class:`~jaxgraph.CUDAGraph` or :class:`~jaxgraph.Graph`."""
    if not isinstance(graph, (CUDAGraph, Graph)):
        raise TypeError(f"graph must be a captured jaxgraph.CUDAGraph or jaxgraph.Graph, got {type(graph).__name__}")


def replay_source(graph: Any) -> Any:
    """``graph``'s :class:`~jaxgraph._replay_source.ReplaySource` (raises if it holds no capture)."""
    check_graph_type(graph)
    return graph._replay_source()


def check_devices(device: int, inputs: tuple, outputs: tuple) -> None:
    """``ValueError`` unless every static array is on the graph's ``device``."""
    for where, arrays in (("inputs", inputs), ("outputs", outputs)):
        for i, a in enumerate(arrays):
            if a.device != device:
                raise ValueError(f"{where}[{i}] is on device {a.device}, the graph on device {device}")


def check_alias_indices(aliases: Any, n_inputs: int) -> None:
    """What can be checked of ``input_output_aliases`` before the outputs exist (replayable checks the rest)."""
    if aliases is None:
        return
    if not isinstance(aliases, dict):
        raise TypeError(f"input_output_aliases must be a dict {{input index: output index}}, "
                        f"got {type(aliases).__name__}")
    for i, j in aliases.items():
        if not (isinstance(i, int) and isinstance(j, int) and 0 <= i < n_inputs and j >= 0):
            raise ValueError(f"input_output_aliases: {i!r} -> {j!r} does not name an input (of {n_inputs}) "
                             "and an output")
