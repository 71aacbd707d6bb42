"""make_graphed_callables on the CPU: argument checks, and the JAX plumbing of a graphed callable.

The tests of the plumbing build a GraphedCallable from ``via="callback"``
replayables whose host functions are numpy stand-ins for the graphs (with the
private ``_create``s), so everything JAX sees (pytrees, duplicate outputs,
``jit``, the ``custom_vjp`` backward with its input pruning and float0
cotangents) is the real code. Graphed steps on the GPU are in
test_graphed_gpu.py.

Tests internals (listed in tests/README.md): ``GraphedCallable._create``,
``_graphed_callables._vjp_backward``, ``internals.spec_replayable``; the JAX plumbing of graphed
callables on a CPU, over host-callback stand-ins.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
from jaxgraph._jax_interop.graphed_callables import GraphedCallable, _vjp_backward
from support.internals import spec_replayable

X = np.zeros(8, np.float32)


def sds(shape, dtype=np.float32):
    return jax.ShapeDtypeStruct(shape, np.dtype(dtype))


def never_called(*args):
    raise AssertionError("make_graphed_callables called the callable before checking its arguments")


# ---------------------------------------------------------------------------
# CPU: argument checks happen before any device work
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("call, exc, match", [
    (lambda: jaxgraph.make_graphed_callables(3, (X,)), TypeError, r"callables must be callable .* got int"),
    (lambda: jaxgraph.make_graphed_callables(never_called, X), TypeError,
     r"sample_args must be a tuple of the callable's arguments \(for one argument write \(x,\)\), got ndarray"),
    (lambda: jaxgraph.make_graphed_callables(never_called, (X, 2.0)), TypeError,
     r"sample_args must contain only arrays .* other types are not allowed: sample_args\[1\] is a float"),
    (lambda: jaxgraph.make_graphed_callables(never_called, (X, {"w": "abc"})), TypeError,
     r"sample_args\[1\]\['w'\] is a str"),
    (lambda: jaxgraph.make_graphed_callables((never_called, never_called), ((X,),)), ValueError,
     r"got 2 callables, so sample_args must be a tuple of 2 argument tuples.*got 1 entries"
     r".*\(\(forward, backward\),\)"),
    (lambda: jaxgraph.make_graphed_callables((never_called,), (X,)), TypeError,
     r"sample_args\[0\] must be a tuple of the callable's arguments"),
    (lambda: jaxgraph.make_graphed_callables((never_called, 5), ((X,), (X,))), TypeError,
     r"callables\[1\] must be callable"),
    (lambda: jaxgraph.make_graphed_callables((never_called, never_called), ((X,), (X,)), backward=never_called),
     TypeError, "with 2 callables, backward must be a tuple with one entry"),
    (lambda: jaxgraph.make_graphed_callables((never_called,), ((X,),), backward=(never_called, None)),
     ValueError, "with 1 callables, backward must be a tuple .* got 2 entries"),  # a count: as documented
    (lambda: jaxgraph.make_graphed_callables(never_called, (X,), backward=7), TypeError,
     "the backward of callables must be callable or None, got int"),
    (lambda: jaxgraph.make_graphed_callables(((never_called, never_called),), ((X,),), backward=(never_called,)),
     ValueError, r"callables\[0\] is a \(forward, backward\) pair and backward\[0\] is given too"),
    (lambda: jaxgraph.make_graphed_callables(never_called, (X,), num_warmup_iters=-1), ValueError,
     "num_warmup_iters must be >= 0, got -1"),
    (lambda: jaxgraph.make_graphed_callables(never_called, (X,), num_warmup_iters=1.5), TypeError,
     "num_warmup_iters must be an int, got float"),
    (lambda: jaxgraph.make_graphed_callables(never_called, (X,), num_warmup_iters=True), TypeError,
     "num_warmup_iters must be an int, got bool"),
    (lambda: jaxgraph.make_graphed_callables(never_called, (X,), allow_unused_input="yes"), TypeError,
     "allow_unused_input must be a bool, got str"),
    (lambda: jaxgraph.make_graphed_callables(never_called, (X,), capture_error_mode="sometimes"), ValueError,
     "capture_error_mode must be one of 'global', 'thread_local', 'relaxed', got 'sometimes'"),
    (lambda: jaxgraph.make_graphed_callables(never_called, (X,), pool="mine"), TypeError,
     "pool must be a token from graph_pool_handle"),
    (lambda: jaxgraph.make_graphed_callables(never_called, (X,), pool=(0, 10**9)), ValueError,
     r"pool \(0, 1000000000\) no longer exists"),
])
def test_bad_arguments_are_clear_errors_before_any_device_work(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_traced_sample_args_are_refused():
    def under_jit(x):
        jaxgraph.make_graphed_callables(never_called, (x,))
        return x

    with pytest.raises(TypeError, match=r"sample_args\[0\] is a traced value: .* call it outside jax.jit"):
        jax.jit(under_jit)(jnp.ones(3))


def test_graphed_callable_is_built_by_its_factory():
    with pytest.raises(RuntimeError, match=r"jaxgraph.make_graphed_callables\(\.\.\.\)"):
        jaxgraph.GraphedCallable()


# ---------------------------------------------------------------------------
# CPU: the JAX side of a graphed callable, with numpy stand-ins for the graphs
# ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def jax_on_cpu(request):
    """Stand-in tests run on JAX's CPU backend (a failing host callback on the GPU
    leaves XLA's stream in an error state for the process)."""
    if "gpu" in request.keywords:
        yield
        return
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def stand_in(args, outputs, forward, backward=None, out_slots=None):
    """A GraphedCallable over a callback replayable whose host function is ``forward``."""
    leaves, in_tree = jax.tree_util.tree_flatten(args)
    step = spec_replayable([sds(np.shape(a), np.asarray(a).dtype) for a in leaves], outputs[1], via="callback",
                           host=forward, backward=backward)
    slots = out_slots if out_slots is not None else range(len(outputs[1]))
    return GraphedCallable._create("step", in_tree, outputs[0], slots, step)


