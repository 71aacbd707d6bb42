"""make_graphed_callables on the GPU: graphed steps of real captures.

The tests capture real kernels and compare with the same callable run eagerly
and with numpy, on fresh random inputs.

Tests internals (listed in tests/README.md): ``GraphedCallable._keep``; which inputs the
backward replay keeps.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
from support.kernel_sources import ACCUMULATE, ADD, AXPB, COUNT_POSITIVE, MUL, SQUARE_MUL


# ---------------------------------------------------------------------------
# GPU: real captures
# ---------------------------------------------------------------------------

SRC = MUL + ADD + AXPB + ACCUMULATE + SQUARE_MUL + COUNT_POSITIVE

SHAPE = (48, 65)  # 3120 elements: not a multiple of the block
N = SHAPE[0] * SHAPE[1]
BLOCKS = (N + 255) // 256


@pytest.fixture(scope="module")
def k():
    import types

    names = ("mul", "add", "axpb", "accumulate", "square_mul", "square_mul_bwd", "count_positive")
    return types.SimpleNamespace(**{name: jaxgraph.Kernel(SRC, name) for name in names})


def randn(rng, shape=SHAPE):
    return rng.standard_normal(shape).astype(np.float32)


def poison(tree):
    for a in jax.tree_util.tree_leaves(tree):
        a.fill_(np.float32(np.nan) if a.dtype == np.float32 else -1)


def host(tree):
    return jax.tree_util.tree_map(lambda a: a.numpy() if isinstance(a, jaxgraph.DeviceArray) else np.asarray(a), tree)


def square_mul_layer(k):
    """``(forward, backward)`` of y = x * x * w, each launching its kernel on fresh pool arrays."""
    def forward(x, w):
        y = jaxgraph.empty(x.shape)
        k.square_mul[BLOCKS, 256](y, x, w, N)
        return y

    def backward(x, w, y, g):
        gx, gw = jaxgraph.empty(x.shape), jaxgraph.empty(x.shape)
        k.square_mul_bwd[BLOCKS, 256](gx, gw, x, w, g, N)
        return gx, gw

    return forward, backward


@pytest.mark.gpu
def test_graphed_matches_eager_inside_and_outside_jit_on_fresh_inputs(k, rng):
    def step(x, p):
        y = jaxgraph.empty(x.shape)
        k.mul[BLOCKS, 256](y, x, p["w"], N)
        z = jaxgraph.empty(x.shape)
        k.add[BLOCKS, 256](z, y, p["b"], N)
        t = jaxgraph.empty(x.shape)  # a temporary from the pool
        k.axpb[BLOCKS, 256](t, z, 2.0, -1.0, N)
        u = jaxgraph.empty(x.shape)
        k.mul[BLOCKS, 256](u, t, x, N)
        return y, {"u": u, "y_again": y}

    def reference(x, p):
        y = x * p["w"]
        u = (np.float32(2) * (y + p["b"]) - np.float32(1)) * x
        return y, {"u": u, "y_again": y}

    sample = (jaxgraph.asarray(randn(rng)), {"w": jaxgraph.asarray(randn(rng)), "b": jaxgraph.asarray(randn(rng))})
    graphed = jaxgraph.make_graphed_callables(step, sample)
    jitted = jax.jit(lambda x, p: graphed(x, p))
    for _ in range(3):
        x, p = randn(rng), {"w": randn(rng), "b": randn(rng)}
        want = reference(x, p)
        d_args = (jaxgraph.asarray(x), {k_: jaxgraph.asarray(v) for k_, v in p.items()})
        eager = host(step(*d_args))                      # the callable itself, launched eagerly
        poison(graphed.static_outputs)
        replayed = host(graphed(*d_args))                # one replay on device arrays
        outside = host(graphed(jnp.asarray(x), jax.tree_util.tree_map(jnp.asarray, p)))  # JAX, no jit
        inside = host(jitted(x, p))                      # JAX, in jit
        for got in (eager, replayed, outside, inside):
            jax.tree_util.tree_map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5), got, want)
        jax.tree_util.tree_map(np.testing.assert_array_equal, replayed, eager)
        jax.tree_util.tree_map(np.testing.assert_array_equal, inside, eager)
    # Eager replays return the static outputs themselves, as torch does (the next call overwrites them).
    y, rest = graphed(*d_args)
    assert y is rest["y_again"] is graphed.static_outputs[0]


@pytest.mark.gpu
def test_grad_through_a_graphed_callable_matches_jax_and_numpy(k, rng):
    forward, backward = square_mul_layer(k)
    graphed = jaxgraph.make_graphed_callables(forward, (randn(rng), randn(rng)), backward=backward)
    assert graphed.backward_graph is not None
    # The backward never reads y: it is not among the backward replay's inputs (x, w, g).
    assert len(graphed._keep[-1].in_shapes) == 3
    c = randn(rng)
    loss = lambda x, w: jnp.sum(jnp.tanh(graphed(x, w)) * c)
    loss_ref = lambda x, w: jnp.sum(jnp.tanh(x * x * w) * c)
    for f in (jax.value_and_grad(loss, argnums=(0, 1)), jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))):
        x, w = randn(rng), randn(rng)
        value, (gx, gw) = f(x, w)
        value_ref, (gx_ref, gw_ref) = jax.value_and_grad(loss_ref, argnums=(0, 1))(x, w)
        x64, w64, c64 = (np.asarray(a, np.float64) for a in (x, w, c))
        dy = (1 - np.tanh(x64 * x64 * w64) ** 2) * c64  # the formula in float64
        np.testing.assert_allclose(float(value), float(value_ref), rtol=1e-4)
        for got, ref, formula, scale in ((gx, gx_ref, 2 * x64 * w64 * dy, np.abs(2 * x64 * w64 * c64)),
                                         (gw, gw_ref, x64 * x64 * dy, np.abs(x64 * x64 * c64))):
            np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-4, atol=1e-5)
            # In float32, 1 - tanh(u)**2 cancels where tanh(u) nears 1 (XLA's may reach 1 exactly):
            # an error of a few float32 eps times `scale`, which a wrong gradient far exceeds.
            slack = 1e-4 * np.abs(formula) + 4 * np.finfo(np.float32).eps * scale + 1e-5
            np.testing.assert_array_less(np.abs(np.asarray(got, np.float64) - formula), slack)


@pytest.mark.gpu
def test_two_layers_share_one_pool_and_differentiate_together(k, rng):
    """torch's pattern: several callables with their backwards, captured into one pool."""
    layer1, layer1_bwd = square_mul_layer(k)

    def layer2(h, v):
        y = jaxgraph.empty(h.shape)
        k.mul[BLOCKS, 256](y, h, v, N)
        return y

    def layer2_bwd(h, v, y, g):
        gh, gv = jaxgraph.empty(h.shape), jaxgraph.empty(h.shape)
        k.mul[BLOCKS, 256](gh, g, v, N)
        k.mul[BLOCKS, 256](gv, g, h, N)
        return gh, gv

    pool = jaxgraph.graph_pool_handle()
    g1, g2 = jaxgraph.make_graphed_callables(
        ((layer1, layer1_bwd), (layer2, layer2_bwd)), ((randn(rng), randn(rng)), (randn(rng), randn(rng))),
        pool=pool)
    assert g1.graph.pool() == g2.graph.pool() == g1.backward_graph.pool() == pool
    x, w, v = randn(rng), randn(rng), randn(rng)
    # In capture order on device arrays:
    out = g2(g1(jaxgraph.asarray(x), jaxgraph.asarray(w)), jaxgraph.asarray(v))
    np.testing.assert_allclose(out.numpy(), x * x * w * v, rtol=1e-5, atol=1e-6)
    loss = lambda x, w, v: jnp.sum(jnp.sin(g2(g1(x, w), v)))
    gx, gw, gv = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, w, v)
    d = np.cos(x * x * w * v)
    np.testing.assert_allclose(np.asarray(gx), d * v * 2 * x * w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gw), d * v * x * x, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gv), d * x * x * w, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_in_place_update_returned_and_a_scan_of_replays(k, rng):
    def accumulate(acc, x):  # acc += x, in place; returns acc
        k.accumulate[BLOCKS, 256](acc, x, N)
        return acc

    graphed = jaxgraph.make_graphed_callables(accumulate, (randn(rng), randn(rng)))
    acc, x = rng.integers(-100, 100, SHAPE).astype(np.float32), rng.integers(-100, 100, SHAPE).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(graphed)(acc, x)), acc + x)
    last, _ = jax.jit(lambda a, x: jax.lax.scan(lambda a, _: (graphed(a, x), None), a, length=25))(acc, x)
    np.testing.assert_array_equal(np.asarray(last), acc + 25 * x)
    # On device arrays: the static input is updated and returned.
    d_acc = jaxgraph.asarray(acc)
    out = graphed(d_acc, jaxgraph.asarray(x))
    assert out is graphed.static_inputs[0]
    np.testing.assert_array_equal(out.numpy(), acc + x)
    np.testing.assert_array_equal(d_acc.numpy(), acc)  # the caller's array is only read


