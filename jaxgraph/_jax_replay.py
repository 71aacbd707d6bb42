"""Captured CUDA graphs as JAX functions: replay inside ``jax.jit`` on XLA's stream.

A graph captured on static device arrays becomes a function of JAX arrays::

    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):                      # 100 launches on x_static -> y_static
        ...
    step = jaxgraph.replayable(g, inputs=[x_static], outputs=[y_static])
    jax.jit(lambda x: step(x) * 2)(x)            # one FFI call replays the whole graph

``via="ffi"`` (default): one XLA FFI custom call, ``jaxgraph_replay``, whose
handler (``ffi/replay.cc``) copies the operands into the static inputs,
launches the graph on XLA's stream and copies the static outputs into the
results, all in stream order with the XLA operations around it. When XLA
records its own command buffer (CUDA graph), the handler runs under stream
capture and adds the graph as a child-graph node of XLA's graph instead, so a
jitted step of XLA fusions plus the replay becomes one CUDA graph.

``via="callback"``: the same replay from a ``jax.pure_callback`` through host
memory (see :mod:`jaxgraph._jax_callback`); for JAX on the CPU, or to debug.

Which to use: ``"ffi"`` whenever JAX runs on the GPU that holds the graph
(fast: no host round trip, no synchronization, command-buffer friendly);
``"callback"`` when JAX runs on the CPU, or the native extension is not built.

HLO carries only a small graph id: the native library keeps its own clone and
executable of the graph per (id, device). Resetting or collecting the
CUDAGraph retires the id, and a compiled function that still refers to it
fails with a clear error instead of launching freed memory.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from . import _driver
from ._jax_callback import HostReplay, callback_replay

# jax is imported where it is used, so ``import jaxgraph`` stays fast and
# works without it being initialised.

__all__ = ["ReplaySpec", "Replayable", "jaxgraph_replay", "replayable"]

_VIA = ("ffi", "callback")


# ----------------------------------------------------------------------------
# Replayable
# ----------------------------------------------------------------------------


class Replayable:
    """A captured graph as a function of JAX arrays; make one with :func:`replayable`.

    Calling it with one JAX array per static input returns the static outputs
    as new JAX arrays: a single array when the graph has one output, else a
    tuple. It works inside and outside ``jax.jit``, ``lax.scan`` and
    ``lax.fori_loop``, under ``jax.vmap`` (one replay per batch element, in
    sequence) and, when built with ``backward=``, under ``jax.grad``.

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

    .. caution:: With XLA command buffers on, XLA records the replay into its
       own CUDA graph (as a child-graph node) and replays that recording
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
    def _create(cls, spec: "ReplaySpec", *, via: str, host: Callable[..., Any] | None = None,
                backward: Callable[..., Any] | None = None, state: "_ReplayState | None" = None) -> "Replayable":
        """Build from a spec; :func:`replayable` does the device work (tests use this directly)."""
        if backward is not None and not callable(backward):
            raise TypeError(f"backward must be callable (e.g. another replayable), got {type(backward).__name__}")
        _check_via(via)
        self = object.__new__(cls)
        self._spec = spec
        self._via = via
        self._state = state if state is not None else _ReplayState(spec.graph_id)
        self._keep: list = []  # graphs, static arrays and callback handles kept alive
        # Built from the parts, never from self: no reference cycle, so the
        # replayable (and its graph id) goes as soon as the last reference does.
        self._fn = _replay_function(spec, via, host, self._state, backward)
        self.__name__ = "replayable"  # how jax.jit names the function
        self._finalizer = weakref.finalize(self, self._state.retire)
        return self

    # -- introspection ------------------------------------------------------------

    @property
    def in_shapes(self) -> tuple:
        return self._spec.inputs

    @property
    def out_shapes(self) -> tuple:
        return self._spec.outputs

    @property
    def via(self) -> str:
        return self._via

    @property
    def graph_id(self) -> int:
        return self._spec.graph_id

    @property
    def devices(self) -> tuple:
        return tuple(sorted(self._state.devices))

    @property
    def alive(self) -> bool:
        """Whether some graph is still registered (no reset, no :meth:`close`)."""
        return self._state.alive

    def __repr__(self) -> str:
        ins = ", ".join(_fmt(s) for s in self._spec.inputs)
        outs = ", ".join(_fmt(s) for s in self._spec.outputs)
        state = "alive" if self.alive else "retired"
        return f"<jaxgraph.Replayable ({ins}) -> ({outs}) via={self._via} graph={self.graph_id} {state}>"

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
        inputs = _static_arrays(inputs, "inputs")
        outputs = _static_arrays(outputs, "outputs")
        other = ReplaySpec.from_arrays(inputs, outputs, self._spec.graph_id)
        if (other.inputs, other.outputs) != (self._spec.inputs, self._spec.outputs):
            raise ValueError(f"add_device: the arrays are {_fmt_all(other)}, this replayable's are "
                             f"{_fmt_all(self._spec)}")
        device = _graph_device(graph)
        if device in self._state.devices:
            raise ValueError(f"add_device: device {device} already has a graph in this replayable")
        _register(graph, device, inputs, outputs, self._spec.graph_id)
        self._attach(graph, device, inputs, outputs)

    def close(self) -> None:
        """Retire the graph id now (idempotent); calls afterwards raise ``RuntimeError``."""
        self._finalizer()

    def _attach(self, graph: Any, device: int, inputs: tuple, outputs: tuple) -> None:
        """Hold ``graph`` and its static arrays, and retire ``device`` when the graph is reset."""
        self._state.devices[device] = True
        # The destroy callback holds only the state, never this object, so the
        # graph does not keep the replayable alive.
        handle = graph.register_destroy_callback(_Retire(self._state, device))
        # Everything the captured kernels touch must outlive every replay,
        # including replays of an XLA command buffer that recorded this graph
        # and keeps replaying it after a reset: the static arrays, the graph's
        # memory pools and the external inputs of its capture.
        self._keep.append((graph, inputs, outputs, handle, graph._memory_owners()))


