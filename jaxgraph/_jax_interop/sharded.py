"""Several GPUs: one graph per device, replayed inside ``jax.shard_map`` and ``jax.pmap``.

A CUDA graph belongs to the device it was captured on. To run a captured step
on every GPU of a ``jax.shard_map`` (or ``jax.pmap``, which JAX runs as one),
:func:`capture_per_device` captures the same kernel sequence once per local
device, each on static arrays and a memory pool of that device, and returns a
:class:`ShardedGraph`: one function of *shard-local* JAX arrays::

    def step(x):                       # called once per device, with that device current
        y = jaxgraph.empty(x.shape)    # from the graph's pool, on that device
        add_one[blocks, 256](y, x, n)
        return y

    sg = jaxgraph.capture_per_device(step, [jax.ShapeDtypeStruct((n,), jnp.float32)])
    mesh = jax.make_mesh((2,), ("x",))
    f = jax.jit(jax.shard_map(sg, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    y = f(x)                           # x: (2 n,) over two GPUs; each replays its graph on its half

How each shard finds its graph: the graphs share one id in the native table
(``ffi/replay/replay.cc``), one entry per device. XLA runs the shard program on every
device, and each ``jaxgraph_replay`` call reads the device ordinal XLA gives it
(the FFI call context) and replays that device's graph, its kernels bound to
that device's buffers (zero-copy binding works per device). Nothing else is
shared between devices, and no cache is keyed by buffer address alone (the
same address can exist on two devices: Warp's graph cache mixed devices up
that way, warp#1181, mujoco#3191). A device without a graph is a clear XLA
error naming the devices that have one, never a launch on the wrong device;
:meth:`ShardedGraph.check_devices` says so before anything is compiled.

Several processes (``jax.distributed``, one per GPU or host): each process
captures for its own devices (the default, or ``devices=mesh``: a global
mesh stands for this process's part), and :meth:`ShardedGraph.check_devices`
on the global mesh is collective: every process agrees that each has its
graphs, with the same shapes and graph id, or every process raises the same
error (``_jax_interop/processes.py``), rather than one failing while the others wait in
a collective.

Lifetime: the sharded graph owns its graphs, their pools and the static arrays
on every device. :meth:`ShardedGraph.close` retires them at once (compiled
functions then fail with a clear error); the memory goes back to every device
when the object is gone (``del sg``, with the jitted functions that hold it),
because an XLA command buffer that recorded a replay may still use it until then.

Capturing one device's part (static inputs, the graph, its outputs):
:func:`capture_on` makes ``device`` current, allocates the static inputs
there, captures ``fn`` on them into a new :class:`~jaxgraph.CUDAGraph` and
restores the previous device, once per device.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .._cuda import driver as _driver
from .._cuda.array import DeviceArray
from .._cuda.checks import capture_mode, check_choice, fmt_all
from .._graphs.capture_contexts import graph as capture_graph
from .._graphs.cuda_graph import CUDAGraph
from . import processes as _processes
from .devices import CUDA_PLATFORMS, cuda_ordinal, device_names, device_ordinals
from .replay_contract import BIND_CHOICES, check_alias_indices
from .replayable import Replayable, replayable

__all__ = [
    "DeviceCapture",
    "ShardedGraph",
    "capture_on",
    "capture_per_device",
    "cuda_ordinal",
    "device_ordinals",
    "release_captures",
    "static_input_shapes",
    "static_outputs",
]

class DeviceCapture(NamedTuple):
    """One device's part of a :class:`ShardedGraph`: its graph and static arrays."""

    graph: CUDAGraph | None
    inputs: tuple
    outputs: tuple


