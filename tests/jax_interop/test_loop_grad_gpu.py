"""jax.grad through graphed loops on the device: gradients of a loop of a graphed step with a hand-written
backward against jax.grad of the jnp loop (float64), on fresh random inputs, for R in {0, 1, 7, 100, 1000}
and checkpoint intervals that do not divide R, eagerly and in jit; counts per call and traced; value_and_grad
and vjp; integer inputs; a backward that reads the step's outputs; a count beyond max_steps; until= loops.

Both ways of running the full segments are set with ``jaxgraph.diagnostics.loop_settings`` and which
one ran is read with ``describe_loop``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
from conftest import enable_x64
from jaxgraph import diagnostics

pytestmark = pytest.mark.gpu

N = 1000

SOURCE = r"""
// y = 0.9 x + a tanh(x) m,  z = a x   (x fed, a a parameter, m an integer input)
extern "C" __global__ void lg_step(float* y, float* z, const float* x, const float* a, const int* m, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { float t = tanhf(x[i]); y[i] = 0.9f * x[i] + a[i] * t * (float)m[i]; z[i] = a[i] * x[i]; }
}
extern "C" __global__ void lg_step_bwd(float* gx, float* ga, const float* x, const float* a, const int* m,
                                       const float* cy, const float* cz, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float t = tanhf(x[i]);
    gx[i] = cy[i] * (0.9f + a[i] * (1.0f - t * t) * (float)m[i]) + cz[i] * a[i];
    ga[i] = cy[i] * t * (float)m[i] + cz[i] * x[i];
  }
}
// y = 0.5 x + a exp(-x^2) (bounded); its backward reads y: dy/dx = 0.5 - 2 x (y - 0.5 x)
extern "C" __global__ void lg_decay(float* y, const float* x, const float* a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 0.5f * x[i] + a[i] * expf(-x[i] * x[i]);
}
extern "C" __global__ void lg_decay_bwd(float* gx, float* ga, const float* x, const float* a, const float* y,
                                        const float* cy, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { gx[i] = cy[i] * (0.5f - 2.0f * x[i] * (y[i] - 0.5f * x[i])); ga[i] = cy[i] * expf(-x[i] * x[i]); }
}
// the stop: done[0] = 1 once y[0] passes a threshold
extern "C" __global__ void lg_flag(int* done, const float* y, float threshold) {
  if (blockIdx.x == 0 && threadIdx.x == 0 && y[0] > threshold) done[0] = 1;
}
"""


@pytest.fixture(scope="module")
def kernels():
    return {name: jaxgraph.Kernel(SOURCE, name)
            for name in ("lg_step", "lg_step_bwd", "lg_decay", "lg_decay_bwd", "lg_flag")}


@pytest.fixture(params=[False, True], ids=["copies", "retargeted"])
def retarget(request):
    """Both ways of running the full segments: state copies between steps, or retargeted clones."""
    with diagnostics.loop_settings(retarget_gradients=request.param):
        yield request.param


def check_mode(loop, retarget):
    mode = diagnostics.describe_loop(loop).gradient
    assert mode == ("retargeted" if retarget else "copies"), mode


def _blocks(n):
    return (n + 255) // 256


def make_step(ks, rng):
    x0 = rng.standard_normal(N).astype(np.float32)
    a0 = (0.05 * rng.standard_normal(N)).astype(np.float32)
    m0 = rng.integers(0, 3, N).astype(np.int32)

    def advance(x, a, m):
        y, z = jaxgraph.empty(x.shape), jaxgraph.empty(x.shape)
        ks["lg_step"][_blocks(N), 256](y, z, x, a, m, N)
        return y, z

    def advance_bwd(x, a, m, outputs, cts):
        gx, ga = jaxgraph.empty(x.shape), jaxgraph.empty(x.shape)
        ks["lg_step_bwd"][_blocks(N), 256](gx, ga, x, a, m, cts[0], cts[1], N)
        return gx, ga, None

    return jaxgraph.make_graphed_callables(advance, (x0, a0, m0), backward=advance_bwd)


def ref_loss_and_grads(x, a, m, wy, wz, steps):
    with enable_x64(True):
        x, a, m, wy, wz = (jnp.asarray(np.asarray(v), jnp.float64) for v in (x, a, m, wy, wz))

        def loss(x, a):
            def body(carry, _):
                x, _ = carry
                return (0.9 * x + a * jnp.tanh(x) * m, a * x), None

            (y, z), _ = jax.lax.scan(body, (x, jnp.zeros_like(x)), None, length=steps)
            if steps == 0:
                z = jnp.zeros_like(x)
            return jnp.vdot(y, wy) + jnp.vdot(z, wz)

        value, (gx, ga) = jax.value_and_grad(loss, argnums=(0, 1))(x, a)
        return float(value), np.asarray(gx), np.asarray(ga)


def close(got, want, what):
    scale = max(1.0, float(np.max(np.abs(want))))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-4, atol=2e-4 * scale, err_msg=what)


def inputs(rng):
    x = rng.standard_normal(N).astype(np.float32)
    a = (0.05 * rng.standard_normal(N)).astype(np.float32)
    m = rng.integers(0, 3, N).astype(np.int32)
    wy, wz = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    return x, a, m, wy, wz


@pytest.mark.parametrize("steps,every", [(0, None), (1, None), (1, 3), (7, 3), (100, 7), (1000, 7), (1000, None)])
@pytest.mark.parametrize("jit", [False, True])
def test_grad_fixed_count_matches_jax_grad(kernels, rng, steps, every, jit, retarget):
    step = make_step(kernels, rng)
    loop = jaxgraph.graphed_loop(step, steps, feed={0: 0}, checkpoint_every=every)
    x, a, m, wy, wz = inputs(rng)

    def loss(x, a, m):
        y, z = loop(x, a, m)
        return jnp.vdot(y, wy) + (jnp.vdot(z, wz) if steps else 0.0)

    f = jax.value_and_grad(loss, argnums=(0, 1))
    value, (gx, ga) = (jax.jit(f) if jit else f)(jnp.asarray(x), jnp.asarray(a), jnp.asarray(m))
    want_value, want_gx, want_ga = ref_loss_and_grads(x, a, m, wy, wz, steps)
    close(gx, want_gx, "d loss / d x0")
    close(ga, want_ga, "d loss / d a")
    close(value, want_value, "loss")
    if steps:
        check_mode(loop, retarget)
    # The plain loop (no grad) agrees with the checkpointed forward.
    y, z = loop(jnp.asarray(x), jnp.asarray(a), jnp.asarray(m))
    assert np.isfinite(np.asarray(y)).all()


@pytest.mark.parametrize("jit", [False, True])
def test_grad_count_per_call_and_traced(kernels, rng, jit, retarget):
    step = make_step(kernels, rng)
    loop = jaxgraph.graphed_loop(step, None, feed={0: 0}, checkpoint_every=6, max_steps=200)
    x, a, m, wy, wz = inputs(rng)

    def loss(x, a, n):
        y, z = loop(x, a, jnp.asarray(m), steps=n)
        return jnp.vdot(y, wy) + jnp.vdot(z, wz)

    g = jax.grad(loss, argnums=(0, 1))
    for n in (0, 1, 37, 200):
        if jit:
            gx, ga = jax.jit(g)(jnp.asarray(x), jnp.asarray(a), jnp.int32(n))
        else:
            gx, ga = g(jnp.asarray(x), jnp.asarray(a), n)
        _, want_gx, want_ga = ref_loss_and_grads(x, a, m, wy, wz if n else 0 * wz, n)
        close(gx, want_gx, f"x0, {n} steps")
        if n:
            close(ga, want_ga, f"a, {n} steps")
    check_mode(loop, retarget)
    # Beyond max_steps: NaN, not a silently shortened loop.
    gx, ga = jax.jit(g)(jnp.asarray(x), jnp.asarray(a), jnp.int32(201))
    assert np.isnan(np.asarray(gx)).all() and np.isnan(np.asarray(ga)).all()


def test_vjp_gives_no_cotangent_to_integer_inputs(kernels, rng):
    step = make_step(kernels, rng)
    loop = jaxgraph.graphed_loop(step, 20, feed={0: 0})
    x, a, m, wy, wz = inputs(rng)
    (y, z), vjp = jax.vjp(loop, jnp.asarray(x), jnp.asarray(a), jnp.asarray(m))
    gx, ga, gm = vjp((jnp.asarray(wy), jnp.asarray(wz)))
    assert gm.dtype == jax.dtypes.float0
    _, want_gx, want_ga = ref_loss_and_grads(x, a, m, wy, wz, 20)
    close(gx, want_gx, "x0")
    close(ga, want_ga, "a")


@pytest.mark.parametrize("steps,every", [(50, 8), (9, 4)])
def test_backward_that_reads_the_outputs(kernels, rng, steps, every, retarget):
    x0 = rng.standard_normal(N).astype(np.float32)
    a0 = (0.1 * rng.standard_normal(N)).astype(np.float32)

    def decay(x, a):
        y = jaxgraph.empty(x.shape)
        kernels["lg_decay"][_blocks(N), 256](y, x, a, N)
        return y

    def decay_bwd(x, a, y, cy):
        gx, ga = jaxgraph.empty(x.shape), jaxgraph.empty(x.shape)
        kernels["lg_decay_bwd"][_blocks(N), 256](gx, ga, x, a, y, cy, N)
        return gx, ga

    step = jaxgraph.make_graphed_callables(decay, (x0, a0), backward=decay_bwd)
    loop = jaxgraph.graphed_loop(step, steps, feed={0: 0}, checkpoint_every=every)
    w = rng.standard_normal(N).astype(np.float32)
    gx, ga = jax.jit(jax.grad(lambda x, a: jnp.vdot(loop(x, a), w), argnums=(0, 1)))(x0, a0)
    with enable_x64(True):
        def ref(x, a):
            for _ in range(steps):
                x = 0.5 * x + a * jnp.exp(-x * x)
            return jnp.vdot(x, jnp.asarray(w, jnp.float64))

        want = jax.grad(ref, argnums=(0, 1))(jnp.asarray(x0, jnp.float64), jnp.asarray(a0, jnp.float64))
    close(gx, np.asarray(want[0]), "x0")
    close(ga, np.asarray(want[1]), "a")
    want_mode = "copies: the backward reads the step's outputs" if retarget else "copies"
    mode = diagnostics.describe_loop(loop).gradient
    assert mode == want_mode, mode


def test_composed_with_xla_ops_and_memory_reported(kernels, rng, retarget):
    step = make_step(kernels, rng)
    loop = jaxgraph.graphed_loop(step, 100, feed={0: 0}, checkpoint_every=9)
    x, a, m, wy, wz = inputs(rng)

    def loss(x, a):
        y, z = loop(jnp.sin(x), a * 2.0, jnp.asarray(m))
        return jnp.sum(jnp.cos(y) * wy) + jnp.vdot(z, wz)

    gx, ga = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(x), jnp.asarray(a))
    with enable_x64(True):
        def ref(x, a):
            x, a2 = jnp.sin(x), a * 2.0
            z = jnp.zeros_like(x)
            for _ in range(100):
                x, z = 0.9 * x + a2 * jnp.tanh(x) * m, a2 * x
            return jnp.sum(jnp.cos(x) * wy) + jnp.vdot(z, wz)

        want = jax.grad(ref, argnums=(0, 1))(jnp.asarray(x, jnp.float64), jnp.asarray(a, jnp.float64))
    close(gx, np.asarray(want[0]), "x")
    close(ga, np.asarray(want[1]), "a")
    check_mode(loop, retarget)
    mem = loop.checkpoint_memory()
    assert (mem["checkpoint_every"], mem["slots"], mem["ring"]) == (9, 12, 9)
    assert mem["device_bytes"] == 21 * N * 4


def test_step_without_backward_refused_before_launch(kernels, rng):
    x0 = rng.standard_normal(N).astype(np.float32)

    def half(x):
        y = jaxgraph.empty(x.shape)
        kernels["lg_decay"][_blocks(N), 256](y, x, x, N)
        return y

    loop = jaxgraph.graphed_loop(jaxgraph.make_graphed_callables(half, (x0,)), 10, feed={0: 0})
    with pytest.raises(TypeError, match="needs its step to have a backward"):
        jax.jit(jax.grad(lambda x: loop(x).sum())).trace(x0)


@pytest.mark.parametrize("check_every", [None, 1, 4])   # None: the speculative exact stop
@pytest.mark.parametrize("jit", [False, True])
def test_grad_of_an_until_loop_is_that_of_the_steps_it_ran(kernels, rng, check_every, jit, retarget):
    # x[0] grows (a[0] = 0.2, m[0] = 2: 0.9 x + 0.4 tanh(x)) until it passes 3.0 (22 steps); the rest is random.
    x0, a0 = np.zeros(N, np.float32), np.zeros(N, np.float32)
    m0 = np.zeros(N, np.int32)
    done = jaxgraph.zeros((1,), np.int32)

    def advance(x, a, m):
        y, z = jaxgraph.empty(x.shape), jaxgraph.empty(x.shape)
        kernels["lg_step"][_blocks(N), 256](y, z, x, a, m, N)
        kernels["lg_flag"][1, 1](done, y, 3.0)
        return y, z

    def advance_bwd(x, a, m, outputs, cts):
        gx, ga = jaxgraph.empty(x.shape), jaxgraph.empty(x.shape)
        kernels["lg_step_bwd"][_blocks(N), 256](gx, ga, x, a, m, cts[0], cts[1], N)
        return gx, ga, None

    step = jaxgraph.make_graphed_callables(advance, (x0, a0, m0), backward=advance_bwd)
    loop = jaxgraph.graphed_loop(step, 300, feed={0: 0}, until=done, check_every=check_every, checkpoint_every=5)
    x, a, m, wy, wz = inputs(rng)
    x[0], a[0], m[0] = 0.1, 0.2, 2

    def loss(x, a):
        (y, z), steps_run = loop(x, a, jnp.asarray(m))
        return jnp.vdot(y, wy) + jnp.vdot(z, wz), steps_run

    f = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    (value, steps_run), (gx, ga) = (jax.jit(f) if jit else f)(jnp.asarray(x), jnp.asarray(a))
    ran = int(np.asarray(steps_run)[0])
    assert 15 < ran < 40 and (check_every in (None, 1) or ran % check_every == 0), ran
    if check_every in (None, 1):
        assert ran == 22, ran   # exact: x[0] passes 3.0 at step 22
    want_value, want_gx, want_ga = ref_loss_and_grads(x, a, m, wy, wz, ran)
    close(gx, want_gx, f"x0 after {ran} steps")
    close(ga, want_ga, f"a after {ran} steps")
    close(value, want_value, "loss")
    check_mode(loop, retarget)
