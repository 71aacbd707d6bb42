"""What a replayable settles and what crosses the native boundary: :class:`ReplaySpec` and the codes.

The user contract of a replayable's arguments (the graph, its static arrays,
their aliases, its calls) is checked in :func:`~jaxgraph.replayable` and :meth:`Replayable.add_device
<jaxgraph.Replayable.add_device>` before anything is registered: the graph is
a captured :class:`~jaxgraph.CUDAGraph` or :class:`~jaxgraph.Graph`, the
static arrays live on its device, and which inputs and outputs XLA may give
one buffer (a static array that is both, and the caller's ``input_output_aliases``).
What a build settles becomes a :class:`ReplaySpec`: the shapes each call is
checked against (:meth:`ReplaySpec.check_args`) and all the FFI call needs.

What crosses the native replay boundary is typed here too: binding modes,
replay paths, counters. ``ffi/replay/replay.cc`` reports how each static buffer meets XLA's (a
:class:`BindingMode` code with the reason text beside it) and which ways a
graph's calls can run (:class:`ReplayPath` codes), and counts the calls of
each path. Python never parses the reason text: it is for people.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, NamedTuple, Sequence

import numpy as np

from .._cuda.checks import BIND_CHOICES, VIA_CHOICES, arrays_overlap, check_choice, device_arrays, fmt, fmt_all
from .._cuda.native import native
from .._graphs.capture import Graph, cuda_graph_of
from .._graphs.cuda_graph import CUDAGraph, replay_source
from .._graphs.replay_source import ReplaySource

__all__ = [
    "BindingMode",
    "BufferBinding",
    "CapturePolicy",
    "ReplayPath",
    "ReplaySpec",
    "alias_pairs",
    "binding_from_row",
    "check_alias_indices",
    "check_arguments",
    "check_devices",
    "check_graph_type",
    "check_outputs",
    "counters",
    "distinct_aliases",
    "paths_from_codes",
    "renumber_aliases",
    "set_capture_policy",
    "shapes_of",
    "source_of",
]

class BindingMode(str, enum.Enum):
    """How one static buffer of a replayable meets XLA's buffer (``Replayable.bindings``).

    A ``str`` enum: ``BindingMode.BOUND == "bound"``.
    """

    BOUND = "bound"
    """The graph's kernel arguments are pointed at XLA's buffer: no copy."""
    COPIED = "copied"
    """Copied into the static input before the replay, or out of the static output after it."""
    UNUSED = "unused"
    """No node jaxgraph can read refers to it; copied in case the graph reaches it through
    device memory (``drop_unreferenced`` leaves such inputs out of the call)."""
    COPIED_BY_COST = "copied_by_cost"
    """Could be bound, but copying costs less: many kernel arguments point at it (state updated
    in place by every kernel) and either the graph keeps one executable (a large graph: decided
    at registration) or XLA's address for it kept changing (decided after some calls). The
    ``reason`` gives the figures."""

    def __str__(self) -> str:
        return self.value


class ReplayPath(str, enum.Enum):
    """How a call of a :class:`~jaxgraph.Replayable` replays its graph inside ``jax.jit``.

    Each path has its own counter in the native extension, named by its value
    (``jaxgraph._replay.counters()["splice_nodes"]``). ``Replayable.replay_paths``
    says which paths a replayable's calls can take.
    """

    LAUNCH = "launch"
    """``cudaGraphLaunch`` on XLA's stream (XLA is not recording a command buffer)."""
    SPLICE_NODES = "splice_nodes"
    """XLA records a command buffer: the graph's nodes, bound to XLA's buffers, are added to it one by one."""
    SPLICE_WHOLE = "splice_whole"
    """XLA records a command buffer and the nodes cannot be added one by one: the static template
    goes in as one child-graph node, every buffer copied."""
    UNCAPTURED_LAUNCH = "uncaptured_launch"
    """A graph with conditional nodes (IF, WHILE, SWITCH), which CUDA can neither clone nor nest:
    launched on XLA's stream through ``jaxgraph_replay_uncaptured``, a target XLA keeps out of its
    command buffers (it splits them around the call)."""
    HOST_CALLBACK = "host_callback"
    """``via="callback"``: replayed from the host through ``jax.pure_callback`` (no native counter)."""

    def __str__(self) -> str:
        return self.value


