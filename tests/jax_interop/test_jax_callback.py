"""The host path of graph replay (``via="callback"``): argument handling, errors, transformations.

The CPU tests drive a replayable whose host function is a numpy stand-in for
the graph (``internals.spec_replayable``): everything JAX
sees (``pure_callback`` plumbing, checks, vmap, grad, destroy callbacks) is
the real code. The GPU tests replay a real captured graph.

Tests internals (listed in tests/README.md): ``internals.spec_replayable(via="callback")``,
``ReplaySource``; the host-callback path on a CPU, with numpy stand-ins for graphs.
"""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
from jaxgraph._graphs.replay_source import ReplaySource
from support.internals import spec_replayable
from support.kernel_sources import AXPB


def sds(shape, dtype=np.float32):
    return jax.ShapeDtypeStruct(shape, np.dtype(dtype))


def host_step(inputs, outputs, host, **kwargs):
    return spec_replayable(inputs, outputs, via="callback", host=host, **kwargs)


class FakeGraph:
    """Just enough of CUDAGraph for the destroy-callback wiring."""

    device = 0

    def __init__(self):
        self.callbacks = []

    def register_destroy_callback(self, cb):
        self.callbacks.append(cb)
        return len(self.callbacks)

    def source(self):
        return ReplaySource(template=0, device=0, owners=(), kernels=(),
                            on_destroy=self.register_destroy_callback)

    def reset(self):
        callbacks, self.callbacks = self.callbacks, []
        for cb in callbacks:
            cb()


# ---------------------------------------------------------------------------
# CPU (JAX on its CPU backend, also where a GPU exists)
# ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def jax_on_cpu(request):
    """Run the stand-in tests on JAX's CPU backend: with JAX on a GPU, an exception
    raised by a host callback leaves XLA's stream in an error state for the process."""
    if "gpu" in request.keywords:
        yield
        return
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def test_callback_replay_in_jit_composes_with_xla_ops(rng):
    calls = []

    def host(x):
        calls.append(x.copy())
        return (x * 3 + 1,)

    step = host_step([sds((5, 7))], [sds((5, 7))], host)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    f = jax.jit(lambda x: step(x * 2) - 1)
    np.testing.assert_allclose(f(x), (x * 2) * 3 + 1 - 1, rtol=1e-6)
    np.testing.assert_array_equal(calls[0], x * 2)  # the host saw the XLA op's result
    x2 = rng.standard_normal((5, 7)).astype(np.float32)
    np.testing.assert_allclose(jax.block_until_ready(f(x2)), (x2 * 2) * 3, rtol=1e-6, atol=1e-6)
    assert len(calls) == 2


def test_callback_several_inputs_and_outputs_keep_their_order_and_dtypes(rng):
    def host(a, b):
        assert a.dtype == np.float32 and b.dtype == np.int32
        return a.sum(axis=1), (b * 2).astype(np.int32), np.float16(a.size)

    step = host_step([sds((3, 4)), sds((6,), np.int32)],
                     [sds((3,)), sds((6,), np.int32), sds((), np.float16)], host)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.integers(-100, 100, 6).astype(np.int32)
    s, d, n = jax.jit(step)(a, b)
    np.testing.assert_allclose(s, a.sum(axis=1), rtol=1e-5)
    np.testing.assert_array_equal(d, b * 2)
    assert n.dtype == jnp.float16 and float(n) == 12


def test_callback_replays_once_per_batch_element_under_vmap(rng):
    seen = []
    step = host_step([sds((4,))], [sds((4,))], lambda x: (seen.append(x.shape) or (x + 1,)))
    xs = rng.standard_normal((6, 4)).astype(np.float32)
    np.testing.assert_allclose(jax.jit(jax.vmap(step))(xs), xs + 1, rtol=1e-6)
    assert seen == [(4,)] * 6


def test_callback_in_fori_loop(rng):
    step = host_step([sds((8,))], [sds((8,))], lambda x: (x + 1,))
    x = rng.integers(0, 100, 8).astype(np.float32)
    out = jax.jit(lambda x: jax.lax.fori_loop(0, 50, lambda i, v: step(v), x))(x)
    np.testing.assert_array_equal(out, x + 50)