def capture_on(device: int, fn: Callable[..., Any], shapes: tuple, mode: str) -> DeviceCapture:
    """Allocate the static inputs on ``device`` and capture ``fn`` there; the previous device is restored."""
    from .._cuda.array import zeros

    previous = _driver.current_device()
    _driver.set_device(device)
    try:
        inputs = tuple(zeros(shape, dtype) for shape, dtype in shapes)
        g = CUDAGraph()
        with warnings.catch_warnings():
            # An empty capture is an error here, with a clearer message than the warning.
            warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
            with capture_graph(g, capture_error_mode=mode):
                result = fn(*inputs)
        try:
            outputs = static_outputs(result)
            if g.node_count(nested=False) == 0:
                raise RuntimeError(f"capture_per_device: fn launched nothing on device {device}; it must "
                                   "launch its kernels on the current stream (jaxgraph's default), with no "
                                   "stream= of another device")
        except BaseException:
            g.reset()
            raise
        return DeviceCapture(g, inputs, outputs)
    finally:
        _driver.set_device(previous)


def static_outputs(result: Any) -> tuple:
    """What ``fn`` returned, as a tuple of device arrays (its static outputs)."""
    if isinstance(result, DeviceArray) or hasattr(result, "__cuda_array_interface__"):
        result = (result,)
    if not isinstance(result, (list, tuple)) or not result:
        raise TypeError("fn must return its static outputs: a device array or a non-empty tuple of them, got "
                        f"{type(result).__name__}")
    return tuple(result)


def static_input_shapes(in_shapes: Any) -> tuple:
    """``in_shapes`` as ``(shape, dtype)`` pairs, checked."""
    if not isinstance(in_shapes, (list, tuple)):
        raise TypeError("in_shapes must be a list of jax.ShapeDtypeStruct (one per static input), got "
                        f"{type(in_shapes).__name__}")
    out = []
    for i, s in enumerate(in_shapes):
        if not hasattr(s, "shape") or not hasattr(s, "dtype"):
            raise TypeError(f"in_shapes[{i}] must have a shape and a dtype (jax.ShapeDtypeStruct), "
                            f"got {type(s).__name__}")
        out.append((tuple(int(n) for n in s.shape), np.dtype(s.dtype)))
    return tuple(out)


def release_captures(step: Any, parts: dict[int, DeviceCapture]) -> None:
    """Undo a partial capture: close the replayable ``step`` (if any) and reset every graph; never raises."""
    try:
        if step is not None:
            step.close()
        for part in parts.values():
            if part.graph is not None:
                part.graph.reset()
    except Exception:  # the capture's own error is the one to report
        pass


# ----------------------------------------------------------------------------
# ShardedGraph
# ----------------------------------------------------------------------------


