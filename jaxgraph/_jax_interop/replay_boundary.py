"""The native replay boundary: the ``jaxgraph_replay`` FFI call, the graph table, its codes and counters.

This module pairs with ``ffi/replay/replay.cc`` and is the only one that calls
it (``native("replay")``). :func:`enter` does a new replayable's part in one
call: it registers its graph, types its calls and watches the graph.
:func:`register` enters a captured
graph into the native table (a clone and an executable per device; for a graph
with conditional nodes, which CUDA cannot clone, the template itself) and the
table decides, per static buffer, whether XLA's buffer is *bound* into the
graph (its kernel nodes are pointed at XLA's operand or result: no copy) or
*copied* (into the static input before the replay, out of the static output
after it); :func:`describe_bindings` says which and why, :func:`describe_graph`
which replay paths its calls take, and :func:`retire` takes a graph id out.
:func:`jaxgraph_replay` builds the FFI call a :class:`~jaxgraph.Replayable`
binds when traced: ``jaxgraph_replay``, which XLA may record into its command
buffers, or ``jaxgraph_replay_uncaptured`` for graphs with conditional nodes,
which XLA keeps out of them.

What a replayable promises its caller (argument checks, aliases) lives in
``replay_contract.py``; only the spec's shapes, aliases, graph id and flags
reach the FFI call.

:class:`ReplayState` is the liveness of a replayable's graph id: which devices
still have its graph, and retiring them. HLO carries only a small graph id. Resetting the CUDAGraph retires the id on
its device, closing or collecting the replayable (which holds its graphs)
retires it everywhere, and a compiled function that still refers to it fails
with a clear error instead of launching freed memory. :class:`ReplayState`
keeps that record and says what to do when a replayable is called after it.
"""

from __future__ import annotations

import atexit
import dataclasses
import enum
import functools
import itertools
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

import numpy as np

from .._cuda import driver as _driver, memory as _memory
from .._cuda.native import native, register_ffi_targets
from .._graphs.copy_ring import ring_functions

if TYPE_CHECKING:  # only the spec's fields cross the boundary
    from .replay_contract import ReplaySpec

__all__ = [
    "BindingMode",
    "BufferBinding",
    "CapturePolicy",
    "Entry",
    "GraphInfo",
    "Registration",
    "ReplayPath",
    "ReplayState",
    "binding_from_row",
    "call_site",
    "counters",
    "describe_bindings",
    "describe_graph",
    "enter",
    "jaxgraph_replay",
    "register",
    "paths_from_codes",
    "result_shapes",
    "retire",
    "set_capture_policy",
    "sweep_copy_rings",
    "varying_axes",
]

# ----------------------------------------------------------------------------
# What crosses the boundary: codes, bindings, paths, counters, capture policy
# ----------------------------------------------------------------------------
# ffi/replay/replay.cc reports how each static buffer meets XLA's (a
# BindingMode code with the reason text beside it) and which ways a graph's
# calls can run (ReplayPath codes), and counts the calls of each path. Python
# never parses the reason text: it is for people.

class BindingMode(str, enum.Enum):
    """How one static buffer of a replayable meets XLA's buffer (``Replayable.bindings``).

    A ``str`` enum: ``BindingMode.BOUND == "bound"``.

    Attributes
    ----------
    BOUND
        ``"bound"``: the graph's kernel arguments are pointed at XLA's buffer: no copy.
    COPIED
        ``"copied"``: copied into the static input before the replay, or out of the static
        output after it.
    UNUSED
        ``"unused"``: no node jaxgraph can read refers to it; copied in case the graph reaches it
        through device memory (``drop_unreferenced`` leaves such inputs out of the call).
    COPIED_BY_COST
        ``"copied_by_cost"``: could be bound, but copying costs less: many kernel arguments point at it
        (state updated in place by every kernel) and either the graph keeps one executable (a large
        graph: decided at registration) or XLA's address for it kept changing (decided after some
        calls). The ``reason`` gives the figures.
    """

    BOUND = "bound"
    COPIED = "copied"
    UNUSED = "unused"
    COPIED_BY_COST = "copied_by_cost"

    def __str__(self) -> str:
        return self.value