def test_pytree_arguments_and_results_keep_their_structure(rng):
    x, w, b = (rng.standard_normal(16).astype(np.float32) for _ in range(3))
    args = (x, {"w": w, "b": b})
    out_tree = jax.tree_util.tree_structure((0, {"z": 0, "y_again": 0}))
    # Outputs: y = x * w and z = y + b; y is returned twice (one static output, two leaves).
    graphed = stand_in(args, (out_tree, [sds((16,)), sds((16,))]),
                       lambda x, b, w: (x * w, x * w + b),  # leaves in pytree order: x, b, w
                       out_slots=[0, 0, 1])
    for f in (graphed, jax.jit(graphed)):
        y, rest = f(*args)
        np.testing.assert_allclose(np.asarray(y), x * w, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(rest["y_again"]), x * w, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(rest["z"]), x * w + b, rtol=1e-6)
    assert "step(float32[16], float32[16], float32[16]) -> (float32[16], float32[16])" in repr(graphed)


def test_mismatched_pytrees_and_keywords_are_clear_errors():
    graphed = stand_in((X, {"w": X}), (jax.tree_util.tree_structure(0), [sds((8,))]), lambda x, w: (x * w,))
    with pytest.raises(TypeError, match=r"step was captured for arguments structured as "
                                        r"PyTreeDef\(\(\*, \{'w': \*\}\)\), got PyTreeDef\(\(\*, \*\)\)"):
        graphed(X, X)
    with pytest.raises(TypeError, match="takes its arguments by position, as when it was captured; got keyword"):
        graphed(X, w={"w": X})
    with pytest.raises(ValueError, match=r"replayable input 1: expected shape \(8,\)"):
        graphed(X, {"w": np.zeros(9, np.float32)})


def test_grad_through_the_backward_stand_in_prunes_unused_inputs_and_handles_integers(rng):
    """Forward (x, w, n) -> (y = x * w, count: int32). The backward graph reads
    x, w and y's cotangent only: the pruned residuals (n, y, the count and its
    float0 cotangent) never reach it."""
    seen = []

    def backward_host(x, w, ct_y, ct_count):
        seen.append((ct_y.copy(), ct_count.copy()))
        return ct_y * w, ct_y * x

    bwd = spec_replayable((sds((8,)),) * 3 + (sds((), np.int32),), (sds((8,)), sds((8,))), via="callback",
                          host=backward_host)
    # Inputs of the backward's call: x, w, n | y, count | ct_y, ct_count; n, y are not read.
    used = [True, True, False, False, False, True, True]
    vjp = _vjp_backward(bwd, used, 3, [sds((8,)), sds((), np.int32)], [0, 1, None])
    out_tree = jax.tree_util.tree_structure((0, 0))
    graphed = stand_in((X, X, np.int32(0)), (out_tree, [sds((8,)), sds((), np.int32)]),
                       lambda x, w, n: (x * w, np.int32((x > 0).sum() + n)), backward=vjp)
    x, w, c = (rng.standard_normal(8).astype(np.float32) for _ in range(3))
    loss = lambda x, w: jnp.sum(jnp.tanh(graphed(x, w, jnp.int32(3))[0]) * c)
    value, (gx, gw) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, w)
    dy = (1 - np.tanh(x * w) ** 2) * c
    np.testing.assert_allclose(float(value), np.sum(np.tanh(x * w) * c), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(gx), dy * w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(gw), dy * x, rtol=1e-5, atol=1e-6)
    (ct_y, ct_count), = seen
    np.testing.assert_allclose(ct_y, dy, rtol=1e-5, atol=1e-6)
    assert ct_count.dtype == np.int32 and ct_count == 0  # JAX's float0 became a zero of the output's dtype
