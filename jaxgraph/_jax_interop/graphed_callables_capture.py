"""How :func:`~jaxgraph.make_graphed_callables` gets its graphs: checks, warm-up, capture.

:func:`pair_entries` checks the callables, sample arguments and backwards (no
device work) and pairs them into :class:`Entry` records; :func:`static_copy`
makes the static inputs; :func:`warm_up` runs each callable on a side stream,
as torch does; :func:`capture_forward` and :func:`capture_backward` capture
each into a :class:`~jaxgraph.CUDAGraph` and note its distinct outputs and
cotangents. ``_jax_interop/graphed_callables.py`` is the API and wraps the graphs as replayables.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from .._cuda.array import DeviceArray, asarray, empty, is_jax_object, zeros
from .._graphs.capture_contexts import graph
from .._cuda.checks import arrays_overlap, capture_mode, fmt
from .._graphs.cuda_graph import CUDAGraph
from .._cuda.stream import Stream, stream, synchronize

__all__ = ["Entry", "capture_backward", "capture_forward", "check_options", "is_device_array", "pair_entries",
           "static_copy", "unflatten", "warm_up"]


# ----------------------------------------------------------------------------
# Checking the arguments (no device work)
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class Entry:
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
        return unflatten(self.in_tree, self.static_in)


def pair_entries(callables: Any, sample_args: Any, backward: Any, single: bool) -> list[Entry]:
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
        entries.append(Entry(where, c, bwd, args, leaves, paths, in_tree))
    return entries


def _check_sample_leaf(label: str, leaf: Any) -> None:
    import jax

    if isinstance(leaf, jax.core.Tracer):
        raise TypeError(f"{label} is a traced value: make_graphed_callables runs and captures the callables "
                        "now, so call it outside jax.jit, grad and vmap, with concrete arrays")
    if not (isinstance(leaf, (DeviceArray, np.ndarray, jax.Array)) or is_device_array(leaf)):
        raise TypeError(f"sample_args must contain only arrays (jaxgraph.DeviceArray, jax.Array, numpy or "
                        f"CUDA arrays); other types are not allowed: {label} is a {type(leaf).__name__}")


def check_options(num_warmup_iters: Any, allow_unused_input: Any, capture_error_mode: Any) -> None:
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


def static_copy(leaf: Any) -> DeviceArray:
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


def warm_up(entries: list[Entry], iters: int) -> None:
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


def capture_forward(e: Entry, pool: Any, mode: str) -> None:
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


def capture_backward(e: Entry, pool: Any, mode: str, allow_unused: bool) -> None:
    """Capture ``e.backward`` on the static inputs, outputs and new static cotangents."""
    for i, out in enumerate(e.static_out):
        for j, static in enumerate(e.static_in):
            if arrays_overlap(out, static):
                raise ValueError(f"callables{e.where} ({e.name}) returns its argument {e.paths[j]}, updated in "
                                 "place: with a backward, return new arrays, since the backward needs the "
                                 "argument as it was")
    e.static_ct = [zeros(out.shape, out.dtype) for out in e.static_out]
    outputs = unflatten(e.out_tree, [e.static_out[s] for s in e.out_slots])
    cotangents = unflatten(e.out_tree, [e.static_ct[s] for s in e.out_slots])
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


def _grad_leaves(e: Entry, grads: Any) -> list:
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


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def is_device_array(value: Any) -> bool:
    """A jaxgraph array or another library's CUDA array (not a JAX array, which takes the JAX path)."""
    import jax

    if isinstance(value, DeviceArray):
        return True
    return not isinstance(value, jax.Array) and hasattr(type(value), "__cuda_array_interface__")


def _device_result(what: str, value: Any) -> DeviceArray:
    """``value`` (something a callable returned) as a DeviceArray, or a clear ``TypeError``."""
    if not (is_device_array(value) or is_jax_object(value)):
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


def unflatten(tree: Any, leaves: Sequence[Any]) -> Any:
    import jax

    return jax.tree_util.tree_unflatten(tree, list(leaves))
