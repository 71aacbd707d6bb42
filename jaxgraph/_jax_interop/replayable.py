"""Captured CUDA graphs as JAX functions: :func:`replayable` and :class:`Replayable`.

A graph captured on static device arrays becomes a function of JAX arrays::

    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):                      # 100 launches on x_static -> y_static
        ...
    step = jaxgraph.replayable(g, inputs=[x_static], outputs=[y_static])
    jax.jit(lambda x: step(x) * 2)(x)            # one FFI call replays the whole graph

``via="ffi"`` (default): one XLA FFI custom call, ``jaxgraph_replay``
(``_jax_interop/replay_boundary.py`` <-> ``ffi/replay/replay.cc``), replays the graph on XLA's stream
in order with the XLA operations around it, its kernels pointed at XLA's own
operand and result buffers (no copies; see :attr:`Replayable.bindings`). When
XLA records its own command buffer, the graph's nodes are spliced into it, so a
jitted step of XLA fusions plus the replay becomes one CUDA graph. A graph with
conditional nodes (branches and loops on the device) cannot go into another
graph: it is launched by ``jaxgraph_replay_uncaptured``, which XLA keeps out of
its command buffers (:attr:`Replayable.replay_paths` says which way a
replayable goes).

``via="callback"``: the same replay from a ``jax.pure_callback`` through host
memory (``_jax_interop/host_callback.py``); for JAX on the CPU, or to debug.

A replayable is built in three steps, one module each: ``replay_contract.py``
checks every argument (:func:`~jaxgraph._jax_interop.replay_contract.check_call`),
``replay_boundary.py`` enters the graph into the native table and builds the
FFI call (:func:`~jaxgraph._jax_interop.replay_boundary.enter`), or
``host_callback.py`` its host replay, and this module puts the parts together.
The function a replayable calls (:func:`replay_function`: the FFI call or the
host callback, maybe with a VJP) is built from those parts (its replay call,
state and backward), never from the replayable itself, so no reference cycle
keeps a replayable (and its graph id) alive after its last reference goes.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

from .._cuda.checks import check_choice, device_arrays, fmt_all
from .._graphs.capture_contexts import Graph
from .._graphs.cuda_graph import CUDAGraph
from .._graphs.replay_source import ReplaySource
from . import replay_boundary as _replay_boundary
from .host_callback import HostReplay, callback_call
from .replay_boundary import BufferBinding, ReplayPath, ReplayState
from .replay_contract import (VIA_CHOICES, ReplaySpec, check_call, check_devices, check_graph_type, check_outputs,
                              shapes_of, source_of)

__all__ = ["Replayable", "release", "replay_function", "replayable", "replayable_of_referenced", "with_vjp"]

def replay_function(call: Callable[..., list], backward: Callable[..., Any] | None, n_in: int,
                    single: bool) -> Callable[..., Any]:
    """``call`` (the FFI call or the host callback) returning its one output or a tuple; ``backward`` its VJP."""
    def primal(*args: Any) -> Any:
        out = call(*args)
        return out[0] if single else tuple(out)

    if backward is None:
        return primal
    return with_vjp(primal, backward, n_in, single)


def with_vjp(primal: Callable[..., Any], backward: Callable[..., Any], n_in: int, single: bool) -> Callable[..., Any]:
    """Wrap ``primal`` in ``jax.custom_vjp`` with ``backward(*inputs, *outputs, *cotangents)``."""
    import jax

    @jax.custom_vjp
    def fn(*args):
        return primal(*args)

    def fwd(*args):
        out = primal(*args)
        return out, (args, out)

    def bwd(residuals, cotangents):
        args, out = residuals
        outs = (out,) if single else tuple(out)
        cts = (cotangents,) if single else tuple(cotangents)
        grads = backward(*args, *outs, *cts)
        if not isinstance(grads, (tuple, list)):
            grads = (grads,)
        if len(grads) != n_in:
            raise ValueError(f"backward returned {len(grads)} cotangent(s); the replayable has {n_in} "
                             "input(s) (return None for an input without a gradient)")
        return tuple(grads)

    fn.defvjp(fwd, bwd)
    return fn


# ----------------------------------------------------------------------------
# Replayable
# ----------------------------------------------------------------------------


class Replayable:
    """A captured graph as a function of JAX arrays; make one with :func:`replayable`.

    Calling it with one JAX array per static input returns the static outputs
    as new JAX arrays: a single array when the graph has one output, else a
    tuple. It works inside and outside ``jax.jit``, ``lax.scan`` and
    ``lax.fori_loop``, under ``jax.vmap`` (one replay per batch element, in
    sequence) and, when built with ``backward=``, under ``jax.grad``. Each call
    is one replay, as each ``g.replay()`` is: XLA never merges two calls.

    It keeps what it replays alive (its graphs, their executables and memory)
    until it is closed or collected, so a function may capture a graph and
    return only the replayable. An explicit ``reset()`` of a graph retires it.

    .. caution:: With XLA command buffers on, XLA records the replay into its
       own CUDA graph (its nodes spliced in) and replays that recording
       without calling jaxgraph again until its buffers move. After the
       CUDAGraph is reset, a compiled function whose recording is still
       current keeps replaying the graph as captured, instead of raising.
       That never touches freed memory: this object keeps the graph, the
       static arrays, the graph's memory pools, its capture inputs and the
       :class:`~jaxgraph.Kernel` objects it launched alive, and once it is
       closed or collected, what such a recording uses is kept until the
       process exits (:meth:`close`). Build a new replayable
       and a new jitted function after a reset; with command buffers off
       (``--xla_gpu_enable_command_buffer=``), the old function raises.

    Attributes
    ----------
    in_shapes, out_shapes : tuple of jax.ShapeDtypeStruct
        Shapes and dtypes of the static inputs and outputs.
    via : str
        ``"ffi"`` or ``"callback"``.
    graph_id : int
        The id in the native graph table (``0`` for ``via="callback"``).
    devices : tuple of int
        CUDA ordinals with a registered graph.
    bindings : dict of int to list of BufferBinding
        Per device, how each static buffer meets XLA's (``via="ffi"``).
    replay_paths : tuple of ReplayPath
        The ways its calls replay the graph inside ``jax.jit``.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        raise RuntimeError("Replayable cannot be constructed directly; use jaxgraph.replayable(...)")

    @classmethod
    def _create(cls, spec: ReplaySpec, *, via: str, host: Callable[..., Any] | None = None,
                backward: Callable[..., Any] | None = None) -> "Replayable":
        """A replayable of ``spec`` alone, holding no graph (tests use this directly).

        ``spec.graph_id`` is registered elsewhere or not at all; ``host`` is
        the host function of ``via="callback"``. :func:`replayable` builds
        its own from the boundary's :class:`~jaxgraph._jax_interop.replay_boundary.Entry`.
        """
        if backward is not None and not callable(backward):
            raise TypeError(f"backward must be callable (e.g. another replayable), got {type(backward).__name__}")
        check_choice("via", via, VIA_CHOICES)
        state = ReplayState(spec.graph_id)
        call = _replay_boundary.jaxgraph_replay(spec) if via == "ffi" else callback_call(spec.outputs, host, state)
        return cls._assemble(spec, via, state, call, backward, host=host)

    @classmethod
    def _assemble(cls, spec: ReplaySpec, via: str, state: ReplayState, call: Callable[..., list],
                  backward: Callable[..., Any] | None, *, host: Any = None, bind: bool = True,
                  trust_foreign: bool = False, held: tuple | None = None) -> "Replayable":
        """The replayable of its parts: ``spec``, the liveness ``state`` and the replay ``call``.

        ``bind`` and ``trust_foreign`` are how the first graph was registered:
        :meth:`add_device` registers the others the same way. ``held`` is what
        the first graph's replays need kept alive (:func:`held_for`).
        """
        self = object.__new__(cls)
        self._spec = spec
        self._via = via
        self._state = state
        self._keep: list = [] if held is None else [held]  # graphs, static arrays and callback handles kept alive
        self._bind = bool(bind)
        self._trust_foreign = bool(trust_foreign)
        # The finalizer holds the state, the list of what is kept and the host replay, never self
        # (close() runs it too).
        self._finalizer = weakref.finalize(self, release, state, self._keep, host)
        try:
            # Built from the parts, never from self: no reference cycle, so the
            # replayable (and its graph id) goes as soon as the last reference does.
            self._fn = replay_function(call, backward, len(spec.inputs), len(spec.outputs) == 1)
        except BaseException:
            self.close()  # until the replayable is returned, a failure must not leave its graph id registered
            raise
        self.__name__ = "replayable"  # how jax.jit names the function
        return self

    # -- introspection ------------------------------------------------------------

    @property
    def in_shapes(self) -> tuple:
        """The inputs it takes, as :class:`jax.ShapeDtypeStruct` objects (those of the graph's static inputs)."""
        return self._spec.inputs

    @property
    def out_shapes(self) -> tuple:
        """The outputs it returns, as :class:`jax.ShapeDtypeStruct` objects (those of the graph's static outputs)."""
        return self._spec.outputs

    @property
    def via(self) -> str:
        """How it replays: ``"ffi"`` (on XLA's stream) or ``"callback"`` (through host memory)."""
        return self._via

    @property
    def graph_id(self) -> int:
        """Its id in the native graph table, the ``graph`` attribute of its ``jaxgraph_replay`` calls."""
        return self._spec.graph_id

    @property
    def devices(self) -> tuple:
        """The CUDA device ordinals it holds a graph for, sorted."""
        return tuple(sorted(self._state.devices))

    @property
    def alive(self) -> bool:
        """Whether some graph is still registered (no reset, no :meth:`close`)."""
        return self._state.alive

    @property
    def bindings(self) -> dict[int, list[BufferBinding]]:
        """Per live device, how each static buffer meets XLA's buffer (bound, copied or unused) and why."""
        if self._via != "ffi":
            return {}
        return {d: _replay_boundary.describe_bindings(self.graph_id, d) for d in self._state.live_devices}

    @property
    def replay_paths(self) -> tuple[ReplayPath, ...]:
        """The ways calls replay the graph inside ``jax.jit`` (:class:`~jaxgraph.ReplayPath`).

        ``(LAUNCH, SPLICE_NODES)`` for most graphs: launched on XLA's stream,
        or spliced node by node when XLA records a command buffer;
        ``(LAUNCH, SPLICE_WHOLE)`` when the nodes cannot be added one by one;
        ``(UNCAPTURED_LAUNCH,)`` for a graph with conditional nodes;
        ``(HOST_CALLBACK,)`` for ``via="callback"``. Empty once retired.
        """
        if self._via != "ffi":
            return (ReplayPath.HOST_CALLBACK,)
        live = self._state.live_devices
        return _replay_boundary.describe_graph(self.graph_id, live[0]).paths if live else ()

    def __repr__(self) -> str:
        state = "alive" if self.alive else "retired"
        text = (f"<jaxgraph.Replayable ({fmt_all(self._spec.inputs)}) -> ({fmt_all(self._spec.outputs)}) "
                f"via={self._via} graph={self.graph_id} {state}")
        try:
            if self.alive:
                text += " paths=" + ("|".join(p.value for p in self.replay_paths) or "none (no graph registered)")
            if self._via == "ffi" and self.alive and self._state.devices:
                device, rows = next(iter(self.bindings.items()))
                text += f"; device {device}: " + "; ".join(str(r) for r in rows)
        except (RuntimeError, ValueError, StopIteration):  # retired by another thread meanwhile
            text += " (retiring)"
        return text + ">"

    # -- calling ------------------------------------------------------------------

    def __call__(self, *args: Any) -> Any:
        """Replay on ``args`` (one JAX array per static input, shapes and dtypes checked)."""
        args = self._spec.check_args(args)
        self._state.check_alive()
        return self._fn(*args)

    # -- devices and lifetime -------------------------------------------------------

    def add_device(self, graph: Any, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        """Register the same computation captured on another device (``via="ffi"`` only).

        The handler picks the graph of the device XLA runs the call on, so one
        replayable serves e.g. every device of a ``pmap`` or sharded ``jit``.

        Raises
        ------
        TypeError
            ``graph`` is not a CUDAGraph or Graph, or an input/output is not a device array.
        ValueError
            Shapes or dtypes differ from the first graph's, the device already
            has a graph, arrays are on another device than the graph, or this
            replayable uses ``via="callback"``.
        RuntimeError
            This replayable was closed or its graphs reset, or ``graph`` is not captured.
        """
        if self._via != "ffi":
            raise ValueError("add_device needs via='ffi': the host path replays a single graph")
        check_graph_type(graph)
        inputs, outputs = device_arrays(inputs, "inputs"), device_arrays(outputs, "outputs")
        check_outputs(outputs)
        if (shapes_of(inputs), shapes_of(outputs)) != (self._spec.inputs, self._spec.outputs):
            raise ValueError(f"add_device: the arrays are {fmt_all(inputs)} -> {fmt_all(outputs)}, "
                             f"this replayable's are {fmt_all(self._spec.inputs)} -> "
                             f"{fmt_all(self._spec.outputs)}")
        self._state.check_alive()
        source = source_of(graph)
        if source.device in self._state.devices:
            raise ValueError(f"add_device: device {source.device} already has a graph in this replayable")
        check_devices(source.device, inputs, outputs)
        info = _replay_boundary.register(source, inputs, outputs, self.graph_id, self._spec.aliases, self._bind,
                                         trust_foreign=self._trust_foreign).info
        if info.conditionals and not self._spec.uncaptured:
            self._state.drop(source.device)  # retire what was registered; the device may be added again
            raise ValueError(f"add_device: the graph on device {source.device} has conditional nodes and the "
                             "first device's has none, so this replayable's calls may be recorded into XLA's "
                             "command buffers, where a conditional graph cannot go; build the replayable "
                             "from a graph with conditional nodes")
        self._attach(source, inputs, outputs)

    def close(self) -> None:
        """Retire the graph id and let go of the device memory it holds, now (idempotent).

        What goes: the native table's entries (clone, executables), and this
        object's hold on the graphs, static arrays, graph memory pools and
        kernels, so their memory is freed unless something else still holds
        it (the caller's own references to the static arrays, say). A static
        array is freed only after the replays already queued on XLA's stream.
        Collecting the replayable does the same.

        Afterwards, calling it (or :meth:`add_device`) raises ``RuntimeError``,
        and so does a compiled function that calls it, each time jaxgraph's
        handler runs. One exception: where XLA recorded the replay into its
        own command buffer, XLA replays that recording without asking
        jaxgraph (until its buffers move): its kernels, static arrays and pool
        memory are then kept until the process exits instead of freed, so the
        recording never touches freed memory or unloaded code.
        """
        self._finalizer()

    def _attach(self, source: ReplaySource, inputs: tuple, outputs: tuple) -> None:
        """Hold ``source``'s graph, memory and the static arrays; retire its device when the graph is reset."""
        self._keep.append(held_for(source, inputs, outputs, self._state.watch(source)))


def held_for(source: ReplaySource, inputs: tuple, outputs: tuple, handle: Any) -> tuple:
    """What a replayable keeps of a graph it replays: ``source``'s graph, static arrays, destroy ``handle``, owners.

    Everything the captured kernels touch must outlive every replay,
    including replays of an XLA command buffer that recorded this graph and
    keeps replaying it after a reset: the static arrays, the graph's memory
    pools, the external inputs and kernels of its capture. The graph object
    itself is held too: a replayable returned without its graph must keep
    working, so only an explicit reset() retires it, and everything goes when
    the replayable does.
    """
    return (source.graph, inputs, outputs, handle, source.owners)


# What replayables that XLA recorded into a command buffer held, kept until exit: the recording
# launches the graph's nodes (its kernels, static arrays, pool memory) without asking jaxgraph.
_KEPT_FOR_RECORDINGS: list = []


def release(state: ReplayState, keep: list, host: Any = None) -> None:
    """Retire ``state``'s graph id everywhere and let go of ``keep`` (a replayable's finalizer; never raises).

    Kept until exit where a stream capture recorded the graph (see
    :meth:`Replayable.close`); otherwise each static array jaxgraph
    allocated is freed only after the work queued by then on every stream
    its replays launched on (XLA's), not just its own stream's. ``host``
    (``via="callback"``, whose replays finish before they return) lets go
    of its graph and arrays too.
    """
    state.retire()
    if host is not None and hasattr(host, "close"):
        host.close()
    held, keep[:] = list(keep), []
    if state.recorded:
        _KEPT_FOR_RECORDINGS.append(held)
        return
    try:
        _order_frees_after_replays(state, held)
    except Exception:  # finalizers never raise
        pass


def _order_frees_after_replays(state: ReplayState, held: list) -> None:
    """``record_stream`` each static array of ``held`` on the streams its device's replays used."""
    from .._cuda.memory import Allocation
    from .._cuda.stream import Stream

    for _graph, inputs, outputs, _handle, _owners in held:
        for array in (*inputs, *outputs):
            _, streams = state.uses.get(array.device, (False, ()))
            if not isinstance(array.owner, Allocation):
                continue  # memory another library owns and frees
            for handle in streams:
                array.record_stream(Stream.from_handle(handle, device=array.device))


def replayable(graph: CUDAGraph | Graph, inputs: Sequence[Any], outputs: Sequence[Any], *,
               via: str = "ffi", backward: Callable[..., Any] | None = None, bind: str = "auto",
               input_output_aliases: dict[int, int] | None = None,
               side_effects: bool = False, trust_foreign_kernels: bool = False) -> Replayable:
    """Turn a captured graph into a function of JAX arrays, usable inside ``jax.jit``.

    Parameters
    ----------
    graph : jaxgraph.CUDAGraph or jaxgraph.Graph
        A captured graph.
    inputs : sequence of jaxgraph.DeviceArray
        The static arrays the graph reads. Each call passes one JAX array per
        static input; the replay reads it in place (or, where that cannot be
        done safely, from a copy in the static input: see ``bind``).
    outputs : sequence of jaxgraph.DeviceArray
        The static arrays the graph writes, returned as new JAX arrays. At
        least one: XLA drops calls without results. Each replay must write
        every element of each output (XLA's result buffers are fresh), as for
        any function's result; an output that also appears in ``inputs`` is
        updated in place from that input's value.
    via : {"ffi", "callback"}
        ``"ffi"`` replays on XLA's stream through the ``jaxgraph_replay`` FFI
        call (JAX on the GPU; fast, command-buffer friendly). ``"callback"``
        replays through ``jax.pure_callback`` and host memory (works with JAX
        on the CPU; two host round trips per call).
    backward : callable, optional
        Makes the function differentiable with ``jax.custom_vjp``. Called as
        ``backward(*inputs, *outputs, *output_cotangents)``, it returns the
        cotangent of each input (a single array when there is one input;
        ``None`` for an input with no gradient), typically another
        replayable made from a captured backward graph.
    bind : {"auto", "copy"}
        ``"auto"`` points the graph's kernels at XLA's buffers wherever that is
        safe and copies the rest (:attr:`Replayable.bindings` says which and
        why); ``"copy"`` copies every buffer in and out of the static arrays.
        Use ``"copy"`` when the graph reaches a static array only through a
        pointer stored in device memory (a pointer table), which jaxgraph
        cannot see, or when it reads an output's previous contents. Kernels
        inside the bodies of conditional nodes are bound like the others.
    input_output_aliases : dict of int to int, optional
        ``{input index: output index}``: the output reuses the input's XLA
        buffer (donate the input with ``jax.jit(..., donate_argnums=...)`` to
        avoid XLA's copy). Shapes and dtypes must match.
    side_effects : bool
        Keep every call even when its outputs are unused (``has_side_effect``
        on the FFI call), for graphs whose effects matter beyond their
        outputs. Off by default: XLA then removes a call whose outputs are
        unused, as for any JAX operation, and calls cost less.
    trust_foreign_kernels : bool
        With ``bind="auto"``, also bind the outputs that kernels jaxgraph did
        not launch (CuPy, torch, Triton, ... kernels captured in the graph)
        receive as kernel arguments. By default those buffers are copied: such
        a kernel may also reach a buffer through memory jaxgraph cannot see (a
        pointer table in device memory, a field of a struct it reads through a
        pointer), and a bound buffer would then be silently wrong. Set it only
        when every foreign kernel in the graph gets the static outputs it
        writes as plain pointer arguments (elementwise kernels, softmax,
        simple Triton kernels do). Inputs those kernels receive stay copied
        either way: jaxgraph cannot tell whether they write them.

    Returns
    -------
    Replayable
        Call it with one JAX array per static input (same shapes and dtypes);
        it returns the outputs, a single array when there is one.

    Raises
    ------
    TypeError
        ``graph`` is not a CUDAGraph or Graph, an input/output is not a device
        array, ``backward`` is not callable, or ``input_output_aliases`` is not a dict.
    ValueError
        Unknown ``via`` or ``bind``, ``trust_foreign_kernels`` with ``bind="copy"``,
        no outputs, arrays on another device than the graph, a static array
        given twice or overlapping another, or bad aliases.
    RuntimeError
        The graph is not captured, or (``via="ffi"``) the native extension is
        not built. Checked after the arguments: a wrong call says what is wrong
        with it first.

    Notes
    -----
    The static arrays are shared: replaying ``graph`` from Python while a
    compiled function replays it races on buffers that are copied.
    ``vmap`` replays once per batch element, in sequence.
    """
    step, _ = _build(graph, inputs, outputs, via=via, backward=backward, bind=bind,
                     input_output_aliases=input_output_aliases, side_effects=side_effects,
                     trust_foreign_kernels=trust_foreign_kernels, drop_unreferenced=False)
    return step


def replayable_of_referenced(graph: CUDAGraph | Graph, inputs: Sequence[Any], outputs: Sequence[Any],
                             **options: Any) -> tuple[Replayable, tuple[bool, ...]]:
    """:func:`replayable` over only the inputs some node of ``graph`` refers to.

    Returns the replayable, called with the kept inputs only, and one flag per
    input saying whether it was kept. An input the graph shares with an
    output, or names in ``input_output_aliases``, is always kept. With
    ``via="callback"`` every input is kept.
    """
    return _build(graph, inputs, outputs, drop_unreferenced=True, **options)


def _build(graph: Any, inputs: Sequence[Any], outputs: Sequence[Any], *, via: str = "ffi",
           backward: Callable[..., Any] | None = None, bind: str = "auto",
           input_output_aliases: dict[int, int] | None = None, side_effects: bool = False,
           trust_foreign_kernels: bool = False, drop_unreferenced: bool) -> tuple[Replayable, tuple[bool, ...]]:
    """Check the arguments (the contract), enter the graph at the boundary, and build the replayable from the parts."""
    source, inputs, outputs, spec = check_call(graph, inputs, outputs, via=via, bind=bind, backward=backward,
                                               input_output_aliases=input_output_aliases,
                                               trust_foreign_kernels=trust_foreign_kernels, side_effects=side_effects)
    entry = _replay_boundary.enter(source, spec, inputs, outputs, register_graph=via == "ffi", bind=bind == "auto",
                                   trust_foreign=trust_foreign_kernels, drop_unreferenced=drop_unreferenced)
    host = HostReplay(graph, inputs, outputs) if via == "callback" else None
    replay = entry.ffi_call if host is None else callback_call(entry.spec.outputs, host, entry.state)
    step = Replayable._assemble(entry.spec, via, entry.state, replay, backward, host=host, bind=bind == "auto",
                                trust_foreign=trust_foreign_kernels,
                                held=held_for(source, entry.inputs, outputs, entry.handle))
    return step, entry.kept
