"""Whole steps as CUDA graphs: :func:`make_graphed_callables`, PyTorch's API for JAX.

A *callable* here is a Python function that launches kernels (jaxgraph's, or
another library's on jaxgraph's current stream) on device arrays and returns
device arrays::

    def step(u, v):                                   # jaxgraph.DeviceArray in ...
        out = jaxgraph.empty(u.shape)
        kernel[grid, block](out, u, v, u.size)
        return out                                    # ... and out

    graphed = jaxgraph.make_graphed_callables(step, (u0, v0))
    graphed(u, v)                                     # device arrays: one replay, as in torch
    jax.jit(lambda u, v: graphed(u, v) * 2)(u, v)     # JAX arrays: one FFI replay inside jit

:func:`make_graphed_callables` copies the sample arguments into private static
arrays, warms each callable up on a side stream, captures each once into a
:class:`~jaxgraph.CUDAGraph` (all graphs of one call share one memory pool)
and wraps each graph in a :class:`~jaxgraph.Replayable` (``_jax_interop/replayable.py``),
the JAX side. Given a backward callable, it captures the backward too (in
reverse order, as torch does), and the JAX function carries a
``jax.custom_vjp`` whose backward replays that graph, so ``jax.grad`` works.

This module is the API; checking, warming up and capturing are in
``_jax_interop/graphed_callables_capture.py``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .._cuda import memory as _memory
from .._cuda.array import DeviceArray, asarray
from .._cuda.checks import fmt, fmt_all
from .graphed_callables_capture import (Entry, capture_backward, capture_forward, check_options, is_device_array,
                               pair_entries, static_copy, unflatten, warm_up)
from .._graphs.cuda_graph import CUDAGraph
from .replayable import Replayable, replayable, replayable_of_referenced

__all__ = ["GraphedCallable", "flat_statics", "make_graphed_callables"]

# ----------------------------------------------------------------------------
# GraphedCallable
# ----------------------------------------------------------------------------


class GraphedCallable:
    """A callable captured by :func:`make_graphed_callables`; call it as the original.

    - With jaxgraph device arrays (or CuPy arrays, torch tensors) among the
      arguments, it copies each argument into its static input (unless it *is*
      that static input), replays the forward graph on the current stream and
      returns the static outputs, in the structure the callable returned. As
      with torch's graphed callables these are the same arrays on every call:
      the next call overwrites them.
    - With JAX arrays (or numpy arrays), inside or outside ``jax.jit``,
      ``lax.scan``, ``lax.fori_loop``, ``vmap`` and ``grad``, it is a JAX
      function: one ``jaxgraph_replay`` FFI call, returning new JAX arrays.

    Arguments must have the pytree structure, shapes and dtypes of the sample
    arguments; keyword arguments are not accepted.

    Attributes
    ----------
    graph : CUDAGraph
        The captured forward graph.
    backward_graph : CUDAGraph or None
        The captured backward graph, when a backward was given.
    replayable : Replayable
        The JAX function of the forward graph (flat arrays in, flat outputs out).
    static_inputs, static_outputs : pytree of DeviceArray
        The arrays the graph reads and writes, in the arguments' and results' structure.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        raise RuntimeError("GraphedCallable cannot be constructed directly; "
                           "use jaxgraph.make_graphed_callables(...)")

    @classmethod
    def _create(cls, name: str, in_tree: Any, out_tree: Any, out_slots: Sequence[int], step: Replayable, *,
                graph: CUDAGraph | None = None, backward_graph: CUDAGraph | None = None,
                static_inputs: Sequence[DeviceArray] = (), static_outputs: Sequence[DeviceArray] = (),
                keep: Sequence[Any] = (), backward_parts: tuple | None = None) -> "GraphedCallable":
        """Build from parts; :func:`make_graphed_callables` captures them (tests use this directly).

        ``out_slots`` maps each output leaf to one of ``step``'s outputs (a
        callable may return one array twice); ``keep`` holds what must live as
        long as this object (the pool, the backward replayable). ``backward_parts``
        is ``(static cotangents, static gradients, grad slots, inputs the backward
        reads)``, what ``jax.grad`` of a ``graphed_loop`` of this step needs.
        """
        self = object.__new__(cls)
        self.__name__ = name  # how jax.jit names the function
        self._in_tree, self._out_tree, self._out_slots = in_tree, out_tree, tuple(out_slots)
        self._step = step
        self._single = len(step.out_shapes) == 1
        self.graph, self.backward_graph = graph, backward_graph
        self._static_in, self._static_out = tuple(static_inputs), tuple(static_outputs)
        self._keep = tuple(keep)
        self._backward_parts = backward_parts
        return self

    # -- introspection --------------------------------------------------------------

    @property
    def replayable(self) -> Replayable:
        """The :class:`Replayable` of the forward graph: what a call with JAX arrays replays."""
        return self._step

    @property
    def static_inputs(self) -> Any:
        """The graph's static input arrays, structured as the sample arguments (device-array calls fill them)."""
        return unflatten(self._in_tree, self._static_in)

    @property
    def static_outputs(self) -> Any:
        """The graph's static output arrays, structured as the outputs (the next device-array call overwrites them)."""
        return unflatten(self._out_tree, [self._static_out[s] for s in self._out_slots])

    def summary(self) -> str:
        """The summaries of the forward graph and, if any, the backward graph."""
        text = (f"graphed {self.__name__}: ({fmt_all(self._step.in_shapes)}) -> "
                f"({fmt_all(self._step.out_shapes)})")
        for what, g in (("forward", self.graph), ("backward", self.backward_graph)):
            if g is not None:
                text += f"\n{what}: " + g.summary()
        return text

    def __repr__(self) -> str:
        backward = ", with backward" if self.backward_graph is not None else ""
        return (f"<jaxgraph.GraphedCallable {self.__name__}({fmt_all(self._step.in_shapes)}) -> "
                f"({fmt_all(self._step.out_shapes)}){backward}>")

    # -- calling --------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Replay on ``args``: eagerly on device arrays, as a JAX function on JAX arrays."""
        if kwargs:
            raise TypeError(f"{self.__name__} takes its arguments by position, as when it was captured; "
                            f"got keyword argument(s) {', '.join(map(repr, kwargs))}")
        import jax

        leaves, tree = jax.tree_util.tree_flatten(args)
        if tree != self._in_tree:
            raise TypeError(f"{self.__name__} was captured for arguments structured as {self._in_tree}, "
                            f"got {tree}: pass arguments with the structure of its sample_args")
        if any(is_device_array(a) for a in leaves):
            outs = self._replay_eagerly(leaves)
        else:
            out = self._step(*leaves)
            outs = (out,) if self._single else out
        return unflatten(self._out_tree, [outs[s] for s in self._out_slots])

    def _replay_eagerly(self, leaves: list) -> tuple:
        """Copy the arguments into the static inputs, replay, return the static outputs."""
        if self.graph is None:
            raise RuntimeError(f"{self.__name__} has no graph to replay on device arrays")
        for i, (value, static) in enumerate(zip(leaves, self._static_in)):
            source = value if isinstance(value, np.ndarray) else asarray(value)
            if tuple(source.shape) != static.shape or np.dtype(source.dtype) != static.dtype:
                raise TypeError(f"{self.__name__}: argument leaf {i} is {fmt(source)}; it was captured "
                                f"for {fmt(static)}")
            if isinstance(source, np.ndarray) or source.ptr != static.ptr:
                if static.nbytes:
                    static.copy_(source)
        self.graph.replay()
        return self._static_out