def test_callback_grad_through_a_backward_replayable(rng):
    # forward y = x**2 (elementwise); backward(x, y, g) = 2 x g
    bwd = host_step([sds((16,))] * 3, [sds((16,))], lambda x, y, g: (2 * x * g,))
    fwd = host_step([sds((16,))], [sds((16,))], lambda x: (x * x,), backward=bwd)
    x = rng.standard_normal(16).astype(np.float32)
    w = rng.standard_normal(16).astype(np.float32)
    loss = lambda x: jnp.sum(fwd(x) * w)
    np.testing.assert_allclose(jax.jit(jax.grad(loss))(x), 2 * x * w, rtol=1e-5)
    value, grad = jax.value_and_grad(loss)(x)
    np.testing.assert_allclose(value, np.sum(x * x * w), rtol=1e-5)
    np.testing.assert_allclose(grad, 2 * x * w, rtol=1e-5)


def test_backward_with_several_inputs_may_return_none(rng):
    bwd = host_step([sds((4,))] * 4, [sds((4,))], lambda a, b, y, g: (g * b,))
    fwd = host_step([sds((4,)), sds((4,))], [sds((4,))], lambda a, b: (a * b,),
                    backward=lambda a, b, y, g: (bwd(a, b, y, g), None))
    a, b = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    ga, gb = jax.grad(lambda a, b: fwd(a, b).sum(), argnums=(0, 1))(a, b)
    np.testing.assert_allclose(ga, b, rtol=1e-6)
    np.testing.assert_array_equal(gb, np.zeros(4, np.float32))


def test_backward_returning_the_wrong_number_of_cotangents_is_a_clear_error():
    fwd = host_step([sds((4,)), sds((4,))], [sds((4,))], lambda a, b: (a * b,),
                    backward=lambda a, b, y, g: g)
    with pytest.raises(ValueError, match=r"backward returned 1 cotangent\(s\); the replayable has 2"):
        jax.grad(lambda a, b: fwd(a, b).sum())(np.ones(4, np.float32), np.ones(4, np.float32))


def test_callback_shape_and_dtype_errors_at_trace_time():
    step = host_step([sds((4, 4))], [sds((4,))], lambda x: (x[0],))
    with pytest.raises(ValueError, match=r"replayable input 0: expected shape \(4, 4\).*got shape \(16,\)"):
        jax.jit(step).trace(sds((16,)))
    with pytest.raises(TypeError, match="replayable input 0: expected dtype float32.*got int32"):
        jax.jit(step).trace(sds((4, 4), np.int32))
    with pytest.raises(TypeError, match=r"takes 1 array\(s\)"):
        step()
    with pytest.raises(TypeError, match="expected an array float32\\[4, 4\\], got str"):
        step("not an array")


def test_numpy_and_python_inputs_are_accepted_outside_jit():
    step = host_step([sds((2,))], [sds((2,))], lambda x: (x * 2,))
    np.testing.assert_array_equal(step([1.0, 2.0]), [2.0, 4.0])
    np.testing.assert_array_equal(step(np.array([1.0, 2.0], np.float32)), [2.0, 4.0])


def test_graph_reset_retires_the_replayable_at_trace_and_run_time():
    graph = FakeGraph()
    step = host_step([sds((3,))], [sds((3,))], lambda x: (x + 1,))
    step._attach(graph.source(), (), ())
    f = jax.jit(lambda x: step(x))
    np.testing.assert_array_equal(f(np.zeros(3, np.float32)), np.ones(3))
    graph.reset()
    assert not step.alive
    # A compiled function reaches the host function, which refuses; JAX re-raises
    # the host's RuntimeError as its own error type (which varies by path).
    with pytest.raises(Exception, match="RuntimeError: the graph of this replayable was reset"):
        jax.block_until_ready(f(np.zeros(3, np.float32)))
    # A new trace refuses at once.
    with pytest.raises(RuntimeError, match="was reset or destroyed"):
        jax.jit(lambda x: step(x) + 1)(np.zeros(3, np.float32))


