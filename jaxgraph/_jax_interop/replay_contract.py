"""What a replayable settles: the argument contract and :class:`ReplaySpec`.

The user contract of a replayable's arguments (the graph, its static arrays,
their aliases, its calls) is checked in :func:`~jaxgraph.replayable` and :meth:`Replayable.add_device
<jaxgraph.Replayable.add_device>` before anything is registered: the graph is
a captured :class:`~jaxgraph.CUDAGraph` or :class:`~jaxgraph.Graph`, the
static arrays live on its device, and which inputs and outputs XLA may give
one buffer (a static array that is both, and the caller's ``input_output_aliases``).
What a build settles becomes a :class:`ReplaySpec`: the shapes each call is
checked against (:meth:`ReplaySpec.check_args`) and all the FFI call needs.
:func:`check_call` makes every check of ``replayable`` in one call and returns
the checked arrays with their spec.

What crosses the native replay boundary (registration, binding modes, replay
paths, counters, the capture policy) is typed in ``replay_boundary.py``, the
one module that talks to ``ffi/replay/replay.cc``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import numpy as np

from .._cuda.checks import arrays_overlap, check_choice, device_arrays, fmt, fmt_all
from .._graphs.capture_contexts import Graph, cuda_graph_of
from .._graphs.cuda_graph import CUDAGraph, replay_source
from .._graphs.replay_source import ReplaySource

BIND_CHOICES = ("auto", "copy")   # replayable(bind=...), ShardedGraph(bind=...)
VIA_CHOICES = ("ffi", "callback")  # replayable(via=...)

__all__ = [
    "BIND_CHOICES",
    "VIA_CHOICES",
    "CheckedCall",
    "ReplaySpec",
    "alias_pairs",
    "check_alias_indices",
    "check_call",
    "check_devices",
    "check_graph_type",
    "check_outputs",
    "shapes_of",
    "source_of",
]

# ----------------------------------------------------------------------------
# ReplaySpec
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ReplaySpec:
    """What lowering needs to know about a replayable: no device, no pointers.

    Attributes
    ----------
    inputs, outputs : tuple of jax.ShapeDtypeStruct
        Shapes and dtypes of the graph's static inputs and outputs.
    graph_id : int
        The graph's id in the native table (the ``graph`` attribute of the call).
    aliases : tuple of (int, int)
        ``(input, output)`` pairs XLA gives one buffer: a static array that is
        both an input and an output, and the caller's ``input_output_aliases``.
    side_effects : bool
        Declare the call side-effecting, so XLA keeps it even when its outputs are unused.
    uncaptured : bool
        Call ``jaxgraph_replay_uncaptured``, which XLA keeps out of its command
        buffers (graphs with conditional nodes), instead of ``jaxgraph_replay``.
    """

    inputs: tuple
    outputs: tuple
    graph_id: int = 0
    aliases: tuple = ()
    side_effects: bool = False
    uncaptured: bool = False

    @property
    def target(self) -> str:
        """The FFI target the call lowers to."""
        return "jaxgraph_replay_uncaptured" if self.uncaptured else "jaxgraph_replay"

    def __post_init__(self):
        check_outputs(self.outputs)

    @classmethod
    def from_arrays(cls, inputs: Sequence[Any], outputs: Sequence[Any], graph_id: int = 0,
                    **options: Any) -> "ReplaySpec":
        """The spec of arrays with ``.shape`` and ``.dtype`` (DeviceArrays, ShapeDtypeStructs)."""
        return cls(shapes_of(inputs), shapes_of(outputs), int(graph_id), **options)

    def check_args(self, args: tuple) -> tuple:
        """Return ``args`` as JAX arrays, or raise naming the first mismatch."""
        import jax

        if len(args) != len(self.inputs):
            raise TypeError(f"replayable takes {len(self.inputs)} array(s) ({fmt_all(self.inputs)}), "
                            f"got {len(args)}")
        checked = []
        for i, (a, want) in enumerate(zip(args, self.inputs)):
            if not isinstance(a, jax.Array):
                try:
                    a = jax.numpy.asarray(a)
                except TypeError:
                    raise TypeError(f"replayable input {i}: expected an array {fmt(want)}, "
                                    f"got {type(a).__name__}") from None
            if tuple(a.shape) != want.shape:
                raise ValueError(f"replayable input {i}: expected shape {want.shape} ({fmt(want)}, the "
                                 f"static input's), got shape {tuple(a.shape)}")
            if np.dtype(a.dtype) != want.dtype:
                raise TypeError(f"replayable input {i}: expected dtype {want.dtype} ({fmt(want)}, the "
                                f"static input's), got {np.dtype(a.dtype)}")
            checked.append(a)
        return tuple(checked)


def shapes_of(arrays: Sequence[Any]) -> tuple:
    """``arrays`` (anything with ``.shape`` and ``.dtype``) as ``jax.ShapeDtypeStruct``s."""
    import jax

    return tuple(jax.ShapeDtypeStruct(tuple(a.shape), np.dtype(a.dtype)) for a in arrays)


def check_outputs(outputs: Sequence[Any]) -> None:
    """``ValueError`` unless there is an output: XLA drops calls without results."""
    if not outputs:
        raise ValueError("a replayable needs at least one output: XLA drops calls without results")


# ----------------------------------------------------------------------------
# The graph, its static arrays and their aliases
# ----------------------------------------------------------------------------


class CheckedCall(NamedTuple):
    """:func:`check_call`'s answer: the graph's replay source, its static arrays, and the spec of their calls."""

    source: ReplaySource
    inputs: tuple
    outputs: tuple
    spec: ReplaySpec


def check_call(graph: Any, inputs: Any, outputs: Any, *, via: str, bind: str, backward: Any,
               input_output_aliases: dict[int, int] | None, trust_foreign_kernels: bool,
               side_effects: bool) -> CheckedCall:
    """:func:`~jaxgraph.replayable`'s arguments, all checked, then the graph's state (a wrong call says so first).

    Returns the graph's :class:`ReplaySource`, the static inputs and outputs as
    DeviceArrays, and their :class:`ReplaySpec` (every input, graph id 0: the
    native table may leave out inputs and gives the id); raises the errors
    ``replayable`` documents.
    """
    check_choice("via", via, VIA_CHOICES)
    check_choice("bind", bind, BIND_CHOICES)
    if trust_foreign_kernels and bind == "copy":
        raise ValueError("trust_foreign_kernels=True binds buffers, but bind='copy' copies every buffer; "
                         "use one or the other")
    if backward is not None and not callable(backward):
        raise TypeError(f"backward must be callable (e.g. another replayable), got {type(backward).__name__}")
    inputs, outputs = device_arrays(inputs, "inputs"), device_arrays(outputs, "outputs")
    check_graph_type(graph)
    aliases = alias_pairs(inputs, outputs, input_output_aliases)
    check_outputs(outputs)
    source = source_of(graph)  # the graph's state, after every argument error
    check_devices(source.device, inputs, outputs)
    return CheckedCall(source, inputs, outputs,
                       ReplaySpec.from_arrays(inputs, outputs, aliases=aliases, side_effects=bool(side_effects)))


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


def check_graph_type(graph: Any) -> None:
    """``TypeError`` unless ``graph`` is a :class:`~jaxgraph.CUDAGraph` or :class:`~jaxgraph.Graph`."""
    if not isinstance(graph, (CUDAGraph, Graph)):
        raise TypeError(f"graph must be a captured jaxgraph.CUDAGraph or jaxgraph.Graph, got {type(graph).__name__}")


def source_of(graph: CUDAGraph | Graph) -> ReplaySource:
    """``graph``'s :class:`~jaxgraph._graphs.replay_source.ReplaySource` (raises if it holds no capture).

    The caller has checked ``graph``'s type (:func:`check_graph_type`).
    """
    return replay_source(cuda_graph_of(graph))


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