def flat_statics(step: GraphedCallable) -> tuple[tuple, tuple]:
    """``step``'s static input and output arrays, flat, in the order its graph was captured with."""
    return step._static_in, step._static_out


# ----------------------------------------------------------------------------
# make_graphed_callables
# ----------------------------------------------------------------------------


def make_graphed_callables(callables: Callable[..., Any] | tuple, sample_args: tuple,
                           num_warmup_iters: int = 3, allow_unused_input: bool = False, pool: Any = None,
                           capture_error_mode: str = "global", *,
                           backward: Callable[..., Any] | tuple | None = None) -> Any:
    """Capture callables into CUDA graphs and return graphed versions, as ``torch.cuda.make_graphed_callables``.

    Each callable launches kernels on device arrays and returns device arrays
    (allocate its outputs inside, e.g. with :func:`jaxgraph.empty`: during the
    capture they come from the graphs' shared pool). For each callable, in
    order: the sample arguments are copied into new static arrays, the callable
    is run ``num_warmup_iters`` times on a side stream (this loads kernels and
    lets libraries set up outside the capture), then it is captured once into a
    :class:`~jaxgraph.CUDAGraph`. Backward callables are captured afterwards, in
    reverse order. All graphs share one memory pool.

    Parameters
    ----------
    callables : callable or tuple of callables
        One callable, or a tuple of them (captured in order into one pool). An
        entry of the tuple may be a ``(forward, backward)`` pair.
    sample_args : tuple
        For one callable, the tuple of its arguments (``(x,)`` for one); for a
        tuple of callables, a tuple holding one such tuple per callable.
        Arguments are pytrees (tuples, lists, dicts) of arrays only: jaxgraph
        device arrays, :class:`jax.Array`, numpy arrays or CUDA arrays (CuPy, torch).
        Their shapes and dtypes are what the graphs are captured for.
    num_warmup_iters : int
        Eager runs of each callable (and its backward) before its capture. Default 3.
    allow_unused_input : bool
        With a backward: if False (default), the backward must return a
        cotangent for every floating-point input, as torch refuses inputs the
        outputs do not depend on; if True, ``None`` stands for a zero gradient.
    pool : optional
        Pool token (:func:`~jaxgraph.graph_pool_handle`, ``g.pool()``) the
        graphs share memory with. Default: a new pool.
    capture_error_mode : {"global", "thread_local", "relaxed"}
        The ``cudaStreamCaptureMode`` of the captures (see :class:`~jaxgraph.graph`).
    backward : callable or tuple, optional
        The backward of a single callable, or one entry (a callable or ``None``)
        per callable. It is called as ``backward(*args, outputs, cotangents)``:
        the forward's arguments, its outputs and one cotangent per output (both
        in the structure the forward returned), all device arrays. It launches
        kernels and returns one cotangent per argument, in a tuple (for a
        forward of one argument, the cotangent alone is accepted too), each in
        its argument's structure; ``None`` (for a leaf or a whole argument)
        means no gradient, and is what integer inputs get. The graphed function
        then works under ``jax.grad``, its backward one replay.

    Returns
    -------
    GraphedCallable or tuple of GraphedCallable
        One per callable (a single one when ``callables`` is not a tuple).
        Called with device arrays it replays eagerly; called with JAX arrays it
        is a JAX function, usable inside ``jax.jit``.

    Raises
    ------
    TypeError
        A callable or backward is not callable (or ``backward`` is not a
        tuple for a tuple of callables), ``sample_args`` is not a tuple of
        argument tuples, holds something other than arrays or traced values,
        an option has the wrong type (``num_warmup_iters``,
        ``allow_unused_input``, ``pool``), a callable returns something other
        than device arrays, or a backward returns cotangents in another
        structure than the arguments' or one for an integer argument.
    ValueError
        Mismatched counts of callables, sample arguments and backwards; a
        backward given both in a pair and in ``backward``; a bad option value
        (a negative ``num_warmup_iters``, an unknown ``capture_error_mode``, a
        pool that no longer exists); a callable that returns no array, or
        (with a backward) returns an argument updated in place; a backward
        that returns ``None`` where ``allow_unused_input`` is False, no
        cotangent at all, or cotangents whose shapes or dtypes differ from the
        inputs'.
    RuntimeError
        No CUDA device (:class:`~jaxgraph.CudaUnavailableError`), or a capture
        failed. Every argument is checked before any device work.

    Notes
    -----
    The graphs of one call share a pool, so replay them in the order they
    were captured when you call them on device arrays (torch's rule), and read
    each one's outputs before calling one captured earlier. Inside ``jax.jit``
    every call returns fresh arrays and the order is free. Each call must
    write every element of each output it returns. A callable that updates an
    argument in place and returns it gets that argument's new value back; one
    that updates an argument without returning it is, inside ``jax.jit``, a
    function that ignores the update. Inside ``jax.jit`` an argument returned
    updated in place is one XLA buffer (the replay's output aliases its
    operand), so a loop (``lax.fori_loop``, ``lax.scan``) carries such state
    without copies; a callable that returns new arrays makes XLA copy each of
    them into the loop's carry on every trip (``examples/gray_scott.py``
    ping-pongs between its state and a scratch pair so that its last kernel
    writes the state). At JAX's defaults XLA records a loop body into one of
    its command buffers only from 5 operations on, so a body of one replay
    and a little bookkeeping is launched piece by piece, a few microseconds a
    trip; ``jax.jit(loop, compiler_options={"xla_gpu_graph_min_graph_size":
    1})`` lets XLA record it, for that function alone (``gray_scott``: 0.979x
    XLA's speed without, 1.004x with it; ``benchmarks/gray_scott_bench.py``).

    .. warning:: This API is in beta and may change in future releases.

    Examples
    --------
    >>> def scale(x):
    ...     y = jaxgraph.empty(x.shape)
    ...     k[blocks, 256](y, x, 2.0, x.size)
    ...     return y
    >>> graphed = jaxgraph.make_graphed_callables(scale, (x0,))
    >>> jax.jit(lambda x: graphed(x) + 1)(x)
    """
    single = not isinstance(callables, tuple)
    entries = pair_entries(callables, sample_args, backward, single)
    check_options(num_warmup_iters, allow_unused_input, capture_error_mode)
    mempool = _memory.pool_from_token(pool) if pool is not None else _memory.MemPool()
    for e in entries:
        e.static_in = [static_copy(leaf) for leaf in e.leaves]
    warm_up(entries, num_warmup_iters)
    for e in entries:
        capture_forward(e, mempool, capture_error_mode)
    for e in reversed(entries):
        if e.backward is not None:
            capture_backward(e, mempool, capture_error_mode, bool(allow_unused_input))
    graphed = tuple(_graphed(e, mempool) for e in entries)
    return graphed[0] if single else graphed