class CapturePolicy(str, enum.Enum):
    """How a replay goes into XLA's command buffer when XLA records it (``ffi/replay/capture_policy.h``).

    XLA records the call again when its buffers move to addresses it holds
    no recording for, and updates its executable in place: a bound buffer's
    kernel arguments are rewritten there, a copied one changes one memcpy
    node, which costs a copy on every call. ``BIND`` is the default (where
    XLA's addresses recur, as in a jitted loop, nothing is re-recorded and a
    copy would cost every call for nothing); ``AUTO`` suits buffers that cycle
    through more addresses than XLA keeps recordings for. The others exist to
    compare the ways (``benchmarks/capture_policies.py``).
    """

    AUTO = "auto"
    """By cost (``ffi/replay/capture_policy.h``): a bound buffer held by many kernel arguments and small
    enough to copy cheaply is copied, the rest bound."""
    BIND = "bind"
    """Every bound buffer bound in the spliced nodes (no copies)."""
    COPY = "copy"
    """Every bound buffer copied around the spliced nodes, which keep the static arrays."""
    WHOLE = "whole"
    """The static template spliced as one child-graph node, every buffer copied."""

    def __str__(self) -> str:
        return self.value


class BufferBinding(NamedTuple):
    """How one static buffer meets XLA's buffer in a jitted replay.

    ``mode`` is a :class:`BindingMode`; ``sites`` counts the kernel arguments
    that point at it (rewritten when XLA's address of a bound buffer changes);
    ``reason`` says why a buffer is copied or unused, for people (never parsed).
    """

    kind: str
    index: int
    mode: BindingMode
    sites: int
    reason: str

    def __str__(self) -> str:
        what = f"{self.kind} {self.index} {self.mode.value}"
        if self.mode is BindingMode.BOUND:
            return f"{what} ({self.sites} site{'s' if self.sites != 1 else ''})"
        return f"{what} ({self.reason})" if self.reason else what


def counters() -> dict[str, int]:
    """The native replay counters: calls per :class:`ReplayPath` (by value), ``instantiate``
    (executables made), ``rebind`` (kernel arguments rewritten in place in executables), ``copy``,
    ``to_copy`` (bound buffers switched to copying by their cost), ``evict`` (calls whose addresses
    no executable held, with no room for another: one was replaced, afresh or rewritten in place),
    ``node_copy`` (buffers copied by copy nodes of the executable, not counted in ``copy``),
    ``ring_wait`` (launches that waited for the device to free an entry of those nodes' address ring),
    ``refresh`` (executables rewritten in place, made afresh when their addresses recurred; each
    also counts in ``instantiate``), ``handler_calls``, ``handler_ns``, and the parts of
    ``handler_ns`` spent inside ``cudaGraphLaunch`` on the launch path (``launch_ns``), inside
    ``cudaMemcpyAsync`` (``copy_ns``) and choosing, making or rewriting the executable to launch
    (``prepare_ns``)."""
    return dict(native("replay").counters())


def set_capture_policy(policy: CapturePolicy | str) -> CapturePolicy:
    """Set the :class:`CapturePolicy` of graphs XLA records for the first time from now on; return
    the previous one.

    Process-wide, for tests and benchmarks. A graph keeps the policy of its
    first recording: XLA can update a recorded call only from a recording of
    the same shape, so a replayable made before the change keeps its way.
    """
    policy = CapturePolicy(policy)  # ValueError names the bad value
    previous = native("replay").set_capture_policy(native("replay").codes()["capture"][policy.value])
    return _codes()["capture"][int(previous)]


def binding_from_row(row: tuple) -> BufferBinding:
    """A :class:`BufferBinding` from the native ``(kind, index, mode code, sites, reason)``."""
    kind, index, mode, sites, reason = row
    return BufferBinding(kind, int(index), _codes()["binding"][int(mode)], int(sites), reason)


def paths_from_codes(codes: list) -> tuple[ReplayPath, ...]:
    """The :class:`ReplayPath` of each native path code."""
    return tuple(_codes()["path"][int(c)] for c in codes)


def _codes() -> dict:
    """Native code -> enum member, built once from the extension's own table (never hard-coded)."""
    global _CODE_TABLE
    if _CODE_TABLE is None:
        table = native("replay").codes()
        _CODE_TABLE = {"binding": {code: BindingMode(name) for name, code in table["binding"].items()},
                       "path": {code: ReplayPath(name) for name, code in table["path"].items()},
                       "capture": {code: CapturePolicy(name) for name, code in table["capture"].items()}}
    return _CODE_TABLE


_CODE_TABLE: dict | None = None


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


def check_arguments(graph: Any, inputs: Any, outputs: Any, *, via: str, bind: str, backward: Any,
                    input_output_aliases: dict[int, int] | None, trust_foreign_kernels: bool) -> tuple:
    """:func:`~jaxgraph.replayable`'s arguments, checked before the graph's state is read.

    Returns the static inputs and outputs as DeviceArrays and the alias pairs
    (:func:`alias_pairs`); raises the errors ``replayable`` documents.
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
    return inputs, outputs, aliases


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
