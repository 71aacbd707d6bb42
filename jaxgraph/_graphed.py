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
and wraps each graph in a :class:`~jaxgraph.Replayable` (``_replayable.py``),
the JAX side. Given a backward callable, it captures the backward too (in
reverse order, as torch does), and the JAX function carries a
``jax.custom_vjp`` whose backward replays that graph, so ``jax.grad`` works.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from . import _memory
from ._array import DeviceArray, asarray, empty, zeros
from ._capture import graph
from ._checks import capture_mode
from ._graphs import CUDAGraph
from ._jax_replay import fmt, fmt_all
from ._replayable import Replayable, replayable, replayable_of_referenced
from ._stream import Stream, stream, synchronize

__all__ = ["GraphedCallable", "make_graphed_callables"]

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
                keep: Sequence[Any] = ()) -> "GraphedCallable":
        """Build from parts; :func:`make_graphed_callables` captures them (tests use this directly).

        ``out_slots`` maps each output leaf to one of ``step``'s outputs (a
        callable may return one array twice); ``keep`` holds what must live as
        long as this object (the pool, the backward replayable).
        """
        self = object.__new__(cls)
        self.__name__ = name  # how jax.jit names the function
        self._in_tree, self._out_tree, self._out_slots = in_tree, out_tree, tuple(out_slots)
        self._step = step
        self._single = len(step.out_shapes) == 1
        self.graph, self.backward_graph = graph, backward_graph
        self._static_in, self._static_out = tuple(static_inputs), tuple(static_outputs)
        self._keep = tuple(keep)
        return self

    # -- introspection --------------------------------------------------------------

    @property
    def replayable(self) -> Replayable:
        """The :class:`Replayable` of the forward graph: what a call with JAX arrays replays."""
        return self._step

    @property
    def static_inputs(self) -> Any:
        """The graph's static input arrays, structured as the sample arguments (device-array calls fill them)."""
        return _unflatten(self._in_tree, self._static_in)

    @property
    def static_outputs(self) -> Any:
        """The graph's static output arrays, structured as the outputs (the next device-array call overwrites them)."""
        return _unflatten(self._out_tree, [self._static_out[s] for s in self._out_slots])

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
        if any(_is_device_array(a) for a in leaves):
            outs = self._replay_eagerly(leaves)
        else:
            out = self._step(*leaves)
            outs = (out,) if self._single else out
        return _unflatten(self._out_tree, [outs[s] for s in self._out_slots])

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
        device arrays, ``jax.Array``, numpy arrays or CUDA arrays (CuPy, torch).
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
    function that ignores the update.

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
    entries = _entries(callables, sample_args, backward, single)
    _check_options(num_warmup_iters, allow_unused_input, capture_error_mode)
    mempool = _memory.pool_from_token(pool) if pool is not None else _memory.MemPool()
    for e in entries:
        e.static_in = [_static_copy(leaf) for leaf in e.leaves]
    _warm_up(entries, num_warmup_iters)
    for e in entries:
        _capture_forward(e, mempool, capture_error_mode)
    for e in reversed(entries):
        if e.backward is not None:
            _capture_backward(e, mempool, capture_error_mode, bool(allow_unused_input))
    graphed = tuple(_graphed(e, mempool) for e in entries)
    return graphed[0] if single else graphed


# ----------------------------------------------------------------------------
# Checking the arguments (no device work)
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class _Entry:
    """One callable on its way to a graph; filled in as the steps run."""

    where: str                 # "" for a single callable, "[i]" in a tuple
    forward: Callable[..., Any]
    backward: Callable[..., Any] | None
    args: tuple                # the sample arguments, as given
    leaves: list               # their leaves, flattened
    paths: list                # each leaf's key path, e.g. "[1]['w']"
    in_tree: Any
    static_in: list = dataclasses.field(default_factory=list)
    graph: CUDAGraph | None = None
    out_tree: Any = None
    static_out: list = dataclasses.field(default_factory=list)   # distinct output arrays
    out_slots: list = dataclasses.field(default_factory=list)    # output leaf -> static_out index
    backward_graph: CUDAGraph | None = None
    static_ct: list = dataclasses.field(default_factory=list)    # one cotangent per static_out
    static_grad: list = dataclasses.field(default_factory=list)  # distinct cotangent arrays
    grad_slots: list = dataclasses.field(default_factory=list)   # input leaf -> static_grad index or None

    @property
    def name(self) -> str:
        return getattr(self.forward, "__name__", type(self.forward).__name__)

    def static_args(self) -> tuple:
        return _unflatten(self.in_tree, self.static_in)