def _graphed(e: Entry, pool: Any) -> GraphedCallable:
    """The replayables of ``e``'s graphs, wrapped as its graphed callable."""
    keep: list = [pool]
    vjp = parts = None
    if e.backward_graph is not None:
        inputs = [*e.static_in, *e.static_out, *e.static_ct]
        # No copies for what the backward never reads: those inputs are left out.
        bwd, used = replayable_of_referenced(e.backward_graph, inputs, e.static_grad)
        vjp = _vjp_backward(bwd, used, len(e.static_in), e.static_out, e.grad_slots)
        keep.append(bwd)
        parts = (tuple(e.static_ct), tuple(e.static_grad), tuple(e.grad_slots), tuple(used))
    step = replayable(e.graph, inputs=e.static_in, outputs=e.static_out, backward=vjp)
    return GraphedCallable._create(e.name, e.in_tree, e.out_tree, e.out_slots, step, graph=e.graph,
                                   backward_graph=e.backward_graph, static_inputs=e.static_in,
                                   static_outputs=e.static_out, keep=keep, backward_parts=parts)


def _vjp_backward(step: Any, used: Sequence[bool], n_in: int, outputs: Sequence[Any],
                  grad_slots: Sequence[int | None]) -> Callable[..., tuple]:
    """The ``backward=`` of the forward replayable: ``(*inputs, *outputs, *cotangents)`` in,
    one cotangent per input leaf out (``None`` where there is none), through ``step``."""
    n_out = len(outputs)
    shapes = [(tuple(o.shape), np.dtype(o.dtype)) for o in outputs]
    single = len(step.out_shapes) == 1

    def backward(*values: Any) -> tuple:
        import jax
        import jax.numpy as jnp

        values = list(values)
        for k, (shape, dtype) in enumerate(shapes):  # integer outputs get float0 cotangents from JAX
            i = n_in + n_out + k
            if values[i].dtype == jax.dtypes.float0:
                values[i] = jnp.zeros(shape, dtype)
        grads = step(*[v for v, u in zip(values, used) if u])
        grads = (grads,) if single else grads
        return tuple(None if s is None else grads[s] for s in grad_slots)

    return backward