def replayable(graph: Any, inputs: Sequence[Any], outputs: Sequence[Any], *, via: str = "ffi",
               backward: Callable[..., Any] | None = None) -> Replayable:
    """Turn a captured graph into a function of JAX arrays, usable inside ``jax.jit``.

    Parameters
    ----------
    graph : jaxgraph.CUDAGraph
        A captured graph.
    inputs : sequence of jaxgraph.DeviceArray
        The static arrays the graph reads. Calling the result with JAX arrays
        copies each argument into its static input before the replay.
    outputs : sequence of jaxgraph.DeviceArray
        The static arrays the graph writes, copied into new JAX arrays after
        the replay. At least one: XLA drops calls without results.
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

    Returns
    -------
    Replayable
        Call it with one JAX array per static input (same shapes and dtypes);
        it returns the outputs, a single array when there is one.

    Raises
    ------
    TypeError
        ``graph`` is not a CUDAGraph, or an input/output is not a device array.
    ValueError
        Unknown ``via``, no outputs, or arrays on another device than the graph.
    RuntimeError
        The graph is not captured, or (``via="ffi"``) the native extension is not built.

    Notes
    -----
    The replay and the static arrays are shared: replaying ``graph`` from
    Python while a compiled function replays it races on the static buffers.
    ``vmap`` replays once per batch element, in sequence.
    """
    via = _check_via(via)
    if backward is not None and not callable(backward):
        raise TypeError(f"backward must be callable (e.g. another replayable), got {type(backward).__name__}")
    inputs = _static_arrays(inputs, "inputs")
    outputs = _static_arrays(outputs, "outputs")
    device = _graph_device(graph)
    for where, arrays in (("inputs", inputs), ("outputs", outputs)):
        for i, a in enumerate(arrays):
            if a.device != device:
                raise ValueError(f"{where}[{i}] is on device {a.device}, the graph on device {device}")
    spec = ReplaySpec.from_arrays(inputs, outputs)
    host = None
    if via == "ffi":
        from ._jax import register_ffi_targets

        register_ffi_targets()
        spec = dataclasses.replace(spec, graph_id=_register(graph, device, inputs, outputs, 0))
    state = _ReplayState(spec.graph_id)
    if via == "callback":
        host = HostReplay(graph, inputs, outputs)
    step = Replayable._create(spec, via=via, host=host, backward=backward, state=state)
    step._attach(graph, device, inputs, outputs)
    return step


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
    """

    inputs: tuple
    outputs: tuple
    graph_id: int = 0

    def __post_init__(self):
        if not self.outputs:
            raise ValueError("a replayable needs at least one output: XLA drops calls without results")

    @classmethod
    def from_arrays(cls, inputs: Sequence[Any], outputs: Sequence[Any], graph_id: int = 0) -> "ReplaySpec":
        """The spec of arrays with ``.shape`` and ``.dtype`` (DeviceArrays, ShapeDtypeStructs)."""
        import jax

        def shapes(arrays):
            return tuple(jax.ShapeDtypeStruct(tuple(a.shape), np.dtype(a.dtype)) for a in arrays)

        return cls(shapes(inputs), shapes(outputs), int(graph_id))

    def check_args(self, args: tuple) -> tuple:
        """Return ``args`` as JAX arrays, or raise naming the first mismatch."""
        import jax

        if len(args) != len(self.inputs):
            raise TypeError(f"replayable takes {len(self.inputs)} array(s) ({_fmt_all(self)}), got {len(args)}")
        checked = []
        for i, (a, want) in enumerate(zip(args, self.inputs)):
            if not isinstance(a, jax.Array):
                try:
                    a = jax.numpy.asarray(a)
                except TypeError:
                    raise TypeError(f"replayable input {i}: expected an array {_fmt(want)}, "
                                    f"got {type(a).__name__}") from None
            if tuple(a.shape) != want.shape:
                raise ValueError(f"replayable input {i}: expected shape {want.shape} ({_fmt(want)}, the "
                                 f"static input's), got shape {tuple(a.shape)}")
            if np.dtype(a.dtype) != want.dtype:
                raise TypeError(f"replayable input {i}: expected dtype {want.dtype} ({_fmt(want)}, the "
                                f"static input's), got {np.dtype(a.dtype)}")
            checked.append(a)
        return tuple(checked)


def jaxgraph_replay(spec: ReplaySpec) -> Callable[..., list]:
    """The ``jaxgraph_replay`` FFI call for ``spec``: call it on the operands for the outputs.

    No ``has_side_effect``: on an H100 it made an empty call cost 114 us instead
    of 37, and the call's real results keep it alive. ``vmap`` replays once per batch element.
    """
    import jax

    from ._jax import register_ffi_targets

    register_ffi_targets()
    call = jax.ffi.ffi_call("jaxgraph_replay", list(spec.outputs), vmap_method="sequential")
    graph = np.int64(spec.graph_id)
    return lambda *args: list(call(*args, graph=graph))


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


class _ReplayState:
    """Which devices of a graph id are live; shared with the graphs' destroy callbacks."""

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
            try:
                from ._jax import native

                native("replay").unregister_graph(self.graph_id, device)
            except Exception:  # finalizers and destroy callbacks never raise
                pass