class ReplayPath(str, enum.Enum):
    """How a call of a :class:`~jaxgraph.Replayable` replays its graph inside ``jax.jit``.

    Each path has its own counter in the native extension, named by its value
    (``jaxgraph.diagnostics.counters()["splice_nodes"]``). ``Replayable.replay_paths``
    says which paths a replayable's calls can take.

    Attributes
    ----------
    LAUNCH
        ``"launch"``: ``cudaGraphLaunch`` on XLA's stream (XLA is not recording a command buffer).
    SPLICE_NODES
        ``"splice_nodes"``: XLA records a command buffer, and the graph's nodes, bound to XLA's buffers,
        are added to it one by one.
    SPLICE_WHOLE
        ``"splice_whole"``: XLA records a command buffer and the nodes cannot be added one by one, so
        the static template goes in as one child-graph node, every buffer copied.
    UNCAPTURED_LAUNCH
        ``"uncaptured_launch"``: a graph with conditional nodes (IF, WHILE, SWITCH), which CUDA can
        neither clone nor nest: launched on XLA's stream through ``jaxgraph_replay_uncaptured``, a
        target XLA keeps out of its command buffers (it splits them around the call).
    HOST_CALLBACK
        ``"host_callback"``: with ``via="callback"``, replayed from the host through
        ``jax.pure_callback`` (no native counter).
    """

    LAUNCH = "launch"
    SPLICE_NODES = "splice_nodes"
    SPLICE_WHOLE = "splice_whole"
    UNCAPTURED_LAUNCH = "uncaptured_launch"
    HOST_CALLBACK = "host_callback"

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

    Attributes
    ----------
    AUTO
        ``"auto"``: by cost (``ffi/replay/capture_policy.h``): a bound buffer held by many kernel
        arguments and small enough to copy cheaply is copied, the rest bound.
    BIND
        ``"bind"``: every bound buffer bound in the spliced nodes (no copies).
    COPY
        ``"copy"``: every bound buffer copied around the spliced nodes, which keep the static arrays.
    WHOLE
        ``"whole"``: the static template spliced as one child-graph node, every buffer copied.
    """

    AUTO = "auto"
    BIND = "bind"
    COPY = "copy"
    WHOLE = "whole"

    def __str__(self) -> str:
        return self.value


class BufferBinding(NamedTuple):
    """How one static buffer meets XLA's buffer in a jitted replay.

    ``mode`` is a :class:`BindingMode`; ``sites`` counts the kernel arguments
    that point at it (rewritten when XLA's address of a bound buffer changes);
    ``reason`` says why a buffer is copied or unused, for people (never parsed).

    Attributes
    ----------
    kind : str
        ``"input"`` or ``"output"``: which of the graph's static arrays.
    index : int
        Its position among the static inputs (or outputs).
    mode : BindingMode
        Bound to XLA's buffer, copied, or unused.
    sites : int
        How many kernel arguments point at it.
    reason : str
        Why it is copied or unused (empty when bound).
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


class ReplayState:
    """Which devices of a graph id are live; shared with the graphs' destroy callbacks.

    It holds no reference to the replayable, so a graph's destroy callback
    (:meth:`retire_callback`) never keeps the replayable alive.
    """

    def __init__(self, graph_id: int):
        self.graph_id = graph_id
        self.devices: dict[int, bool] = {}  # device -> still registered
        self.closed = False
        # device -> (recorded, streams) of its retired graph (:func:`retire`): what freeing must respect
        self.uses: dict[int, tuple[bool, tuple[int, ...]]] = {}
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        """Not closed, and its graph still live on at least one device it was registered for."""
        return not self.closed and (not self.devices or any(self.devices.values()))

    @property
    def live_devices(self) -> list[int]:
        """The devices whose graph is still registered, sorted (none once closed)."""
        return [] if self.closed else [d for d, live in sorted(self.devices.items()) if live]

    def check_alive(self) -> None:
        """Raise ``RuntimeError`` saying what to do if the replayable was closed or its graph reset."""
        if self.closed:
            raise RuntimeError("this replayable was closed; build a new one with jaxgraph.replayable(...)")
        if self.devices and not any(self.devices.values()):
            raise RuntimeError("the graph of this replayable was reset or destroyed; capture it again "
                               "and build a new function with jaxgraph.replayable(...)")

    def add(self, device: int) -> None:
        """Count ``device``'s graph as live (under the lock a destroy callback takes)."""
        with self._lock:
            self.devices[device] = True

    def drop(self, device: int) -> None:
        """Retire ``device``'s graph and forget it, so the device can be added again; never raises."""
        self.retire(device)
        with self._lock:
            self.devices.pop(device, None)

    def retire(self, device: int = -1) -> None:
        """Retire ``device`` (every device when -1, which also closes); never raises."""
        with self._lock:
            if device < 0:
                self.closed = True
            for d in self.devices:
                if device < 0 or d == device:
                    self.devices[d] = False
        if self.graph_id > 0:
            for d, recorded, streams in retire(self.graph_id, device):
                with self._lock:
                    self.uses[d] = (recorded, streams)

    @property
    def recorded(self) -> bool:
        """Whether a stream capture (XLA's command buffer) recorded a graph of it, as far as retired."""
        return any(recorded for recorded, _ in self.uses.values())

    def retire_callback(self, device: int) -> Callable[[], None]:
        """A destroy callback for a graph: retires ``device`` (it holds only this state)."""
        return lambda: self.retire(device)

    def watch(self, source: Any) -> Any:
        """Count ``source``'s device live, and retire it when its graph is reset or destroyed.

        Returns the handle of the graph's destroy callback, which holds only
        this state, never the replayable (no reference cycle: the graph does
        not keep the replayable alive).
        """
        self.add(source.device)
        return source.on_destroy(self.retire_callback(source.device))


# ----------------------------------------------------------------------------
# The FFI call
# ----------------------------------------------------------------------------


def jaxgraph_replay(spec: "ReplaySpec") -> Callable[..., list]:
    """The ``jaxgraph_replay`` FFI call for ``spec`` (``spec.target``): call it on the operands for the outputs.

    ``jaxgraph_replay`` is registered command-buffer compatible: when XLA
    records a command buffer the graph is spliced into it.
    ``jaxgraph_replay_uncaptured`` (``spec.uncaptured``, graphs with
    conditional nodes) is not: XLA runs it outside its command buffers.

    Every call carries its own ``call`` attribute (:func:`call_site`: its
    place among the replays of the function being traced), so two calls on
    the same operands in one function are different operations and XLA never
    merges them: each call replays, as each ``g.replay()`` does. The
    attribute depends on the function alone, not on what the process traced
    before, so every process of a multi-process program lowers the same HLO. Calls are not side-effecting unless
    ``spec.side_effects`` (``has_side_effect`` made a call cost 175 us instead of
    47 on the H100: ``benchmarks/probes/side_effect_cost.py``): XLA removes a call whose
    outputs are unused.
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
        return list(call(*args, graph=graph, call=np.int64(call_site())))

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


def call_site() -> int:
    """The ``call`` attribute of a replay being traced: 1, 2, ... in the order of the traced function's replays.

    Counted per JAX trace (the function being traced: a jit, a ``shard_map``
    or loop body), so it depends on what is agreed between processes, the
    program, and not on a process-wide order: a process that traced another
    function (or an extra replay) first still lowers the same HLO. Outside
    any trace (an eager call, compiled on its own) it is 0. Two calls in
    separately traced functions may carry the same number; XLA may then
    merge them when it inlines both into one computation with the same
    operands, which is what a pure function allows (a graph with effects
    is built with ``side_effects=True``, which XLA never merges).
    """
    found = _tracing_context()
    if found is None:  # a jax without trace_ctx: one process-wide order
        return next(_call_sites)
    trace_ctx, eval_trace = found
    try:
        trace = trace_ctx.trace
    except AttributeError:  # a trace_ctx without .trace: the same
        return next(_call_sites)
    if isinstance(trace, eval_trace):
        return 0
    with _call_lock:
        counter = _call_counts.get(trace)
        if counter is None:
            counter = _call_counts[trace] = itertools.count(1)
        return next(counter)


@functools.cache
def _tracing_context() -> tuple[Any, type] | None:
    """JAX's ``(trace_ctx, EvalTrace)``, looked up once (not on every replay call); ``None`` for a jax without them."""
    try:
        from jax._src import core

        return core.trace_ctx, core.EvalTrace
    except (ImportError, AttributeError):
        return None


_call_sites = itertools.count(1)
_call_lock = threading.Lock()
_call_counts: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()  # trace -> count of its replays


# ----------------------------------------------------------------------------
# The native graph table
# ----------------------------------------------------------------------------


class GraphInfo(NamedTuple):
    """How calls of one registered graph run (:func:`describe_graph`).

    ``paths``: the :class:`~jaxgraph.ReplayPath` each call can take;
    ``conditionals``: conditional nodes at any depth (then the call must stay
    out of XLA's command buffers); ``kernel_nodes``: kernel nodes read for
    binding (conditional bodies included); ``borrowed_exec``: the CUDAGraph's
    own executable is shared (CUDA made no second one of a conditional graph).

    What the graph holds on its device, besides the clone of the template in
    host memory: ``executables`` kept now, at most ``max_executables`` (256,
    fewer when one is large, one for graphs of 4096 kernels or more), each taking ``exec_device_bytes`` of device memory
    (measured at registration; -1 when it could not be). Host memory measured
    at registration from the process's resident size around each step
    (approximate, -1 unknown): ``exec_host_bytes`` (one executable),
    ``clone_host_bytes`` (the clone of the template) and ``binding_host_bytes``
    (the kernel nodes' argument copies and sites). ``rewrite_ns_per_site``
    is the measured host time to rewrite one kernel argument in an executable
    (-1 until a call did), ``instantiate_ns`` the measured host time to make
    and upload one (at registration, then from the calls that made one): the
    two decide when a bound buffer is better copied and whether a new address
    set replaces an executable with a fresh one or rewrites one in place.
    ``device_launchable``: its executables are instantiated launchable from
    the device (graphs of thousands of kernels: the handler still launches
    them from the host, where their launch costs a small constant instead of
    time per node); ``launch_note`` says why not when CUDA refused that, or
    why such a graph's copies go on the stream.
    ``copy_nodes``: copied buffers such a graph copies by copy nodes of its
    executable (which find each call's buffers in an address ring the handler
    fills, ``ffi/replay/copy_ring.h``) instead of on the stream.
    """

    paths: tuple
    conditionals: int
    kernel_nodes: int
    splice_whole_reason: str
    borrowed_exec: bool
    executables: int = 0
    max_executables: int = 0
    exec_device_bytes: int = -1
    rewrite_ns_per_site: float = -1.0
    exec_host_bytes: int = -1
    clone_host_bytes: int = -1
    binding_host_bytes: int = -1
    instantiate_ns: float = -1.0
    device_launchable: bool = False
    launch_note: str = ""
    copy_nodes: int = 0

    @property
    def device_bytes(self) -> int:
        """Device memory its executables take now (-1 when unknown)."""
        return self.executables * self.exec_device_bytes if self.exec_device_bytes >= 0 else -1


class Registration(NamedTuple):
    """What :func:`register` returns: the graph id, which inputs stay operands of the call, how calls run."""

    graph_id: int
    kept: tuple
    info: GraphInfo


def register(source: Any, inputs: Sequence[Any], outputs: Sequence[Any], graph_id: int,
             aliases: Sequence[tuple[int, int]], bind: bool, *, trust_foreign: bool = False,
             drop_unreferenced: bool = False) -> Registration:
    """Enter ``source`` (a :class:`~jaxgraph._graphs.replay_source.ReplaySource`) into the native table.

    ``graph_id`` 0 asks for a new id. ``trust_foreign`` binds outputs that
    kernels jaxgraph did not launch receive as arguments (else they are
    copied); ``drop_unreferenced`` leaves out of the call the inputs no node
    refers to (``Registration.kept`` says which stay). ``aliases`` are every
    ``(input, output)`` pair XLA gives one buffer (``ReplaySpec.aliases``),
    inputs by their index before any is left out; the table copies the inputs
    of those between different static arrays. ``Registration.info`` is
    :func:`describe_graph` of the entry just made.
    """
    # A static array that is both an input and an output is one buffer; the table copies the other aliased inputs.
    distinct = [(i, j) for i, j in aliases if inputs[i].ptr != outputs[j].ptr]
    _driver.ensure_context(source.device)
    graph_id, kept = native("replay").register_graph(
        graph_id, source.device, source.template, [(a.ptr, a.nbytes) for a in inputs],
        [(a.ptr, a.nbytes) for a in outputs], distinct, dict(source.kernels),
        bool(bind), bool(trust_foreign), bool(drop_unreferenced), [int(b) for b in source.bodies],
        int(source.exec), ring_functions(source.device, source.template, native("replay").device_launch_nodes()))
    _memory.when_no_capture(sweep_copy_rings)  # rings of graphs retired since: here no lock is held
    return Registration(int(graph_id), tuple(bool(k) for k in kept), describe_graph(int(graph_id), source.device))


class Entry(NamedTuple):
    """A new replayable's side of the boundary (:func:`enter`).

    ``spec``: the spec its calls use (graph id, the inputs that stay operands,
    ``uncaptured``); ``inputs``: those static inputs; ``kept``: per static input
    given, whether it stays; ``state``: its :class:`ReplayState`, watching the
    graph; ``handle``: the graph's destroy callback; ``ffi_call``: the FFI call
    (:func:`jaxgraph_replay`), ``None`` on the host path.
    """

    spec: "ReplaySpec"
    inputs: tuple
    kept: tuple
    state: ReplayState
    handle: Any
    ffi_call: Callable[..., list] | None


def enter(source: Any, spec: "ReplaySpec", inputs: tuple, outputs: tuple, *, register_graph: bool, bind: bool = True,
          trust_foreign: bool = False, drop_unreferenced: bool = False) -> Entry:
    """Enter a replayable at the boundary: what :func:`~jaxgraph._jax_interop.replay_contract.check_call` returns.

    With ``register_graph`` (``via="ffi"``) its graph goes into the native
    table (:func:`register`: ``bind``, ``trust_foreign``,
    ``drop_unreferenced``), its spec takes the id and the inputs that stay,
    the graph is watched and the FFI call built; until the replayable holds
    the id, a failure takes it out again. Without (the host path) there is no
    entry in the table: graph id 0, only the graph watched.
    """
    if not register_graph:
        state = ReplayState(0)
        return Entry(spec, inputs, (True,) * len(inputs), state, state.watch(source), None)
    graph_id, kept, info = register(source, inputs, outputs, 0, spec.aliases, bind, trust_foreign=trust_foreign,
                                    drop_unreferenced=drop_unreferenced)
    try:
        spec, inputs = _keeping(spec, inputs, kept)
        spec = dataclasses.replace(spec, graph_id=graph_id, uncaptured=info.conditionals > 0)
        state = ReplayState(graph_id)
        handle = state.watch(source)
        if info.borrowed_exec and source.lend_exec is not None:  # the replay launches the CUDAGraph's executable
            source.lend_exec(state)
        return Entry(spec, inputs, kept, state, handle, jaxgraph_replay(spec))
    except BaseException:
        retire(graph_id)  # detaches and unregisters the id on every device
        raise


def _keeping(spec: "ReplaySpec", inputs: tuple, kept: tuple) -> tuple["ReplaySpec", tuple]:
    """``spec`` and ``inputs`` with only the ``kept`` inputs, its aliases renumbered among them.

    The table keeps every input an alias names, as it renumbers its own.
    """
    if all(kept):
        return spec, inputs
    index = {old: new for new, old in enumerate(i for i, k in enumerate(kept) if k)}
    spec = dataclasses.replace(spec, inputs=tuple(s for s, k in zip(spec.inputs, kept) if k),
                               aliases=tuple((index[i], j) for i, j in spec.aliases))
    return spec, tuple(a for a, k in zip(inputs, kept) if k)


def describe_bindings(graph_id: int, device: int) -> list[BufferBinding]:
    """How each static buffer of ``graph_id`` on ``device`` meets XLA's: inputs first."""
    return [binding_from_row(row) for row in native("replay").describe_bindings(graph_id, device)]


def describe_graph(graph_id: int, device: int) -> GraphInfo:
    """How calls of ``graph_id`` on ``device`` run."""
    d = native("replay").describe_graph(graph_id, device)
    return GraphInfo(paths_from_codes(d["paths"]), int(d["conditionals"]), int(d["kernel_nodes"]),
                     d["splice_whole_reason"], bool(d["borrowed_exec"]), int(d["executables"]),
                     int(d["max_executables"]), int(d["exec_device_bytes"]), float(d["rewrite_ns_per_site"]),
                     int(d["exec_host_bytes"]), int(d["clone_host_bytes"]), int(d["binding_host_bytes"]),
                     float(d["instantiate_ns"]), bool(d["device_launchable"]), str(d["launch_note"]),
                     int(d["copy_nodes"]))


def retire(graph_id: int, device: int = -1) -> list[tuple[int, bool, tuple[int, ...]]]:
    """Take ``graph_id`` out of the table on ``device`` (every device when -1); never raises.

    Returns, per device it was still registered on, ``(device, recorded,
    streams)``: whether a stream capture (XLA's command buffer) recorded its
    nodes, and the streams its calls launched on (what freeing its memory must
    wait for). Read after the detach, which stops further calls.
    """
    # At once: the graph's owner may destroy the template and executable
    # a conditional graph's entry uses as soon as this returns.
    _native_quietly("detach_graph", graph_id, device)
    try:
        uses = [(int(d), bool(r), tuple(int(s) for s in streams))
                for d, r, streams in native("replay").graph_uses(graph_id, device)]
    except Exception:  # finalizers and destroy callbacks never raise
        uses = []
    # Drops executables, which must not happen in the middle of a capture.
    _memory.when_no_capture(functools.partial(_native_quietly, "unregister_graph", graph_id, device))
    return uses


def sweep_copy_rings() -> None:
    """Free the copy rings (``ffi/replay/copy_ring.h``) of retired graphs whose calls have finished; never raises.

    A graph's destructor only hands its ring over (it may run under the graph
    table's lock or on XLA's handler thread, where waiting for the device can
    deadlock); this frees them, without waiting, from a thread that holds no
    lock: after a registration, after a retire (``unregister_graph`` sweeps
    too), and at exit. A ring whose calls are still running waits for a later sweep.
    """
    import sys

    if "jaxgraph._replay" not in sys.modules:  # nothing registered: nothing to free
        return
    try:
        native("replay").sweep_copy_rings()
    except Exception:
        pass


def _native_quietly(call: str, graph_id: int, device: int) -> None:
    try:
        getattr(native("replay"), call)(graph_id, device)
    except Exception:  # finalizers and destroy callbacks never raise
        pass


# At exit too: the rings of graphs retired last (a ring still in use is left to the process's end).
atexit.register(lambda: _memory.when_no_capture(sweep_copy_rings))
