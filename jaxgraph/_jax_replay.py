"""Replay inside ``jax.jit``: the ``jaxgraph_replay`` FFI call and the native graph table.

This module pairs with ``ffi/replay.cc``. :func:`register` enters a captured
graph into the native table (a clone and an executable per device; for a graph
with conditional nodes, which CUDA cannot clone, the template itself) and the
table decides, per static buffer, whether XLA's buffer is *bound* into the
graph (its kernel nodes are pointed at XLA's operand or result: no copy) or
*copied* (into the static input before the replay, out of the static output
after it); :func:`describe_bindings` says which and why, :func:`describe_graph`
which replay paths its calls take. :func:`jaxgraph_replay` builds the FFI call
a :class:`~jaxgraph.Replayable` binds when traced: ``jaxgraph_replay``, which
XLA may record into its command buffers, or ``jaxgraph_replay_uncaptured`` for
graphs with conditional nodes, which XLA keeps out of them.

HLO carries only a small graph id. Resetting the CUDAGraph retires the id
on its device, closing or collecting the replayable (which holds its graphs)
retires it everywhere (:class:`ReplayState`), and a compiled function that
still refers to it fails with a clear error instead of launching freed memory.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from . import _driver, _memory
from ._native import native, register_ffi_targets
from ._replay_codes import BufferBinding, binding_from_row, paths_from_codes

__all__ = [
    "GraphInfo",
    "Registration",
    "ReplaySpec",
    "ReplayState",
    "describe_bindings",
    "describe_graph",
    "jaxgraph_replay",
    "register",
    "result_shapes",
    "varying_axes",
]


# ----------------------------------------------------------------------------
# ReplaySpec and the FFI call
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
        if not self.outputs:
            raise ValueError("a replayable needs at least one output: XLA drops calls without results")

    @classmethod
    def from_arrays(cls, inputs: Sequence[Any], outputs: Sequence[Any], graph_id: int = 0,
                    **options: Any) -> "ReplaySpec":
        """The spec of arrays with ``.shape`` and ``.dtype`` (DeviceArrays, ShapeDtypeStructs)."""
        import jax

        def shapes(arrays):
            return tuple(jax.ShapeDtypeStruct(tuple(a.shape), np.dtype(a.dtype)) for a in arrays)

        return cls(shapes(inputs), shapes(outputs), int(graph_id), **options)

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


def jaxgraph_replay(spec: ReplaySpec) -> Callable[..., list]:
    """The ``jaxgraph_replay`` FFI call for ``spec`` (``spec.target``): call it on the operands for the outputs.

    ``jaxgraph_replay`` is registered command-buffer compatible: when XLA
    records a command buffer the graph is spliced into it.
    ``jaxgraph_replay_uncaptured`` (``spec.uncaptured``, graphs with
    conditional nodes) is not: XLA runs it outside its command buffers.

    Every call carries its own ``call`` attribute, so two calls on the same
    operands are different operations and XLA never merges them: each call
    replays, as each ``g.replay()`` does. Calls are not side-effecting unless
    ``spec.side_effects`` (``has_side_effect`` costs host time on every call:
    ``benchmarks/side_effect_cost.py``): XLA removes a call whose outputs are unused.
    ``vmap`` replays once per batch element, in sequence.

    Inside ``jax.shard_map`` (and ``jax.pmap``, which JAX runs as one) the
    results vary over the mesh axes the operands vary over
    (:func:`varying_axes`), as for any JAX operation: each device replays its
    own graph on its own shard, so a result is per-device data unless every
    operand is the same on every device. Since jax 0.8.2 ``ffi_call`` takes
    that type from the result shapes it is given, so the call is built per
    set of varying axes (:func:`result_shapes`).
    """
    import jax

    register_ffi_targets()
    graph = np.int64(spec.graph_id)
    calls: dict[frozenset, Callable[..., Any]] = {}  # built once per set of varying axes, not per call

    def replay(*args: Any) -> list:
        varying = varying_axes(args)
        call = calls.get(varying)
        if call is None:
            call = calls[varying] = jax.ffi.ffi_call(
                spec.target, result_shapes(spec.outputs, varying), vmap_method="sequential",
                has_side_effect=spec.side_effects, input_output_aliases=dict(spec.aliases) or None)
        return list(call(*args, graph=graph, call=np.int64(next(_call_sites))))

    return replay


def varying_axes(args: Sequence[Any]) -> frozenset:
    """The manual mesh axes (``shard_map``, ``pmap``) over which some of ``args`` varies.

    Empty outside ``shard_map`` and when its ``check_vma`` is off.
    """
    import jax

    typeof = getattr(jax, "typeof", None)
    if typeof is None:  # jax without varying-axes types
        return frozenset()
    axes: frozenset = frozenset()
    for a in args:
        try:
            aval = typeof(a)
        except TypeError:
            continue
        mat = getattr(aval, "manual_axis_type", None)  # jax >= 0.10
        varying = getattr(mat, "varying", None) if mat is not None else getattr(aval, "vma", None)
        if varying:
            axes |= frozenset(varying)
    return axes


def result_shapes(outputs: Sequence[Any], varying: frozenset) -> list:
    """``outputs`` as result shapes that vary over the mesh axes ``varying`` (unchanged when empty).

    jax >= 0.10 spells it ``manual_axis_type=ManualAxisType(varying=...)``,
    jax 0.8.2-0.9 ``vma=...``; both need a sharding on the current (abstract)
    mesh. Older jax typed ``ffi_call`` results from the operands itself.
    """
    import jax

    if not varying:
        return list(outputs)
    manual_axis_type = getattr(jax.sharding, "ManualAxisType", None)
    try:
        sharding = jax.sharding.NamedSharding(jax.sharding.get_abstract_mesh(), jax.sharding.PartitionSpec())
        if manual_axis_type is not None:
            kind = {"manual_axis_type": manual_axis_type(varying=varying)}
        else:
            kind = {"vma": varying}
        return [jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=sharding, **kind) for o in outputs]
    except (AttributeError, TypeError):  # jax < 0.8.2: ffi_call gives the results the operands' varying axes itself
        return list(outputs)


_call_sites = itertools.count(1)


# ----------------------------------------------------------------------------
# The native graph table
# ----------------------------------------------------------------------------


class Registration(NamedTuple):
    """What :func:`register` returns: the graph id and which inputs stay operands of the call."""

    graph_id: int
    kept: tuple


class GraphInfo(NamedTuple):
    """How calls of one registered graph run (:func:`describe_graph`).

    ``paths``: the :class:`~jaxgraph.ReplayPath` each call can take;
    ``conditionals``: conditional nodes at any depth (then the call must stay
    out of XLA's command buffers); ``kernel_nodes``: kernel nodes read for
    binding (conditional bodies included); ``borrowed_exec``: the CUDAGraph's
    own executable is shared (CUDA made no second one of a conditional graph).
    """

    paths: tuple
    conditionals: int
    kernel_nodes: int
    splice_whole_reason: str
    borrowed_exec: bool


def register(source: Any, inputs: Sequence[Any], outputs: Sequence[Any], graph_id: int,
             aliases: Sequence[tuple[int, int]], bind: bool, *, trust_foreign: bool = False,
             drop_unreferenced: bool = False) -> Registration:
    """Enter ``source`` (a :class:`~jaxgraph._replay_source.ReplaySource`) into the native table.

    ``graph_id`` 0 asks for a new id. ``trust_foreign`` binds outputs that
    kernels jaxgraph did not launch receive as arguments (else they are
    copied); ``drop_unreferenced`` leaves out of the call the inputs no node
    refers to (``Registration.kept`` says which stay; ``aliases`` name inputs
    by their index before that).
    """
    _driver.ensure_context(source.device)
    graph_id, kept = native("replay").register_graph(
        graph_id, source.device, source.template, [(a.ptr, a.nbytes) for a in inputs],
        [(a.ptr, a.nbytes) for a in outputs], [tuple(p) for p in aliases], dict(source.kernels),
        bool(bind), bool(trust_foreign), bool(drop_unreferenced), [int(b) for b in source.bodies],
        int(source.exec))
    return Registration(int(graph_id), tuple(bool(k) for k in kept))


def describe_bindings(graph_id: int, device: int) -> list[BufferBinding]:
    """How each static buffer of ``graph_id`` on ``device`` meets XLA's: inputs first."""
    return [binding_from_row(row) for row in native("replay").describe_bindings(graph_id, device)]


def describe_graph(graph_id: int, device: int) -> GraphInfo:
    """How calls of ``graph_id`` on ``device`` run."""
    d = native("replay").describe_graph(graph_id, device)
    return GraphInfo(paths_from_codes(d["paths"]), int(d["conditionals"]), int(d["kernel_nodes"]),
                     d["splice_whole_reason"], bool(d["borrowed_exec"]))


class ReplayState:
    """Which devices of a graph id are live; shared with the graphs' destroy callbacks.

    It holds no reference to the replayable, so a graph's destroy callback
    (:meth:`retire_callback`) never keeps the replayable alive.
    """

    def __init__(self, graph_id: int):
        self.graph_id = graph_id
        self.devices: dict[int, bool] = {}  # device -> still registered
        self.closed = False
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return not self.closed and (not self.devices or any(self.devices.values()))

    def check_alive(self) -> None:
        if self.closed:
            raise RuntimeError("this replayable was closed; build a new one with jaxgraph.replayable(...)")
        if self.devices and not any(self.devices.values()):
            raise RuntimeError("the graph of this replayable was reset or destroyed; capture it again "
                               "and build a new function with jaxgraph.replayable(...)")

    def retire(self, device: int = -1) -> None:
        """Retire ``device`` (every device when -1, which also closes); never raises."""
        with self._lock:
            if device < 0:
                self.closed = True
            for d in self.devices:
                if device < 0 or d == device:
                    self.devices[d] = False
        if self.graph_id > 0:
            # At once: the graph's owner may destroy the template and executable
            # a conditional graph's entry uses as soon as this returns.
            _native_quietly("detach_graph", self.graph_id, device)
            # Drops executables, which must not happen in the middle of a capture.
            _memory.when_no_capture(functools.partial(_native_quietly, "unregister_graph", self.graph_id, device))

    def retire_callback(self, device: int) -> Callable[[], None]:
        """A destroy callback for a graph: retires ``device`` (it holds only this state)."""
        return lambda: self.retire(device)


def _native_quietly(call: str, graph_id: int, device: int) -> None:
    try:
        getattr(native("replay"), call)(graph_id, device)
    except Exception:  # finalizers and destroy callbacks never raise
        pass


# ----------------------------------------------------------------------------
# Formatting
# ----------------------------------------------------------------------------


def fmt(s: Any) -> str:
    """``float32[4096]``."""
    return f"{np.dtype(s.dtype).name}{list(s.shape)}"


def fmt_all(shapes: Sequence[Any]) -> str:
    return ", ".join(fmt(s) for s in shapes) or "no inputs"