def _entries(callables: Any, sample_args: Any, backward: Any, single: bool) -> list[_Entry]:
    """Check the callables, sample arguments and backwards; pair them up."""
    import jax

    if single:
        callables, sample_args = (callables,), (sample_args,)
        if backward is not None and not isinstance(backward, (tuple, list)):
            backward = (backward,)
    n = len(callables)
    if not isinstance(sample_args, (tuple, list)) or len(sample_args) != n:
        got = f"{len(sample_args)} entries" if isinstance(sample_args, (tuple, list)) else type(sample_args).__name__
        hint = (" (a (forward, backward) pair is written ((forward, backward),), or forward with backward=)"
                if n == 2 else "")
        raise ValueError(f"make_graphed_callables: got {n} callables, so sample_args must be a tuple of {n} "
                         f"argument tuples, one per callable; got {got}{hint}")
    if backward is None:
        backward = (None,) * n
    elif not isinstance(backward, (tuple, list)):
        raise TypeError(f"with {n} callables, backward must be a tuple with one entry (a callable or None) "
                        f"per callable, got {type(backward).__name__}")
    elif len(backward) != n:
        raise ValueError(f"with {n} callables, backward must be a tuple with one entry (a callable or None) "
                         f"per callable, got {len(backward)} entries")
    entries = []
    for i, (c, args, bwd) in enumerate(zip(callables, sample_args, backward)):
        where = "" if single else f"[{i}]"
        if isinstance(c, tuple) and len(c) == 2:
            if bwd is not None:
                raise ValueError(f"callables{where} is a (forward, backward) pair and backward{where} is "
                                 "given too; give the backward once")
            c, bwd = c
        if not callable(c):
            raise TypeError(f"callables{where} must be callable (or a (forward, backward) pair), "
                            f"got {type(c).__name__}")
        if bwd is not None and not callable(bwd):
            raise TypeError(f"the backward of callables{where} must be callable or None, got {type(bwd).__name__}")
        if not isinstance(args, (tuple, list)):
            raise TypeError(f"sample_args{where} must be a tuple of the callable's arguments (for one argument "
                            f"write (x,)), got {type(args).__name__}")
        args = tuple(args)
        pairs, in_tree = jax.tree_util.tree_flatten_with_path(args)
        paths = [jax.tree_util.keystr(path) for path, _ in pairs]
        leaves = [leaf for _, leaf in pairs]
        for path, leaf in zip(paths, leaves):
            _check_sample_leaf(f"sample_args{where}{path}", leaf)
        entries.append(_Entry(where, c, bwd, args, leaves, paths, in_tree))
    return entries


def _check_sample_leaf(label: str, leaf: Any) -> None:
    import jax

    if isinstance(leaf, jax.core.Tracer):
        raise TypeError(f"{label} is a traced value: make_graphed_callables runs and captures the callables "
                        "now, so call it outside jax.jit, grad and vmap, with concrete arrays")
    if not (isinstance(leaf, (DeviceArray, np.ndarray, jax.Array)) or _is_device_array(leaf)):
        raise TypeError(f"sample_args must contain only arrays (jaxgraph.DeviceArray, jax.Array, numpy or "
                        f"CUDA arrays); other types are not allowed: {label} is a {type(leaf).__name__}")


def _check_options(num_warmup_iters: Any, allow_unused_input: Any, capture_error_mode: Any) -> None:
    if isinstance(num_warmup_iters, bool) or not isinstance(num_warmup_iters, (int, np.integer)):
        raise TypeError(f"num_warmup_iters must be an int, got {type(num_warmup_iters).__name__}")
    if num_warmup_iters < 0:
        raise ValueError(f"num_warmup_iters must be >= 0, got {num_warmup_iters}")
    if not isinstance(allow_unused_input, (bool, np.bool_)):
        raise TypeError(f"allow_unused_input must be a bool, got {type(allow_unused_input).__name__}")
    capture_mode(capture_error_mode)


