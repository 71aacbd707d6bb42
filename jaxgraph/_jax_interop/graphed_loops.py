"""Graphed loops: a captured step run R times on the device in one launch.

A simulation step, a solver iteration, a training step: captured once, a step
replays with one ``cuGraphLaunch``, but a Python loop of replays (or a
``lax.fori_loop`` of them) still pays a host round trip per step.
:func:`graphed_loop` builds *one* CUDA graph that runs the step R times::

    step = jaxgraph.make_graphed_callables(advance, (u0,))     # u -> u_next
    loop = jaxgraph.graphed_loop(step, steps=1000, feed={0: 0})
    step.static_inputs[0].copy_(u)                             # the initial state
    loop.replay()                                              # 1000 steps, one launch
    u_final = loop.outputs[0]

    jax.jit(lambda u, n: loop(u, steps=n))(u, 500)             # inside jit, n traced

Inside the graph (``ffi/device_loop/device_loop.cc`` builds it), a CUDA WHILE node runs
K copies of the step per trip (``unroll=K``): a trip costs 4.2-4.8 us on an
H100, so unrolling amortises it over K steps. ``feed`` says which output
becomes which input for the next step; the copies alternate between the step
and a clone with those buffers swapped (ping-pong, no copies), and after the
last step the fed input *and* output both hold the result. ``until=`` names a
one-element device flag the step's kernels set to stop early.

Stops. By default the stop is exact and speculative: a WHILE trip runs K
steps unguarded (K = ``unroll``, at most 16 by default), each followed by a
small "watch" kernel. A watch that finds the flag set when no earlier one
did knows its step set it: it copies everything a step may write into a
snapshot owned by the loop and records the step count. The trip's tail then
ends the loop, a restore kernel copies the snapshot back over what the
steps run past the flag wrote, and :attr:`GraphedLoop.steps_run` is the
recorded count: what the loop returns, leaves in the snapshotted arrays and
counts is as if no step had run after the one that set the flag. The R mod
K steps that fill no trip run one per WHILE trip, the flag tested after
each (no speculation there). A flag that later steps clear again is still
caught (each step has its watch).

What is snapshotted: every static input and output of the step (a fed pair
both halves), the flag, the state ``[seed, offset]`` of each generator
registered on the step's graph (:meth:`CUDAGraph.register_generator_state`),
and the arrays named in ``preserve=`` (memory the step writes that is no
static array of it, e.g. a counter). It costs a copy of them in device memory
(:attr:`GraphedLoop.snapshot_bytes`), a watch kernel node per step (its grid
sized by those bytes, at most 64 blocks; when the flag is clear every block exits at once,
about the cost of a tiny kernel node, less when it is launched through a
programmatic edge after a one-kernel step on sm_90+), a WHILE trip per K
steps, and at the stop one copy of those bytes each way. What the steps run
past the flag write elsewhere (the step's own scratch buffers) is not
restored: it is never part of what the loop returns. For a step that writes
memory it cannot name in ``preserve``, ``check_every=1`` keeps the stop that
tests the flag after every step in its own WHILE trip (about +4.2 us a step
over the unrolled floor on an H100, no snapshot); ``check_every=K`` tests it
once every K steps (up to K-1 steps past the flag, at nearly the unrolled
floor's cost).

This module is the API and its checks; ``_graphs/loop_build.py`` builds the graph.
"""

from __future__ import annotations

import math
import threading
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from .._graphs import loop_build as _loop_build
from .._cuda.array import DeviceArray, asarray
from .._cuda.checks import device_arrays
from .graphed_callables import GraphedCallable, flat_statics
from . import loop_grad as _loop_grad
from .._graphs.cuda_graph import CUDAGraph, handles_of

__all__ = ["GraphedLoop", "graphed_loop", "default_unroll", "loop_choices"]