def test_destroy_callback_does_not_keep_the_replayable_alive():
    import gc
    import weakref

    graph = FakeGraph()
    step = host_step([sds((3,))], [sds((3,))], lambda x: (x,))
    step._attach(graph.source(), (), ())
    ref = weakref.ref(step)
    del step
    gc.collect()
    assert ref() is None
    graph.reset()  # the callback still runs without error


def test_callback_replays_are_serialized_across_threads(rng):
    # The host path shares static buffers; concurrent jitted calls must all be right.
    step = host_step([sds((32,))], [sds((32,))], lambda x: (x * 2,))
    f = jax.jit(step)
    xs = [rng.standard_normal(32).astype(np.float32) for _ in range(8)]
    results = [None] * len(xs)

    def run(i):
        results[i] = np.asarray(f(xs[i]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, r in zip(xs, results):
        np.testing.assert_array_equal(r, x * 2)


def test_add_device_needs_the_ffi_path():
    step = host_step([sds((3,))], [sds((3,))], lambda x: (x,))
    with pytest.raises(ValueError, match="add_device needs via='ffi'"):
        step.add_device(FakeGraph(), [], [])


def test_repr_names_shapes_and_path():
    step = host_step([sds((3,)), sds((2, 2), np.int32)], [sds((3,))], lambda a, b: (a,))
    assert repr(step) == "<jaxgraph.Replayable (float32[3], int32[2, 2]) -> (float32[3]) via=callback graph=0 alive paths=host_callback>"


# ---------------------------------------------------------------------------
# GPU: a real graph through the host
# ---------------------------------------------------------------------------


@pytest.fixture
def affine_graph():
    """A graph of 10 launches: y = 2 x + 1, then y = 2 y + 1 nine times (exact for small ints)."""
    n = 1000
    k = jaxgraph.Kernel(AXPB, "axpb")
    x_s, y_s = jaxgraph.zeros(n, np.float32), jaxgraph.zeros(n, np.float32)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        k[(n + 127) // 128, 128](y_s, x_s, 2.0, 1.0, n)
        for _ in range(9):
            k[(n + 127) // 128, 128](y_s, y_s, 2.0, 1.0, n)
    jaxgraph.synchronize()
    return g, x_s, y_s


def affine_ref(x):
    y = x.astype(np.float32)
    for _ in range(10):
        y = np.float32(2) * y + np.float32(1)
    return y


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["gpu", "cpu"])
def test_callback_replays_a_real_graph_with_jax_on_gpu_or_cpu(affine_graph, rng, backend):
    g, x_s, y_s = affine_graph
    step = jaxgraph.replayable(g, [x_s], [y_s], via="callback")
    device = jax.devices(backend)[0]
    f = jax.jit(lambda x: step(x - 1.0) * 2.0)
    for _ in range(3):  # fresh inputs each call
        x = rng.integers(-50, 50, 1000).astype(np.float32)
        y_s.fill_(np.nan)  # poison: the graph must overwrite it
        out = f(jax.device_put(x, device))
        assert out.devices() == {device}
        np.testing.assert_array_equal(np.asarray(out), affine_ref(x - 1) * 2)


@pytest.mark.gpu
def test_callback_after_graph_reset_is_a_clear_error(affine_graph):
    g, x_s, y_s = affine_graph
    step = jaxgraph.replayable(g, [x_s], [y_s], via="callback")
    cpu = jax.devices("cpu")[0]
    f = jax.jit(step)
    x = jax.device_put(np.zeros(1000, np.float32), cpu)
    jax.block_until_ready(f(x))
    g.reset()
    assert not step.alive
    # New traces refuse at once, whatever device JAX runs on.
    with pytest.raises(RuntimeError, match="was reset or destroyed"):
        step(np.ones(1000, np.float32))
    # A compiled function reaches the host function, which refuses. (Checked with
    # JAX on the CPU: on a GPU, a raising host callback poisons XLA's stream.)
    with pytest.raises(Exception, match="RuntimeError: the graph of this replayable was reset"):
        jax.block_until_ready(f(x + 1))