# ----------------------------------------------------------------------------
# Warming up and capturing
# ----------------------------------------------------------------------------


def _static_copy(leaf: Any) -> DeviceArray:
    """A new device array holding the sample's values: the graph's static input."""
    import jax

    source = leaf
    if isinstance(leaf, jax.Array):
        try:
            source = asarray(leaf)      # on the GPU: wrapped, no host round trip
        except TypeError:
            source = np.asarray(leaf)   # on JAX's CPU backend
    static = empty(tuple(source.shape), np.dtype(source.dtype))
    if static.nbytes:
        static.copy_(source)
    return static


def _warm_up(entries: list[_Entry], iters: int) -> None:
    """Run each callable (then its backward) ``iters`` times on a side stream, as torch does."""
    if iters == 0:
        return
    synchronize()
    side = Stream()
    with stream(side):
        for e in entries:
            args = e.static_args()
            for _ in range(iters):
                outputs = e.forward(*args)
                if e.backward is not None:
                    e.backward(*args, outputs, _zeros_like(outputs))
                del outputs
    side.synchronize()
    synchronize()


def _capture_forward(e: _Entry, pool: Any, mode: str) -> None:
    """Capture ``e.forward`` on the static inputs; note its distinct outputs."""
    import jax

    g = CUDAGraph()
    with graph(g, pool=pool, capture_error_mode=mode):
        outputs = e.forward(*e.static_args())
    pairs, e.out_tree = jax.tree_util.tree_flatten_with_path(outputs)
    arrays = [_device_result(f"output{jax.tree_util.keystr(path)} of callables{e.where} ({e.name})", leaf)
              for path, leaf in pairs]
    if not arrays:
        raise ValueError(f"callables{e.where} ({e.name}) returned no arrays: a graphed callable returns at "
                         "least one device array (XLA drops calls without results)")
    e.static_out, e.out_slots = _distinct(arrays)
    e.graph = g


def _capture_backward(e: _Entry, pool: Any, mode: str, allow_unused: bool) -> None:
    """Capture ``e.backward`` on the static inputs, outputs and new static cotangents."""
    for i, out in enumerate(e.static_out):
        for j, static in enumerate(e.static_in):
            if _overlap(out, static):
                raise ValueError(f"callables{e.where} ({e.name}) returns its argument {e.paths[j]}, updated in "
                                 "place: with a backward, return new arrays, since the backward needs the "
                                 "argument as it was")
    e.static_ct = [zeros(out.shape, out.dtype) for out in e.static_out]
    outputs = _unflatten(e.out_tree, [e.static_out[s] for s in e.out_slots])
    cotangents = _unflatten(e.out_tree, [e.static_ct[s] for s in e.out_slots])
    g = CUDAGraph()
    with graph(g, pool=pool, capture_error_mode=mode):
        grads = e.backward(*e.static_args(), outputs, cotangents)
    leaves = _grad_leaves(e, grads)
    arrays = []
    for path, static, grad in zip(e.paths, e.static_in, leaves):
        label = f"the backward of callables{e.where} ({e.name}): the cotangent of argument {path}"
        inexact = np.issubdtype(static.dtype, np.inexact)
        if grad is None:
            if inexact and not allow_unused:
                raise ValueError(f"{label} is None, so its gradient would always be zero; return one, or "
                                 "pass allow_unused_input=True to allow it")
            arrays.append(None)
            continue
        if not inexact:
            raise TypeError(f"{label}: the argument is {static.dtype}, which has no gradient; return None for it")
        grad = _device_result(label, grad)
        if grad.shape != static.shape or grad.dtype != static.dtype:
            raise ValueError(f"{label} is {fmt(grad)}; the argument is {fmt(static)}")
        arrays.append(grad)
    present = [a for a in arrays if a is not None]
    if not present:
        raise ValueError(f"the backward of callables{e.where} ({e.name}) returned no cotangent at all")
    e.static_grad, slots = _distinct(present)
    it = iter(slots)
    e.grad_slots = [None if a is None else next(it) for a in arrays]
    e.backward_graph = g