@pytest.mark.gpu
def test_integer_inputs_and_outputs_and_allow_unused_input(k, rng):
    def forward(x, w, n):  # n: an int32 array the kernels do not use
        y = jaxgraph.empty(x.shape)
        k.mul[BLOCKS, 256](y, x, w, N)
        count = jaxgraph.zeros(1, np.int32)
        k.count_positive[BLOCKS, 256](count, y, N)
        return y, count

    def backward_w_unused(x, w, n, outputs, cotangents):
        gx = jaxgraph.empty(x.shape)
        k.mul[BLOCKS, 256](gx, cotangents[0], w, N)
        return gx, None, None

    sample = (randn(rng), randn(rng), np.zeros(3, np.int32))
    with pytest.raises(ValueError, match=r"the cotangent of argument \[1\] is None, so its gradient would "
                                         r"always be zero; .* allow_unused_input=True"):
        jaxgraph.make_graphed_callables(forward, sample, backward=backward_w_unused)
    graphed = jaxgraph.make_graphed_callables(forward, sample, backward=backward_w_unused, allow_unused_input=True)
    x, w = randn(rng), randn(rng)
    y, count = jax.jit(graphed)(x, w, np.arange(3, dtype=np.int32))
    np.testing.assert_allclose(np.asarray(y), x * w, rtol=1e-6)
    assert int(np.asarray(count)[0]) == int((x * w > 0).sum())
    gx, gw = jax.jit(jax.grad(lambda x, w: jnp.sum(graphed(x, w, jnp.zeros(3, jnp.int32))[0] ** 2),
                              argnums=(0, 1)))(x, w)
    np.testing.assert_allclose(np.asarray(gx), 2 * x * w * w, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(gw), 0)  # allowed unused: a zero gradient


