"""Captured CUDA graphs as JAX functions: :func:`replayable` and :class:`Replayable`.

A graph captured on static device arrays becomes a function of JAX arrays::

    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):                      # 100 launches on x_static -> y_static
        ...
    step = jaxgraph.replayable(g, inputs=[x_static], outputs=[y_static])
    jax.jit(lambda x: step(x) * 2)(x)            # one FFI call replays the whole graph

``via="ffi"`` (default): one XLA FFI custom call, ``jaxgraph_replay``
(``_jax_replay.py`` <-> ``ffi/replay.cc``), replays the graph on XLA's stream
in order with the XLA operations around it, its kernels pointed at XLA's own
operand and result buffers (no copies; see :attr:`Replayable.bindings`). When
XLA records its own command buffer, the graph's nodes are spliced into it, so a
jitted step of XLA fusions plus the replay becomes one CUDA graph.

``via="callback"``: the same replay from a ``jax.pure_callback`` through host
memory (``_jax_callback.py``); for JAX on the CPU, or to debug.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

from . import _jax_replay
from ._capture import Graph
from ._graphs import CUDAGraph
from ._jax_callback import HostReplay, callback_replay
from ._jax_replay import BufferBinding, ReplaySpec, ReplayState, fmt_all

__all__ = ["Replayable", "replayable"]

_VIA = ("ffi", "callback")
_BIND = ("auto", "copy")


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

    .. caution:: With XLA command buffers on, XLA records the replay into its
       own CUDA graph (its nodes spliced in) and replays that recording
       without calling jaxgraph again until its buffers move. After the
       CUDAGraph is reset, a compiled function whose recording is still
       current keeps replaying the graph as captured, instead of raising.
       That never touches freed memory: this object keeps the static arrays,
       the graph's memory pools and its capture inputs alive (keep the
       :class:`~jaxgraph.Kernel` objects alive too). Build a new replayable
       and a new jitted function after a reset; with command buffers off
       (``--xla_gpu_enable_command_buffer=``), the old function raises.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        raise RuntimeError("Replayable cannot be constructed directly; use jaxgraph.replayable(...)")

    @classmethod
    def _create(cls, spec: ReplaySpec, *, via: str, host: Callable[..., Any] | None = None,
                backward: Callable[..., Any] | None = None, state: ReplayState | None = None) -> "Replayable":
        """Build from a spec; :func:`replayable` does the device work (tests use this directly)."""
        if backward is not None and not callable(backward):
            raise TypeError(f"backward must be callable (e.g. another replayable), got {type(backward).__name__}")
        _check_choice("via", via, _VIA)
        self = object.__new__(cls)
        self._spec = spec
        self._via = via
        self._state = state if state is not None else ReplayState(spec.graph_id)
        self._keep: list = []  # graphs, static arrays and callback handles kept alive
        self._bind = True      # add_device binds as the first graph did
        # Built from the parts, never from self: no reference cycle, so the
        # replayable (and its graph id) goes as soon as the last reference does.
        self._fn = _replay_function(spec, via, host, self._state, backward)
        self.__name__ = "replayable"  # how jax.jit names the function
        self._finalizer = weakref.finalize(self, self._state.retire)
        return self

    # -- introspection ------------------------------------------------------------

    @property
    def in_shapes(self) -> tuple:
        """The inputs it takes, as ``jax.ShapeDtypeStruct``s (those of the graph's static inputs)."""
        return self._spec.inputs

    @property
    def out_shapes(self) -> tuple:
        """The outputs it returns, as ``jax.ShapeDtypeStruct``s (those of the graph's static outputs)."""
        return self._spec.outputs

    @property
    def via(self) -> str:
        """How it replays: ``"ffi"`` (on XLA's stream) or ``"callback"`` (through host memory)."""
        return self._via

    @property
    def graph_id(self) -> int:
        """Its id in the native graph table: the ``graph`` attribute of its ``jaxgraph_replay`` calls."""
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
        """Per live device, how each static buffer meets XLA's buffer: bound or copied, and why."""
        if self._via != "ffi":
            return {}
        return {d: _jax_replay.describe_bindings(self.graph_id, d)
                for d, live in sorted(self._state.devices.items()) if live}

    def __repr__(self) -> str:
        state = "alive" if self.alive else "retired"
        text = (f"<jaxgraph.Replayable ({fmt_all(self._spec.inputs)}) -> ({fmt_all(self._spec.outputs)}) "
                f"via={self._via} graph={self.graph_id} {state}")
        if self._via == "ffi" and self.alive and self._state.devices:
            device, rows = next(iter(self.bindings.items()))
            text += f"; device {device}: " + "; ".join(str(r) for r in rows)
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
        ValueError
            Shapes or dtypes differ from the first graph's, the device already
            has a graph, or this replayable uses ``via="callback"``.
        """
        if self._via != "ffi":
            raise ValueError("add_device needs via='ffi': the host path replays a single graph")
        self._state.check_alive()
        inputs, outputs = _static_arrays(inputs, "inputs"), _static_arrays(outputs, "outputs")
        other = ReplaySpec.from_arrays(inputs, outputs)
        if (other.inputs, other.outputs) != (self._spec.inputs, self._spec.outputs):
            raise ValueError(f"add_device: the arrays are {fmt_all(other.inputs)} -> {fmt_all(other.outputs)}, "
                             f"this replayable's are {fmt_all(self._spec.inputs)} -> "
                             f"{fmt_all(self._spec.outputs)}")
        source = _replay_source(graph)
        if source.device in self._state.devices:
            raise ValueError(f"add_device: device {source.device} already has a graph in this replayable")
        _check_devices(source.device, inputs, outputs)
        _jax_replay.register(source, inputs, outputs, self.graph_id, _jax_replay.distinct_aliases(self._spec, inputs, outputs),
                             self._bind)
        self._attach(source, inputs, outputs)

    def close(self) -> None:
        """Retire the graph id now (idempotent); calls afterwards raise ``RuntimeError``."""
        self._finalizer()

    def _attach(self, source: Any, inputs: tuple, outputs: tuple) -> None:
        """Hold ``source``'s memory and the static arrays; retire its device when the graph is reset."""
        self._state.devices[source.device] = True
        # The destroy callback holds only the state, never this object, so the
        # graph does not keep the replayable alive.
        handle = source.on_destroy(self._state.retire_callback(source.device))
        # Everything the captured kernels touch must outlive every replay,
        # including replays of an XLA command buffer that recorded this graph
        # and keeps replaying it after a reset: the static arrays, the graph's
        # memory pools and the external inputs of its capture.
        self._keep.append((inputs, outputs, handle, source.owners))


def replayable(graph: CUDAGraph | Graph, inputs: Sequence[Any], outputs: Sequence[Any], *,
               via: str = "ffi", backward: Callable[..., Any] | None = None, bind: str = "auto",
               input_output_aliases: dict[int, int] | None = None,
               side_effects: bool = False) -> Replayable:
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
        cannot see, or when it reads an output's previous contents.
    input_output_aliases : dict of int to int, optional
        ``{input index: output index}``: the output reuses the input's XLA
        buffer (donate the input with ``jax.jit(..., donate_argnums=...)`` to
        avoid XLA's copy). Shapes and dtypes must match.
    side_effects : bool
        Keep every call even when its outputs are unused (``has_side_effect``
        on the FFI call), for graphs whose effects matter beyond their
        outputs. Off by default: XLA then removes a call whose outputs are
        unused, as for any JAX operation, and calls cost less.

    Returns
    -------
    Replayable
        Call it with one JAX array per static input (same shapes and dtypes);
        it returns the outputs, a single array when there is one.

    Raises
    ------
    TypeError
        ``graph`` is not a CUDAGraph or Graph, or an input/output is not a device array.
    ValueError
        Unknown ``via`` or ``bind``, no outputs, arrays on another device than
        the graph, a static array given twice or overlapping another, or bad aliases.
    RuntimeError
        The graph is not captured, or (``via="ffi"``) the native extension is not built.

    Notes
    -----
    The static arrays are shared: replaying ``graph`` from Python while a
    compiled function replays it races on buffers that are copied.
    ``vmap`` replays once per batch element, in sequence.
    """
    _check_choice("via", via, _VIA)
    _check_choice("bind", bind, _BIND)
    if backward is not None and not callable(backward):
        raise TypeError(f"backward must be callable (e.g. another replayable), got {type(backward).__name__}")
    inputs, outputs = _static_arrays(inputs, "inputs"), _static_arrays(outputs, "outputs")
    source = _replay_source(graph)
    _check_devices(source.device, inputs, outputs)
    aliases = _jax_replay.aliases(inputs, outputs, input_output_aliases)
    spec = ReplaySpec.from_arrays(inputs, outputs, aliases=aliases, side_effects=bool(side_effects))
    host = None
    if via == "ffi":
        graph_id = _jax_replay.register(source, inputs, outputs, 0, _jax_replay.distinct_aliases(spec, inputs, outputs),
                                        bind == "auto")
        spec = ReplaySpec.from_arrays(inputs, outputs, graph_id, aliases=aliases, side_effects=bool(side_effects))
    else:
        host = HostReplay(graph, inputs, outputs)
    step = Replayable._create(spec, via=via, host=host, backward=backward, state=ReplayState(spec.graph_id))
    step._bind = bind == "auto"
    step._attach(source, inputs, outputs)
    return step


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _replay_function(spec: ReplaySpec, via: str, host: Callable[..., Any] | None, state: ReplayState,
                     backward: Callable[..., Any] | None) -> Callable[..., Any]:
    """The function a :class:`Replayable` calls: the FFI call or the callback, maybe with a VJP."""
    def host_call(*args: Any) -> Any:  # the pure_callback target refuses a reset graph
        state.check_alive()
        return host(*args)

    ffi_replay = _jax_replay.jaxgraph_replay(spec) if via == "ffi" else None  # built once, not per call

    def primal(*args: Any) -> Any:
        if ffi_replay is not None:
            out = ffi_replay(*args)
        else:
            out = callback_replay(spec.outputs, host_call, *args)
        return out[0] if len(out) == 1 else tuple(out)

    if backward is None:
        return primal
    return _with_vjp(primal, backward, len(spec.inputs), len(spec.outputs) == 1)


def _with_vjp(primal: Callable[..., Any], backward: Callable[..., Any], n_in: int, single: bool):
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


def _check_choice(what: str, value: Any, valid: tuple) -> str:
    if value not in valid:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, valid))}, got {value!r}")
    return value


def _replay_source(graph: Any) -> Any:
    if not isinstance(graph, (CUDAGraph, Graph)):
        raise TypeError(f"graph must be a captured jaxgraph.CUDAGraph or jaxgraph.Graph, got {type(graph).__name__}")
    return graph._replay_source()


def _check_devices(device: int, inputs: tuple, outputs: tuple) -> None:
    for where, arrays in (("inputs", inputs), ("outputs", outputs)):
        for i, a in enumerate(arrays):
            if a.device != device:
                raise ValueError(f"{where}[{i}] is on device {a.device}, the graph on device {device}")


def _static_arrays(arrays: Any, what: str) -> tuple:
    from ._array import DeviceArray, asarray

    if isinstance(arrays, DeviceArray) or hasattr(arrays, "__cuda_array_interface__"):
        arrays = (arrays,)
    if not isinstance(arrays, (list, tuple)):
        raise TypeError(f"{what} must be a list of device arrays, got {type(arrays).__name__}")
    out = []
    for i, a in enumerate(arrays):
        if not isinstance(a, DeviceArray) and not hasattr(a, "__cuda_array_interface__"):
            raise TypeError(f"{what}[{i}] must be a device array (jaxgraph.DeviceArray), got {type(a).__name__}")
        out.append(asarray(a))
    return tuple(out)