class _Retire:
    """Destroy callback of a CUDAGraph: retires one device of a replayable's graph id."""

    __slots__ = ("_state", "_device")

    def __init__(self, state: _ReplayState, device: int):
        self._state = state
        self._device = device

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self._state.retire(self._device)


def _register(graph: Any, device: int, inputs: tuple, outputs: tuple, graph_id: int) -> int:
    """Enter ``graph`` (its clone and executable) into the native table for ``device``."""
    from ._jax import native

    _driver.ensure_context(device)
    template = int(graph._replay_template())
    return int(native("replay").register_graph(
        graph_id, device, template, [(a.ptr, a.nbytes) for a in inputs], [(a.ptr, a.nbytes) for a in outputs]))


def _replay_function(spec: ReplaySpec, via: str, host: Callable[..., Any] | None, state: _ReplayState,
                     backward: Callable[..., Any] | None) -> Callable[..., Any]:
    """The function a :class:`Replayable` calls: the FFI call or the callback, maybe with a VJP."""
    def host_call(*args: Any) -> Any:  # the pure_callback target refuses a reset graph
        state.check_alive()
        return host(*args)

    ffi_replay = jaxgraph_replay(spec) if via == "ffi" else None  # built once, not per call

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


def _check_via(via: Any) -> str:
    if via not in _VIA:
        raise ValueError(f"via must be 'ffi' or 'callback', got {via!r}")
    return via


def _graph_device(graph: Any) -> int:
    for attr in ("_replay_template", "_memory_owners", "register_destroy_callback", "replay", "device"):
        if not hasattr(graph, attr):
            raise TypeError(f"graph must be a captured jaxgraph.CUDAGraph, got {type(graph).__name__}")
    return int(graph.device)


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


def _fmt(s: Any) -> str:
    return f"{np.dtype(s.dtype).name}{list(s.shape)}"


def _fmt_all(spec: ReplaySpec) -> str:
    return ", ".join(_fmt(s) for s in spec.inputs) or "no inputs"