@pytest.mark.gpu
def test_warm_up_runs_before_each_capture(k, rng):
    calls = {"forward": 0, "backward": 0}

    def forward(x):
        calls["forward"] += 1
        y = jaxgraph.empty(x.shape)
        k.axpb[BLOCKS, 256](y, x, 3.0, 0.5, N)
        return y

    def backward(x, y, g):
        calls["backward"] += 1
        gx = jaxgraph.empty(x.shape)
        k.axpb[BLOCKS, 256](gx, g, 3.0, 0.0, N)
        return gx

    graphed = jaxgraph.make_graphed_callables(forward, (randn(rng),), num_warmup_iters=5, backward=backward)
    assert calls == {"forward": 6, "backward": 6}  # 5 warm-up runs and the capture
    x = randn(rng)
    np.testing.assert_allclose(np.asarray(graphed(jnp.asarray(x))), 3 * x + 0.5, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.grad(lambda x: graphed(x).sum())(x)), np.full(SHAPE, 3.0))
    assert calls == {"forward": 6, "backward": 6}  # replays never call the Python functions


@pytest.mark.gpu
def test_bad_callables_and_calls_are_clear_errors(k, rng):
    x0 = randn(rng)

    def returns_a_float(x):
        return 1.0

    def returns_nothing(x):
        k.axpb[BLOCKS, 256](x, x, 1.0, 0.0, N)
        return ()

    def in_place(x):
        k.axpb[BLOCKS, 256](x, x, 2.0, 0.0, N)
        return x

    def forward(x):
        y = jaxgraph.empty(x.shape)
        k.axpb[BLOCKS, 256](y, x, 2.0, 0.0, N)
        return y

    def wrong_shape_backward(x, y, g):
        return jaxgraph.empty(7)

    empty = pytest.warns(UserWarning, match="The CUDA Graph is empty")  # as torch says: nothing was captured
    with empty, pytest.raises(TypeError, match=r"output of callables \(returns_a_float\) is a float: graphed "
                                               "callables return device arrays"):
        jaxgraph.make_graphed_callables(returns_a_float, (x0,), num_warmup_iters=0)
    with pytest.raises(ValueError, match=r"callables \(returns_nothing\) returned no arrays"):
        jaxgraph.make_graphed_callables(returns_nothing, (x0,))
    with pytest.raises(ValueError, match=r"returns its argument \[0\], updated in place: with a backward"):
        jaxgraph.make_graphed_callables(in_place, (x0,), backward=lambda x, y, g: g)
    with pytest.warns(UserWarning, match="The CUDA Graph is empty"), \
            pytest.raises(ValueError, match=r"the cotangent of argument \[0\] is float32\[7\]; the argument is "
                                            r"float32\[48, 65\]"):
        jaxgraph.make_graphed_callables(forward, (x0,), backward=wrong_shape_backward)
    graphed = jaxgraph.make_graphed_callables(forward, (x0,))
    with pytest.raises(TypeError, match=r"argument leaf 0 is float32\[3\]; it was captured for float32\[48, 65\]"):
        graphed(jaxgraph.asarray(np.zeros(3, np.float32)))
    with pytest.raises(ValueError, match=r"replayable input 0: expected shape \(48, 65\)"):
        jax.jit(graphed)(np.zeros(3, np.float32))