class ShardedGraph:
    """The same captured computation on several devices, as one function of shard-local JAX arrays.

    Make one with :func:`capture_per_device`. Call it inside ``jax.shard_map``
    or ``jax.pmap`` with one array per static input, shaped like one shard
    (the static input's shape): on each device it replays that device's graph
    and returns that device's outputs. Outside them it replays on the device
    its arguments live on. :meth:`shard_map` builds the jitted ``shard_map``
    after checking every device of the mesh has a graph.

    Inside ``shard_map`` the outputs vary over the mesh axes the inputs vary
    over, as for any JAX operation. A graph whose outputs differ between
    devices for the same inputs (state kept in static arrays, a per-device
    generator) should get inputs that vary over those axes (``jax.lax.pcast``
    or ``pvary``), so JAX does not take its outputs for replicated.

    Attributes
    ----------
    devices : tuple of int
        The CUDA ordinals with a graph, in capture order.
    in_shapes, out_shapes : tuple of jax.ShapeDtypeStruct
        Per-shard shapes and dtypes of the static inputs and outputs.
    replayable : Replayable
        The underlying replayable (one graph id, one graph per device).
    bindings : dict of int to list of BufferBinding
        Per device, how each static buffer meets XLA's buffer.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        raise RuntimeError("ShardedGraph cannot be constructed directly; use jaxgraph.capture_per_device(...)")

    @classmethod
    def _create(cls, step: Replayable, parts: dict[int, DeviceCapture]) -> "ShardedGraph":
        """Wrap ``step`` and each device's capture (tests pass graph-less parts to lower without a GPU)."""
        if not parts:
            raise ValueError("a ShardedGraph needs at least one device")
        self = object.__new__(cls)
        self._step = step
        self._parts = dict(parts)
        self._closed = False
        self.__name__ = "sharded_graph"  # how jax.jit and shard_map name the function
        return self

    # -- introspection --------------------------------------------------------------

    @property
    def devices(self) -> tuple[int, ...]:
        """The CUDA device ordinals that have a graph, in capture order."""
        return tuple(self._parts)

    @property
    def in_shapes(self) -> tuple:
        """The shard-local inputs it takes, as ``jax.ShapeDtypeStruct`` objects."""
        return self._step.in_shapes

    @property
    def out_shapes(self) -> tuple:
        """The shard-local outputs it returns, as ``jax.ShapeDtypeStruct`` objects."""
        return self._step.out_shapes

    @property
    def replayable(self) -> Replayable:
        """The :class:`Replayable` holding every device's graph under one id."""
        return self._step

    @property
    def graph_id(self) -> int:
        """The id all its devices' graphs share in the native graph table."""
        return self._step.graph_id

    @property
    def alive(self) -> bool:
        """Whether :meth:`close` was not called and some device's graph is still registered."""
        return not self._closed and self._step.alive

    @property
    def bindings(self) -> dict:
        """Per device, how each static buffer meets XLA's buffer (:attr:`Replayable.bindings`)."""
        return self._step.bindings

    def graph(self, device: Any) -> CUDAGraph:
        """The :class:`CUDAGraph` captured on ``device`` (an ordinal or a JAX device)."""
        return self._part(device).graph

    def inputs(self, device: Any) -> tuple:
        """The static input arrays on ``device``."""
        return self._part(device).inputs

    def outputs(self, device: Any) -> tuple:
        """The static output arrays on ``device``."""
        return self._part(device).outputs

    def __repr__(self) -> str:
        state = "alive" if self.alive else "closed" if self._closed else "retired"
        return (f"<jaxgraph.ShardedGraph ({fmt_all(self.in_shapes)}) -> ({fmt_all(self.out_shapes)}) on "
                f"devices {device_names(self.devices)} graph={self.graph_id} {state}>")

    # -- calling ----------------------------------------------------------------------

    def __call__(self, *args: Any) -> Any:
        """Replay on shard-local ``args`` (one JAX array per static input); see the class docstring."""
        self._check_open()
        for i, a in enumerate(args):
            self._check_placed(i, a)
        return self._step(*args)

    def replay(self, device: Any = None) -> None:
        """Replay from the host on ``device``'s current stream (every device when ``None``).

        As :meth:`CUDAGraph.replay`: it reads and writes the static arrays, no JAX involved.
        """
        self._check_open()
        for d in (self.devices if device is None else (cuda_ordinal(device),)):
            self._part(d).graph.replay()

    def check_devices(self, devices: Any, *, timeout_s: float = 300.0) -> tuple[int, ...]:
        """Check that every device of ``devices`` has a graph; return this process's CUDA ordinals.

        When ``devices`` span several processes (a global mesh under
        ``jax.distributed``), this process checks its own devices and the
        processes compare what they found through JAX's distributed runtime:
        it is then collective (call it on every process, e.g. before jitting
        the step; :meth:`shard_map` does) and raises the same error on every
        process when any process lacks a graph for one of its mesh devices,
        or when the graph ids or shapes differ between processes. Otherwise
        one process could fail while the others wait in the step's
        collectives, or the processes could compile different programs.

        Parameters
        ----------
        devices : jax.sharding.Mesh, or a device, or a sequence of devices
            JAX devices (``jax.devices()``) or CUDA ordinals, e.g. the mesh a
            ``shard_map`` of this graph will run on.
        timeout_s : float
            How long to wait for the other processes (several processes only).

        Raises
        ------
        TypeError
            ``devices`` is neither a mesh, a device nor a sequence of them.
        ValueError
            A device has no graph here or is not a CUDA device; with several
            processes, any process's problem, or ids or shapes that differ
            between processes (every process raises the same message).
        RuntimeError
            This sharded graph was closed (one process), or another process
            did not reach this check within ``timeout_s``.
        """
        local, spans = _processes.local_devices(devices)
        if not spans:
            return self._check_local(local)
        facts = {"graph": self.graph_id, "shapes": f"({fmt_all(self.in_shapes)}) -> ({fmt_all(self.out_shapes)})"}
        # Keyed by the devices (the same on every process); ids and shapes may differ: compared, not keyed.
        subject = [[str(getattr(d, "id", d)), getattr(d, "process_index", None)]
                   for d in _processes.device_list(devices)]
        return _processes.check_everywhere("check_devices", "this ShardedGraph", lambda: self._check_local(local),
                                           facts, {"shapes": "shard shapes", "graph": "graph ids"},
                                           subject=subject, timeout_s=timeout_s, advice=_CROSS_PROCESS_ADVICE)

    def _check_local(self, devices: list) -> tuple[int, ...]:
        """:meth:`check_devices` on this process's devices."""
        self._check_open()
        ordinals = device_ordinals(devices)
        missing = [d for d in ordinals if d not in self._parts]
        if missing:
            raise ValueError(f"no graph for device{'s' if len(missing) > 1 else ''} {device_names(missing)}: this "
                             f"ShardedGraph was captured on device(s) {device_names(self.devices)}; capture it on "
                             "every device it runs on (jaxgraph.capture_per_device(..., devices=mesh.devices.flat))")
        return ordinals

    def shard_map(self, mesh: Any, in_specs: Any, out_specs: Any, **kwargs: Any) -> Callable[..., Any]:
        """``jax.jit(jax.shard_map(self, mesh=mesh, in_specs=..., out_specs=...))``, checked first.

        Raises ``ValueError`` (see :meth:`check_devices`, which also lists its
        ``TypeError`` and ``RuntimeError``) when a device of ``mesh`` has no
        graph, instead of an error when the function runs.
        Other keyword arguments go to ``jax.shard_map``.
        """
        import jax

        self.check_devices(mesh)  # collective when the mesh spans several processes
        return jax.jit(jax.shard_map(self, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **kwargs))

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Retire every device's graph now (idempotent); calls afterwards raise.

        The graphs are reset and the native table lets go of its copies. The
        pools and static arrays are freed on every device when this object is
        gone: until then an XLA command buffer that recorded a replay may
        still run it (see :class:`~jaxgraph.Replayable`).
        """
        if self._closed:
            return
        self._closed = True
        self._step.close()
        for part in self._parts.values():
            if part.graph is not None:
                part.graph.reset()

    # -- helpers ----------------------------------------------------------------------------

    def _part(self, device: Any) -> DeviceCapture:
        d = cuda_ordinal(device)
        part = self._parts.get(d)
        if part is None:
            raise ValueError(f"no graph for device {d}: this ShardedGraph has device(s) {device_names(self.devices)}")
        return part

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this ShardedGraph was closed; capture again with jaxgraph.capture_per_device(...)")

    def _check_placed(self, index: int, value: Any) -> None:
        """A concrete JAX array must live on devices that have a graph (tracers are checked by XLA)."""
        import jax

        if not isinstance(value, jax.Array) or isinstance(value, jax.core.Tracer):
            return
        for device in sorted(value.devices(), key=lambda d: d.id):
            platform = getattr(device, "platform", "?")
            if platform not in CUDA_PLATFORMS:
                raise ValueError(f"argument {index} is on {device}, a {platform} device: a ShardedGraph replays "
                                 "on CUDA devices (JAX with CUDA)")
            ordinal = cuda_ordinal(device)
            if ordinal not in self._parts:
                raise ValueError(f"argument {index} is on {device} (CUDA device {ordinal}), which has no graph "
                                 f"in this ShardedGraph (devices {device_names(self.devices)}); put it on one of "
                                 "those, or capture on that device too")


# ----------------------------------------------------------------------------
# capture_per_device
# ----------------------------------------------------------------------------


def capture_per_device(fn: Callable[..., Any], in_shapes: Sequence[Any], *, devices: Any = None,
                       bind: str = "auto", input_output_aliases: dict[int, int] | None = None,
                       side_effects: bool = False, backward: Callable[..., Any] | None = None,
                       capture_error_mode: str = "global") -> ShardedGraph:
    """Capture ``fn`` once per device and return the graphs as one :class:`ShardedGraph`.

    For each device, with that device current: static inputs of ``in_shapes``
    are allocated (zeroed) on it, then ``fn(*static_inputs)`` runs under
    :class:`jaxgraph.graph` capture (on a side stream of that device, into a
    new private pool of that device) and returns the static outputs. The
    first device's graph becomes a :func:`~jaxgraph.replayable`; the others
    are registered with it (:meth:`Replayable.add_device`), under one id.

    Parameters
    ----------
    fn : callable
        ``fn(*inputs) -> output or tuple of outputs``: launches the kernels on
        the current stream and returns the device arrays they write (allocate
        them inside ``fn`` with :func:`jaxgraph.empty`: they come from the
        graph's pool and stay valid as long as the graph). It runs once per
        device; :func:`jaxgraph.current_device` says which, for per-device
        constants made beforehand.
    in_shapes : sequence of jax.ShapeDtypeStruct
        One per static input: the shape of one shard (anything with ``shape`` and ``dtype``
        will do).
    devices : sequence of jax.Device or int, or jax.sharding.Mesh, optional
        Where to capture. Default: every local GPU JAX uses
        (``jax.local_devices(backend="gpu")``), or every CUDA device when JAX
        has no GPU backend.
    bind, input_output_aliases, side_effects, backward
        As for :func:`jaxgraph.replayable`; they apply on every device.
    capture_error_mode : {"global", "thread_local", "relaxed"}
        As for :class:`jaxgraph.graph`.

    Returns
    -------
    ShardedGraph

    Raises
    ------
    TypeError
        ``fn`` or ``backward`` is not callable, ``in_shapes`` is not a list or
        a shape has no ``shape``/``dtype``, ``devices`` or
        ``input_output_aliases`` has the wrong type, or ``fn`` returned
        something other than device arrays.
    ValueError
        Unknown ``bind`` or ``capture_error_mode``, an alias naming no input,
        bad ``devices`` (none, none of this process's, repeated, not CUDA), or on
        some device: outputs on another device, or shapes differing from the
        first device's. The message names the device.
    RuntimeError
        No CUDA device (:class:`~jaxgraph.CudaUnavailableError`), ``fn``
        launched nothing on a device, or the native extension is not built.
        Every argument is checked before any device work.

    Notes
    -----
    If capturing fails on any device, what was captured on the others is
    retired and released before the error propagates.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable (it launches the kernels to capture), got {type(fn).__name__}")
    if backward is not None and not callable(backward):
        raise TypeError(f"backward must be callable (e.g. another ShardedGraph), got {type(backward).__name__}")
    check_choice("bind", bind, BIND_CHOICES)  # every check that needs no device comes first
    capture_mode(capture_error_mode)
    shapes = static_input_shapes(in_shapes)
    check_alias_indices(input_output_aliases, len(shapes))
    ordinals = device_ordinals(devices)
    parts: dict[int, DeviceCapture] = {}
    step: Replayable | None = None
    device = ordinals[0]
    try:
        for device in ordinals:
            part = parts[device] = capture_on(device, fn, shapes, capture_error_mode)
            if step is None:
                step = replayable(part.graph, part.inputs, part.outputs, bind=bind, backward=backward,
                                  input_output_aliases=input_output_aliases, side_effects=side_effects)
            else:
                step.add_device(part.graph, part.inputs, part.outputs)
    except (TypeError, ValueError) as exc:
        release_captures(step, parts)
        if type(exc) in (TypeError, ValueError):  # name the device; subclasses keep their own message
            raise type(exc)(f"capture_per_device, device {device}: {exc}") from exc
        raise
    except BaseException:
        release_captures(step, parts)
        raise
    return ShardedGraph._create(step, parts)


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------

_CROSS_PROCESS_ADVICE = (
    "Every process must capture it (jaxgraph.capture_per_device) for its own devices of the mesh, with the "
    "same shapes; and as HLO names a graph by its id and every process must compile the same program, every "
    "process must make its replayables, graphed callables and sharded graphs in the same order (ids count up "
    "in that order: a process that made one more first has shifted ids)")