def _grad_leaves(e: _Entry, grads: Any) -> list:
    """The backward's result as one entry (array or None) per input leaf."""
    import jax

    n = len(e.args)
    if n == 1 and not (isinstance(grads, (tuple, list)) and len(grads) == 1):
        grads = (grads,)
    if not isinstance(grads, (tuple, list)) or len(grads) != n:
        got = f"{len(grads)} entries" if isinstance(grads, (tuple, list)) else type(grads).__name__
        raise TypeError(f"the backward of callables{e.where} ({e.name}) must return a tuple with one "
                        f"cotangent per argument of the forward ({n}), got {got}")
    leaves = []
    for k, (arg, grad) in enumerate(zip(e.args, grads)):
        tree = jax.tree_util.tree_structure(arg)
        if grad is None:
            leaves += [None] * tree.num_leaves
            continue
        try:
            leaves += tree.flatten_up_to(grad)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"the backward of callables{e.where} ({e.name}): the cotangent of argument {k} "
                            f"must have the argument's structure {tree} (None for no gradient): {exc}") from None
    return leaves


def _graphed(e: _Entry, pool: Any) -> GraphedCallable:
    """The replayables of ``e``'s graphs, wrapped as its graphed callable."""
    keep: list = [pool]
    vjp = None
    if e.backward_graph is not None:
        inputs = [*e.static_in, *e.static_out, *e.static_ct]
        # No copies for what the backward never reads: those inputs are left out.
        bwd, used = replayable_of_referenced(e.backward_graph, inputs, e.static_grad)
        vjp = _vjp_backward(bwd, used, len(e.static_in), e.static_out, e.grad_slots)
        keep.append(bwd)
    step = replayable(e.graph, inputs=e.static_in, outputs=e.static_out, backward=vjp)
    return GraphedCallable._create(e.name, e.in_tree, e.out_tree, e.out_slots, step, graph=e.graph,
                                   backward_graph=e.backward_graph, static_inputs=e.static_in,
                                   static_outputs=e.static_out, keep=keep)


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


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _is_device_array(value: Any) -> bool:
    """A jaxgraph array or another library's CUDA array (not a JAX array, which takes the JAX path)."""
    import jax

    if isinstance(value, DeviceArray):
        return True
    return not isinstance(value, jax.Array) and hasattr(type(value), "__cuda_array_interface__")


def _device_result(what: str, value: Any) -> DeviceArray:
    """``value`` (something a callable returned) as a DeviceArray, or a clear ``TypeError``."""
    if not (_is_device_array(value) or type(value).__module__.startswith(("jax", "jaxlib"))):
        raise TypeError(f"{what} is a {type(value).__name__}: graphed callables return device arrays "
                        "(e.g. made with jaxgraph.empty inside the callable)")
    return asarray(value)


def _zeros_like(tree: Any) -> Any:
    """Zero device arrays shaped like the arrays in ``tree`` (warm-up cotangents)."""
    import jax

    def zero(leaf):
        return zeros(tuple(leaf.shape), np.dtype(leaf.dtype)) if hasattr(leaf, "shape") else leaf

    return jax.tree_util.tree_map(zero, tree)


def _distinct(arrays: Sequence[DeviceArray]) -> tuple[list, list]:
    """The distinct arrays (by memory, shape and dtype), and each array's index among them."""
    distinct: list = []
    slots = []
    for a in arrays:
        key = (a.ptr, a.nbytes, tuple(a.shape), a.dtype)
        for k, b in enumerate(distinct):
            if a.nbytes and (b.ptr, b.nbytes, tuple(b.shape), b.dtype) == key:
                slots.append(k)
                break
        else:
            slots.append(len(distinct))
            distinct.append(a)
    return distinct, slots


def _overlap(a: Any, b: Any) -> bool:
    return a.nbytes > 0 and b.nbytes > 0 and a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes


def _unflatten(tree: Any, leaves: Sequence[Any]) -> Any:
    import jax

    return jax.tree_util.tree_unflatten(tree, list(leaves))