# One WHILE trip costs 4.2-4.8 us over the unrolled floor at N=1 on the H100, a kernel
# node ~1 us (benchmarks/results/nvidia-h100-80gb-hbm3-loops.md: the WHILE trip table,
# loop_unrolled). Unroll until the trip is at most this share of a trip's steps.
_TRIP_US = 4.3
_NODE_US = 1.0
_TRIP_SHARE = 0.05
_MAX_UNROLL = 64      # default cap: graph size and build time grow with K
_EXACT_MAX_UNROLL = 16  # the exact stop's default cap: past 16 the trip's share is small and the graph only grows
_LIMIT_UNROLL = 256   # the native builder's cap (8 remainder bits)
_FLAG_DTYPES = {np.dtype(np.bool_): 1, np.dtype(np.int8): 1, np.dtype(np.uint8): 1,
                np.dtype(np.int32): 4, np.dtype(np.uint32): 4}


# ----------------------------------------------------------------------------
# GraphedLoop
# ----------------------------------------------------------------------------


class GraphedLoop:
    """A step run R times in one CUDA graph; make one with :func:`graphed_loop`.

    Attributes
    ----------
    graph : CUDAGraph
        The loop graph (``summary()``, ``to_dot()``, ``debug_dump()`` work on it).
    inputs, outputs : tuple of DeviceArray
        The step's static inputs and outputs. Write the initial state into
        ``inputs`` before :meth:`replay`; afterwards every fed pair (input and
        output) holds the state after the last step.
    steps_run : DeviceArray
        One int32: the steps the last launch ran (R, or fewer when ``until`` stopped it).
        Like every counter the loop allocates, it lives on the step's device,
        whichever device is current when the loop is built.
    count : DeviceArray or None
        One int32 the graph reads R from at each launch (``steps`` given as an
        array, or ``None`` then filled by ``replay(steps=n)``); ``None`` for a fixed R.
    steps : int or None
        The fixed R, or ``None`` when R is read from :attr:`count`.
    unroll : int
        Copies of the step per WHILE trip (K); with ``until`` and ``check_every``,
        equal to it; with the default exact stop, the steps of a speculative trip.
    check_every : int or None
        As given to :func:`graphed_loop` with ``until`` (``None``: the default
        exact stop); ``None`` without ``until``.
    stop : str or None
        How ``until`` is tested: ``"exact"`` (speculative trips, a watch
        after each step, the default), ``"exact, a trip per step"``
        (``check_every=1``), ``"every K steps"``; ``None`` without ``until``.
    snapshot_bytes : int
        Device memory the exact stop's snapshot holds (0 for the other stops).
    feed : dict of int to int
        ``{output index: input index}``.
    ping_pong : str
        How fed buffers move between steps: ``"none"`` (no feed), ``"in place"``,
        ``"swap"`` (alternating clones, no copies) or ``"copy: <reason>"``
        (a device copy after each step, where swapping the addresses is unsafe).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        raise RuntimeError("GraphedLoop cannot be constructed directly; use jaxgraph.graphed_loop(...)")

    def __repr__(self) -> str:
        r = self.steps if self.steps is not None else "count[0]"
        until = f", until: {self.stop}" if self._until is not None else ""
        return (f"<jaxgraph.GraphedLoop steps={r} unroll={self.unroll} feed={self.feed} "
                f"ping_pong={self.ping_pong!r}{until} device={self.graph.device}>")

    def summary(self) -> str:
        """One line per node of the loop graph (see :meth:`CUDAGraph.summary`)."""
        return self.graph.summary()

    def checkpoint_memory(self, steps: int | None = None) -> dict:
        """What ``jax.grad`` of this loop holds on the device (``docs/guide/gradients.md``).

        Returns ``{"checkpoint_every": C, "slots": S, "ring": C, "state_bytes": ...,
        "device_bytes": (S + C) * state_bytes, "residual_bytes": S * state_bytes}``:
        the loop keeps S checkpoint slots (``S = ceil(R / C)``, R = ``steps`` or
        the loop's ``max_steps``) and a ring of C states for the recomputation;
        XLA keeps the S checkpoints once more as the residual between the
        forward and the backward.
        """
        return _loop_grad.checkpoint_memory(self, steps)

    # -- eager --------------------------------------------------------------------

    def replay(self, steps: int | None = None) -> None:
        """Run the loop on the current stream: one graph launch, no host synchronisation.

        Parameters
        ----------
        steps : int, optional
            R for this launch, when the loop reads R from :attr:`count` (written
            there with a stream-ordered memset first). ``None`` keeps what
            ``count`` holds. Not allowed for a loop built with a fixed R.
        """
        if steps is not None:
            if self.count is None:
                raise ValueError(f"this loop runs a fixed {self.steps} steps; build it with steps=None (or a "
                                 "device array) to choose the count per launch")
            self.count.fill_(_check_steps(steps))
        self.graph.replay()

    # -- inside jax.jit -----------------------------------------------------------

    def __call__(self, *args: Any, steps: Any = None) -> Any:
        """Run the loop as a JAX function: one FFI call, inside or outside ``jax.jit``.

        Parameters
        ----------
        *args : jax.Array
            One array per static input of the step (the initial state and any
            other inputs), shapes and dtypes as captured.
        steps : int or int32 scalar, optional
            R for this call, a Python int or a traced int32, for a loop built
            with ``steps=None`` (it owns :attr:`count`). Leave it ``None`` for a
            fixed R, or for a loop that reads R from your own device array (set
            that array before the call).

        Returns
        -------
        The step's outputs after the last step (one array, or a tuple), and,
        when the loop has ``until``, a second item: the int32 ``(1,)`` count of
        steps run, i.e. ``(outputs, steps_run)``.
        """
        import jax.numpy as jnp

        fn = self._jax_function()
        if self.count is not None and self._count_is_own:
            if steps is None:
                raise TypeError("this loop reads its step count per call: pass steps=n (an int or int32 scalar)")
            if isinstance(steps, (int, np.integer)):
                _check_steps(steps)
            args = (*args, jnp.asarray(steps, jnp.int32).reshape(1))
        elif steps is not None:
            raise ValueError("steps= is for loops built with steps=None; this one runs "
                             f"{self.steps if self.steps is not None else 'count[0] of the array it was built with'}"
                             " steps")
        out = fn(*args)
        outs = out if isinstance(out, tuple) else (out,)
        n_out = len(self.outputs)
        result = outs[0] if n_out == 1 else tuple(outs[:n_out])
        return (result, outs[n_out]) if self._until is not None else result

    def _jax_function(self) -> Any:
        """The replayable of the loop graph (made once): static inputs (+ count) -> outputs (+ steps_run)."""
        with self._lock:
            if self._fn is None:
                from .replayable import replayable

                ins = list(self.inputs) + ([self.count] if self._count_is_own else [])
                outs = list(self.outputs) + ([self.steps_run] if self._until is not None else [])
                # Copied, not bound: the fed buffers sit in the step's child graphs, which
                # binding cannot reach (so they are copied either way), and the rest is 4-byte
                # counters. This is the path checked on the H100 (command buffers off/on/defaults).
                # jax.grad runs the checkpointed loops of _jax_interop/loop_grad.py.
                self._fn = _loop_grad.differentiable(self, replayable(self.graph, inputs=ins, outputs=outs,
                                                                      bind="copy"))
            return self._fn


def graphed_loop(step: GraphedCallable | CUDAGraph, steps: int | DeviceArray | None = None, *,
                 feed: Mapping[int, int] | None = None, unroll: int | None = None,
                 until: DeviceArray | None = None, check_every: int | None = None,
                 inputs: Sequence[DeviceArray] | None = None, outputs: Sequence[DeviceArray] | None = None,
                 ping_pong: str = "auto", preserve: Sequence[DeviceArray] = (),
                 checkpoint_every: int | None = None, max_steps: int | None = None) -> GraphedLoop:
    """Build one CUDA graph that runs ``step`` R times in a single launch.

    Parameters
    ----------
    step : GraphedCallable or CUDAGraph
        The captured step: a :func:`~jaxgraph.make_graphed_callables` result,
        or a captured :class:`~jaxgraph.CUDAGraph` with ``inputs``/``outputs``
        naming its static arrays. The step's graph must hold only kernels,
        copies and memsets (no conditional nodes).
    steps : int, DeviceArray or None
        R. An ``int`` fixes it now; a one-element int32 device array is read on
        the device at every launch (write it before ``replay()``); ``None``
        makes the loop own such an array, :attr:`GraphedLoop.count`, filled by
        ``replay(steps=n)`` or ``loop(*args, steps=n)``. A Python int outside
        [0, 2**31) is a ``ValueError`` (here and in those calls); a negative
        count read on the device (an array, a traced ``steps=``) runs nothing.
    feed : dict of int to int, optional
        ``{output index: input index}``: that output of one step is that input
        of the next (same shape and dtype). Default: no feed (the step reruns
        on its inputs, e.g. a step that updates its state in place).
    unroll : int, optional
        K, the copies of the step per WHILE trip (1 to 256; even with ``feed``
        unless ``ping_pong="copy"``).
        Default: :func:`default_unroll` of the step's node count (with the
        default exact stop at most 16: beyond that the trip costs little). With
        ``until`` and ``check_every`` the trip holds ``check_every`` steps:
        leave ``unroll`` out, or give the same value.
    until : DeviceArray, optional
        A one-element ``bool``/``int8``/``uint8``/``int32``/``uint32`` flag the
        step's kernels set (non-zero) to stop. The loop clears it when a launch
        starts and reads it as ``check_every`` says; ``steps`` is then the most
        steps a launch runs, and :attr:`GraphedLoop.steps_run` counts the steps
        that really ran. By default the stop is exact (speculative trips
        with a watch after each step that snapshots the stopping step's
        state: the module docstring says what it snapshots and costs).
    check_every : int, optional
        With ``until``: test the flag once every K = ``check_every`` steps
        (1 to 256) instead of the default exact stop. ``1`` is the exact stop
        without speculation: a WHILE trip per step, the flag read after each
        (no snapshot; for a step that writes memory it cannot name in
        ``preserve``, or to save the snapshot's memory). ``K > 1`` runs
        K steps per WHILE trip with no check between them, so a launch may run
        up to K-1 steps past the step that set the flag (the state is then
        that of the last step run, ``steps_run`` says which); it never runs
        more than ``steps`` steps: the R mod K left after the full trips run
        only if the flag is still clear. With ``feed`` K must be even (unless
        ``ping_pong="copy"``), as ``unroll``. Requires ``until``.
    inputs, outputs : sequence of DeviceArray
        For a ``CUDAGraph`` step: its static inputs and outputs, which ``feed``
        indexes (and which the JAX function of the loop takes and returns).
    ping_pong : {"auto", "copy"}
        How a fed output reaches the next step. ``"auto"`` (default): copies
        of the step alternate with a clone whose kernels have the two buffers
        swapped (no data moves), unless that is unsafe (an address inside a
        struct argument, a memcpy node on the buffer), then as ``"copy"``:
        a device copy output -> input after every step.
        :attr:`GraphedLoop.ping_pong` says which ran and why.
    preserve : sequence of DeviceArray, optional
        With the default exact stop: more device arrays the step writes
        whose contents must be as if no step ran after the one that set the
        flag (a counter, an accumulator that is no static array of the
        step). They are snapshotted with the static arrays on the stopping
        step and restored after the loop. Memory that a jaxgraph kernel of
        the step may write (a pointer parameter without ``const``) and that
        is neither a static array nor named here is named in a
        ``UserWarning`` when the loop is built.
    checkpoint_every : int, optional
        For ``jax.grad`` of the loop (a step captured with ``backward=``): C,
        the steps between two checkpoints of the fed state (1 to 256).
        Default: about sqrt(R). The gradient holds ``ceil(R / C) + C`` states
        (:meth:`GraphedLoop.checkpoint_memory`; ``docs/guide/gradients.md``).
    max_steps : int, optional
        For ``jax.grad`` of a loop whose count is chosen per launch: the most
        steps a differentiated launch runs (it sizes the checkpoint slots);
        a launch asked for more returns NaN outputs and gradients.

    Returns
    -------
    GraphedLoop

    Raises
    ------
    TypeError, ValueError
        Bad arguments (checked before any device work), e.g. a feed between
        arrays of different shapes, an odd ``unroll`` with ``feed``, a flag
        that is not a one-element device array of a flag dtype, ``check_every``
        without ``until`` or an ``unroll`` that disagrees with it, ``preserve``
        without the default exact stop.
    RuntimeError
        The step is not captured, or the driver lacks conditional nodes (CUDA 12.3+).

    Warns
    -----
    UserWarning
        With the default exact stop, when the step's kernels may write memory
        that is not snapshotted (no static array, not in ``preserve``): steps
        run past the flag leave their writes there.

    Notes
    -----
    Cost per step: unrolled copies cost what the step costs; each trip adds
    4.2-5.1 us on an H100 (its one-thread control kernel included). The
    default exact stop pays a watch kernel per step and a trip per K steps,
    and at the stop a snapshot and a restore of what a step writes
    (+1.0-1.1 us a step over the unrolled floor for a one-kernel step on an
    H200: ``benchmarks/results/exact-stop-h200-2026-11-28/``). ``check_every=1``
    pays a trip per step: +4.6 us over the unrolled floor for a one-kernel
    step fed back (its check kernel also copies a fed pair of up to 256 KiB;
    a larger pair alternates with the swapped twin behind one IF per two
    steps, +5.2), +4.45 in place. ``check_every=K`` pays one trip per K steps:
    +0.60 (K=8), +0.32 (16), +0.17 (32) (``benchmarks/results/stops-h100-2026-11-27``).
    The R mod K steps left after the trips run unrolled (R fixed, no
    ``until``) or behind an IF node per bit of the remainder (R read on the
    device, or ``until``).

    .. warning:: This API is in beta and may change in future releases.

    Examples
    --------
    A step ``u -> u_next`` captured once, run 1000 times in one launch:

    >>> step = jaxgraph.make_graphed_callables(advance, (u0,))
    >>> loop = jaxgraph.graphed_loop(step, 1000, feed={0: 0})
    >>> step.static_inputs[0].copy_(u)          # the initial state
    >>> loop.replay()                           # u after 1000 steps in step.static_outputs
    >>> jax.jit(loop)(u)                        # the same, as one FFI call inside jit

    A solver whose step sets ``done[0]`` when converged, at most 10**5 sweeps:

    >>> loop = jaxgraph.graphed_loop(sweep, 10**5, feed={0: 0}, until=done)
    >>> loop.replay(); int(loop.steps_run.numpy()[0])   # the sweeps that ran

    The same, testing ``done`` once every 16 sweeps (up to 15 sweeps past convergence):

    >>> loop = jaxgraph.graphed_loop(sweep, 10**5, feed={0: 0}, until=done, check_every=16)
    """
    if ping_pong not in ("auto", "copy"):
        raise ValueError(f"ping_pong must be 'auto' or 'copy', got {ping_pong!r}")
    graph, ins, outs, owner = _step_parts(step, inputs, outputs)
    pairs = _check_feed(feed, ins, outs)
    fixed, count = _check_count(steps)
    flag_bytes = _check_until(until)
    even = bool(pairs) and ping_pong == "auto"
    speculative = until is not None and check_every is None
    # With check_every, check_every's rule (it is K); else unroll's (the speculative trip is K unguarded steps).
    k = None if unroll is None else _check_unroll(unroll, even and (until is None or speculative))
    every = None if speculative else _check_every(1 if check_every is None else check_every, until, k, even)
    kept = _check_preserve(preserve, speculative)
    if speculative:
        k = k or min(_EXACT_MAX_UNROLL, default_unroll(max(1, _loop_build.step_nodes(graph)), even=even))
        kept = _snapshotted(graph, ins, outs, until, kept)
        _warn_unpreserved(graph, kept, k)
    grad_options = _loop_grad.check_checkpoint_options(checkpoint_every, max_steps, fixed)
    return _build(graph, owner, ins, outs, pairs, fixed, count, until, flag_bytes, every or k, dict(feed or {}),
                  ping_pong == "auto", every, kept if speculative else None,
                  grad_options=grad_options)


def default_unroll(nodes_per_step: int, even: bool = True) -> int:
    """K such that a WHILE trip (taken as 4.3 us) costs at most ~5% of its K steps (~1 us per kernel node).

    ``default_unroll(1) == 64`` (capped), ``default_unroll(10) == 10``, ``default_unroll(100) == 2``.
    """
    if isinstance(nodes_per_step, bool) or not isinstance(nodes_per_step, (int, np.integer)) or nodes_per_step < 1:
        raise ValueError(f"nodes_per_step must be a positive int, got {nodes_per_step!r}")
    k = math.ceil(_TRIP_US / (_TRIP_SHARE * _NODE_US * int(nodes_per_step)))
    k = max(2 if even else 1, min(_MAX_UNROLL, k))
    return k + (k % 2) if even else k


def loop_choices(loop: GraphedLoop) -> tuple[bool, str]:
    """What was chosen for ``loop`` where it was built (``jaxgraph.diagnostics.describe_loop``).

    Whether its check or watch kernel is launched through a programmatic edge
    after the step, and how its gradient runs the full segments
    (``LoopGradient.mode``; ``"not built"`` before the first gradient).
    """
    gradient = getattr(loop, "_gradient", None)
    return bool(loop._pdl), gradient.mode if gradient is not None else "not built"


# ----------------------------------------------------------------------------
# Checking the arguments (no device work)
# ----------------------------------------------------------------------------


def _step_parts(step: Any, inputs: Any, outputs: Any) -> tuple:
    """The step's graph, flat static inputs and outputs, and what to keep alive."""
    if isinstance(step, GraphedCallable):
        if inputs is not None or outputs is not None:
            raise TypeError("inputs= and outputs= are for a CUDAGraph step; a graphed callable knows its own")
        if step.graph is None:
            raise ValueError("this graphed callable has no forward graph")
        return step.graph, *flat_statics(step), step
    if isinstance(step, CUDAGraph):
        ins = (device_arrays(inputs, "inputs") if inputs is not None else ())
        outs = (device_arrays(outputs, "outputs") if outputs is not None else ())
        return step, ins, outs, step
    raise TypeError("step must be a jaxgraph.CUDAGraph or a make_graphed_callables result, "
                    f"got {type(step).__name__}")




def _check_feed(feed: Any, ins: tuple, outs: tuple) -> list[tuple[DeviceArray, DeviceArray]]:
    """``(input, output)`` pairs that differ in memory (an in-place pair needs nothing)."""
    if feed is None:
        return []
    if not isinstance(feed, Mapping):
        raise TypeError(f"feed must be a dict {{output index: input index}}, got {type(feed).__name__}")
    pairs, seen_in = [], set()
    for o, i in feed.items():
        for what, idx, arrays in (("output", o, outs), ("input", i, ins)):
            if isinstance(idx, bool) or not isinstance(idx, (int, np.integer)) or not 0 <= idx < len(arrays):
                raise ValueError(f"feed {{{o!r}: {i!r}}}: {what} index {idx!r} is not one of the step's "
                                 f"{len(arrays)} {what}s (give inputs=/outputs= for a CUDAGraph step)")
        if i in seen_in:
            raise ValueError(f"feed: input {i} is fed by two outputs")
        seen_in.add(i)
        x, y = ins[i], outs[o]
        if x.shape != y.shape or x.dtype != y.dtype:
            raise ValueError(f"feed {{{o}: {i}}}: output {o} is {y.dtype}{list(y.shape)}, input {i} is "
                             f"{x.dtype}{list(x.shape)}; a fed pair must match")
        if x.ptr != y.ptr:
            pairs.append((x, y))
    return pairs


def _check_count(steps: Any) -> tuple[int, DeviceArray | None]:
    """``(R, None)`` for a fixed count, ``(-1, array)`` for one read on the device, ``(-1, None)`` for own."""
    if steps is None:
        return -1, None
    if isinstance(steps, (int, np.integer)) and not isinstance(steps, bool):
        return _check_steps(steps), None
    if isinstance(steps, DeviceArray) or hasattr(steps, "__cuda_array_interface__"):
        a = asarray(steps)
        if a.size != 1 or a.dtype != np.int32:
            raise ValueError(f"steps as a device array must hold one int32, got {a.dtype}{list(a.shape)}")
        return -1, a
    raise TypeError(f"steps must be an int, a one-element int32 device array or None, got {type(steps).__name__}")


def _check_steps(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"steps must be an int, got {type(n).__name__}")
    if not 0 <= n < 2**31:
        raise ValueError(f"steps must be in [0, 2**31), got {n}")
    return int(n)


def _check_until(until: Any) -> int:
    if until is None:
        return 0
    if not isinstance(until, DeviceArray) and not hasattr(until, "__cuda_array_interface__"):
        raise TypeError(f"until must be a one-element device array (a flag the step sets), got {type(until).__name__}")
    a = asarray(until)
    if a.size != 1 or a.dtype not in _FLAG_DTYPES:
        raise ValueError("until must hold one bool, int8, uint8, int32 or uint32 element, "
                         f"got {a.dtype}{list(a.shape)}")
    return _FLAG_DTYPES[a.dtype]


def _check_per_trip(value: Any, name: str) -> int:
    """``value`` (``unroll`` or ``check_every``, named ``name`` in errors) as an int in [1, _LIMIT_UNROLL]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 1 <= value <= _LIMIT_UNROLL:
        raise ValueError(f"{name} must be in [1, {_LIMIT_UNROLL}], got {value}")
    return int(value)


def _check_every(check_every: Any, until: Any, unroll: int | None, even: bool) -> int | None:
    """K steps between flag checks with ``until`` (1: exact), ``None`` without; ``unroll`` must agree."""
    k = _check_per_trip(check_every, "check_every")
    if until is None:
        if k != 1:
            raise ValueError(f"check_every={k} needs until= (the flag it tests); without a flag every "
                             "launch runs all its steps")
        return None
    if unroll is not None and unroll != k:
        raise ValueError(f"with until=, a WHILE trip holds check_every={k} steps and tests the flag after "
                         f"them; unroll={unroll} disagrees: leave unroll out, or pass check_every={unroll} "
                         f"(up to {unroll - 1} steps past the flag)")
    if even and k > 1 and k % 2:
        raise ValueError(f"check_every must be 1 or even with feed= (got {k}): copies alternate between the step "
                         "and its swapped twin, so each trip must end where it began (or ping_pong='copy')")
    return k


def _check_preserve(preserve: Any, speculative: bool) -> tuple:
    """``preserve`` as device arrays; only the default exact stop snapshots them."""
    arrays = device_arrays(preserve, "preserve") if preserve is not None else ()
    if arrays and not speculative:
        raise ValueError("preserve= is for the default exact stop (until= without check_every), which "
                         "snapshots what a step writes; with check_every no step runs past the flag's trip "
                         "speculatively, so there is nothing to undo")
    return tuple(arrays)


def _snapshotted(graph: CUDAGraph, ins: tuple, outs: tuple, until: DeviceArray, preserve: tuple) -> tuple:
    """What the exact stop snapshots: static inputs and outputs, the flag, generators' states, ``preserve``."""
    generators = tuple(g.state for g in getattr(graph, "_generators", ()))
    seen, out = set(), []
    for a in (*ins, *outs, asarray(until), *generators, *preserve):
        if (a.ptr, a.nbytes) not in seen and a.nbytes > 0:
            seen.add((a.ptr, a.nbytes))
            out.append(a)
    return tuple(out)


def _warn_unpreserved(graph: CUDAGraph, snapshotted: tuple, k: int) -> None:
    """Warn of memory the step's kernels may write that the exact stop does not snapshot.

    A speculative trip runs its K steps before their flags are read; steps past
    the stopping one are undone only in what is snapshotted. Memory a jaxgraph
    kernel of the step writes elsewhere (a counter, an accumulator) keeps their
    effect: say so, naming it, where the capture saw it (launches of other
    libraries' kernels are not seen).
    """
    if k <= 1:  # a trip of one step: none runs past the flag
        return
    covered = [(a.ptr, a.ptr + a.nbytes) for a in snapshotted]
    missing = [(label, where, what) for ptr, nbytes, label, where, what in handles_of(graph).inputs.written
               if not any(lo <= ptr and ptr + nbytes <= hi for lo, hi in covered)]
    if not missing:
        return
    named = "; ".join(f"argument '{label}' of {where} ({what})" for label, where, what in missing[:4])
    more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
    warnings.warn(
        f"graphed_loop: the step writes memory that is no static input or output and not in preserve=: "
        f"{named}{more}. With the default exact stop, up to {k - 1} steps past the one that sets the flag "
        "run before it is read, and their writes there stay. Name it in preserve= to keep it as if they never "
        "ran (a counter, an accumulator), or pass check_every=1 (no step past the flag); scratch memory no "
        "caller reads needs neither", UserWarning, stacklevel=3)


def _check_unroll(unroll: Any, even: bool) -> int:
    k = _check_per_trip(unroll, "unroll")
    if even and k % 2:
        raise ValueError(f"unroll must be even with feed= (got {unroll}): copies alternate between the step and "
                         "its swapped twin, so each trip must end where it began")
    return k


# ----------------------------------------------------------------------------
# Building (the machinery lives in _graphs/loop_build.py)
# ----------------------------------------------------------------------------


def _build(graph: CUDAGraph, owner: Any, ins: tuple, outs: tuple, pairs: list, fixed: int,
           count: DeviceArray | None, until: DeviceArray | None, flag_bytes: int, k: int | None,
           feed: dict, swap_allowed: bool, every: int | None = None,
           preserve: tuple | None = None, grad_options: tuple = (None, None)) -> GraphedLoop:
    if k is None:
        k = default_unroll(max(1, _loop_build.step_nodes(graph)), even=bool(pairs) and swap_allowed)
    built = _loop_build.build(graph, owner, ins, outs, pairs, fixed, count, until, flag_bytes, k, swap_allowed,
                              preserve)
    self = object.__new__(GraphedLoop)
    self.graph, self.inputs, self.outputs = built.graph, ins, outs
    self.steps_run, self.count, self._count_is_own = built.done, built.count, built.own_count
    self.steps = fixed if fixed >= 0 else None
    self.unroll, self.feed, self.check_every = k, feed, every
    self.stop = None if until is None else ("exact" if preserve is not None else "exact, a trip per step"
                                            if every == 1 else f"every {every} steps")
    self.snapshot_bytes = built.snapshot.nbytes if built.snapshot is not None else 0
    self.ping_pong = built.ping_pong if pairs or not feed else "in place"  # every fed pair one buffer
    self._until, self._remaining, self._step, self._pdl = until, built.remaining, owner, built.pdl
    self._fn, self._lock = None, threading.Lock()
    self._checkpoint_every, self._max_steps = grad_options
    self.__name__ = "graphed_loop"  # how jax.jit names the function
    return self
