"""An inverse problem with jax.grad through a device loop: recover a diffusivity field from a final state.

Run:  python examples/inverse_diffusion.py            # 64 x 64 grid, 400 steps, 40 descent iterations
      python examples/inverse_diffusion.py --quick    # 24 x 24, 60 steps, 8 iterations: seconds

The model: explicit diffusion with a diffusivity that varies in space, on a
periodic grid (5-point Laplacian L, time step 1, stable for kappa <= 0.25):

    u_{t+1} = u_t + kappa * (L u_t)

We observe u_R after R steps from a hidden field kappa*, and recover kappa
by gradient descent on  loss(kappa) = mean((u_R(kappa) - u_obs)^2).

The step is one CUDA kernel (`diffuse`), its adjoint one more (`diffuse_bwd`,
written by hand: for a cotangent c of u_{t+1},
    cotangent of u_t   = c + L(kappa * c)          (L is symmetric)
    cotangent of kappa = c * (L u_t)               (summed over the steps by the loop)).
`make_graphed_callables(step, ..., backward=step_bwd)` captures both;
`graphed_loop(step, R, feed={0: 0})` runs R steps in one CUDA graph, and
`jax.grad` of a loss of it runs the checkpointed forward and the backward
as two device loops (docs/guide/gradients.md).

What it checks: the device gradient against
jax.grad of the same model in jax.numpy (float32), and against central
finite differences of the device loss in float64 on a small grid; then the
descent must lower the loss. Without a GPU the example says so and exits 0.
"""

import argparse
import sys

import numpy as np

import jaxgraph

SOURCE = r"""
#define DIFFUSE(T, SUFFIX)                                                                              \
extern "C" __global__ void diffuse_##SUFFIX(T* out, const T* u, const T* kappa, int n) {               \
  int i = blockIdx.y * blockDim.y + threadIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;            \
  if (i >= n || j >= n) return;                                                                        \
  int up = ((i + n - 1) % n) * n + j, down = ((i + 1) % n) * n + j;                                    \
  int left = i * n + (j + n - 1) % n, right = i * n + (j + 1) % n, c = i * n + j;                      \
  T lap = u[up] + u[down] + u[left] + u[right] - 4 * u[c];                                             \
  out[c] = u[c] + kappa[c] * lap;                                                                      \
}                                                                                                      \
extern "C" __global__ void diffuse_bwd_##SUFFIX(T* gu, T* gk, const T* u, const T* kappa, const T* ct, \
                                                int n) {                                               \
  int i = blockIdx.y * blockDim.y + threadIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;            \
  if (i >= n || j >= n) return;                                                                        \
  int up = ((i + n - 1) % n) * n + j, down = ((i + 1) % n) * n + j;                                    \
  int left = i * n + (j + n - 1) % n, right = i * n + (j + 1) % n, c = i * n + j;                      \
  T lap = u[up] + u[down] + u[left] + u[right] - 4 * u[c];                                             \
  gk[c] = ct[c] * lap;                                                                                 \
  gu[c] = ct[c] + kappa[up] * ct[up] + kappa[down] * ct[down] + kappa[left] * ct[left]                 \
          + kappa[right] * ct[right] - 4 * kappa[c] * ct[c];                                           \
}
DIFFUSE(float, f32)
DIFFUSE(double, f64)
"""

SIGNATURES = {"diffuse": "{T}* out, const {T}* u, const {T}* kappa, int n",
              "diffuse_bwd": "{T}* gu, {T}* gk, const {T}* u, const {T}* kappa, const {T}* ct, int n"}
TILE = 16


# ----------------------------------------------------------------------------
# The model in jax.numpy (the reference) and the finite-difference check
# ----------------------------------------------------------------------------


def laplacian(u):
    import jax.numpy as jnp

    return jnp.roll(u, 1, 0) + jnp.roll(u, -1, 0) + jnp.roll(u, 1, 1) + jnp.roll(u, -1, 1) - 4 * u


def diffuse_reference(u0, kappa, steps):
    """u_R of the model in jax.numpy (lax.scan over the steps)."""
    import jax

    def body(u, _):
        return u + kappa * laplacian(u), None

    u, _ = jax.lax.scan(body, u0, None, length=steps)
    return u


def loss_reference(kappa, u0, u_obs, steps):
    import jax.numpy as jnp

    return jnp.mean((diffuse_reference(u0, kappa, steps) - u_obs) ** 2)


def finite_difference_check(loss, grad, x, rng, eps=1e-6, directions=3):
    """Central differences of ``loss`` along random directions against ``<grad, d>``.

    Returns the worst relative error ``|fd - <g, d>| / max(|fd|, |<g, d>|, tiny)``.
    """
    worst = 0.0
    for _ in range(directions):
        d = rng.standard_normal(x.shape)
        d /= np.linalg.norm(d)
        fd = (float(loss(x + eps * d)) - float(loss(x - eps * d))) / (2 * eps)
        exact = float(np.vdot(np.asarray(grad, np.float64), d))
        worst = max(worst, abs(fd - exact) / max(abs(fd), abs(exact), 1e-30))
    return worst


def problem(n, rng, dtype=np.float32):
    """A hidden diffusivity field (a smooth bump), a random initial state, the start guess."""
    y, x = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    bump = np.exp(-(((x - n / 3) ** 2 + (y - n / 2) ** 2) / (2 * (n / 6) ** 2)))
    kappa_true = (0.05 + 0.15 * bump).astype(dtype)
    u0 = rng.standard_normal((n, n)).astype(dtype)
    kappa0 = np.full((n, n), 0.1, dtype)
    return kappa_true, u0, kappa0


# ----------------------------------------------------------------------------
# The device loop
# ----------------------------------------------------------------------------


def kernels(dtype=np.float32):
    suffix, ctype = ("f32", "float") if np.dtype(dtype) == np.float32 else ("f64", "double")
    return {name: jaxgraph.Kernel(SOURCE, f"{name}_{suffix}", signature=sig.format(T=ctype))
            for name, sig in SIGNATURES.items()}


def make_loop(n, steps, dtype=np.float32, checkpoint_every=None):
    """The graphed step ``u -> u + kappa L u`` with its hand-written backward, as a loop of ``steps`` steps."""
    ks = kernels(dtype)
    grid = ((n + TILE - 1) // TILE, (n + TILE - 1) // TILE)

    def step(u, kappa):
        out = jaxgraph.empty(u.shape, u.dtype)
        ks["diffuse"][grid, (TILE, TILE)](out, u, kappa, n)
        return out

    def step_bwd(u, kappa, out, ct):
        gu, gk = jaxgraph.empty(u.shape, u.dtype), jaxgraph.empty(u.shape, u.dtype)
        ks["diffuse_bwd"][grid, (TILE, TILE)](gu, gk, u, kappa, ct, n)
        return gu, gk

    sample = (np.zeros((n, n), dtype), np.zeros((n, n), dtype))
    graphed = jaxgraph.make_graphed_callables(step, sample, backward=step_bwd)
    return jaxgraph.graphed_loop(graphed, steps, feed={0: 0}, checkpoint_every=checkpoint_every)


def device_loss(loop, u0, u_obs):
    """``loss(kappa)`` through the device loop (jit it, grad it)."""
    import jax.numpy as jnp

    return lambda kappa: jnp.mean((loop(u0, kappa) - u_obs) ** 2)


def check_gradients(rng, n=12, steps=20):
    """The device gradient vs jax.grad of the jnp model (float32) and vs finite differences (float64)."""
    import jax
    import jax.numpy as jnp

    kappa_true, u0, kappa0 = problem(n, rng)
    u_obs = np.asarray(diffuse_reference(jnp.asarray(u0), jnp.asarray(kappa_true), steps))
    kappa = kappa0 + 0.02 * rng.standard_normal((n, n)).astype(np.float32)
    g_dev = jax.jit(jax.grad(device_loss(make_loop(n, steps, checkpoint_every=3), u0, u_obs)))(kappa)
    g_ref = jax.grad(loss_reference)(jnp.asarray(kappa), jnp.asarray(u0), jnp.asarray(u_obs), steps)
    err32 = float(jnp.max(jnp.abs(g_dev - g_ref)) / jnp.max(jnp.abs(g_ref)))
    with jax.enable_x64(True) if hasattr(jax, "enable_x64") else _x64():
        loop64 = make_loop(n, steps, np.float64, checkpoint_every=3)
        u0_64, obs64 = u0.astype(np.float64), u_obs.astype(np.float64)
        loss64 = jax.jit(device_loss(loop64, u0_64, obs64))
        g64 = jax.jit(jax.grad(device_loss(loop64, u0_64, obs64)))(kappa.astype(np.float64))
        err_fd = finite_difference_check(loss64, np.asarray(g64), kappa.astype(np.float64), rng)
    return err32, err_fd


def _x64():
    from jax.experimental import enable_x64

    return enable_x64()


def descend(n, steps, iters, rng, loss_fn=None):
    """Gradient descent on kappa with a backtracking step (a step that raises the loss is halved and
    retried, one that lowers it accepted and grown): returns the accepted losses, the field's error
    relative to the start's, and the loop. ``loss_fn(kappa, u0, u_obs, steps)`` replaces the device
    loop's loss when given (the CPU tests pass ``loss_reference``)."""
    import jax
    import jax.numpy as jnp

    kappa_true, u0, kappa = problem(n, rng)
    u_obs = diffuse_reference(jnp.asarray(u0), jnp.asarray(kappa_true), steps)
    loop = None
    if loss_fn is None:
        loop = make_loop(n, steps)
        value_and_grad = jax.jit(jax.value_and_grad(device_loss(loop, jnp.asarray(u0), u_obs)))
    else:
        value_and_grad = jax.jit(jax.value_and_grad(lambda k: loss_fn(k, jnp.asarray(u0), u_obs, steps)))
    kappa = jnp.asarray(kappa)
    loss, g = value_and_grad(kappa)
    losses = [float(loss)]
    step = 0.01 / float(jnp.max(jnp.abs(g)))   # at most 0.01 on any point at first
    for _ in range(iters):
        candidate = jnp.clip(kappa - step * g, 0.01, 0.24)
        loss_c, g_c = value_and_grad(candidate)
        if float(loss_c) < losses[-1]:
            kappa, g = candidate, g_c
            losses.append(float(loss_c))
            step *= 1.5
        else:
            step *= 0.5
    err = float(jnp.mean(jnp.abs(kappa - kappa_true)) / jnp.mean(jnp.abs(kappa0_of(n) - kappa_true)))
    return losses, err, loop


def kappa0_of(n):
    return np.full((n, n), 0.1, np.float32)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a small problem: seconds")
    args = p.parse_args(argv)
    if jaxgraph.device_count() == 0:
        for dtype in (np.float32, np.float64):
            kernels_for = {name: jaxgraph.Kernel(SOURCE, f"{name}_{'f32' if dtype == np.float32 else 'f64'}",
                                                 signature=sig.format(T="float" if dtype == np.float32 else "double"),
                                                 arch="sm_90") for name, sig in SIGNATURES.items()}
        print(f"compiled {len(kernels_for) * 2} kernels; a CUDA GPU is needed to run the descent: none found, "
              "so this example stops here")
        return 0
    rng = np.random.default_rng()
    n, steps, iters = (24, 60, 8) if args.quick else (64, 400, 40)
    err32, err_fd = check_gradients(rng)
    print(f"device gradient vs jax.grad of the jnp model (float32, 12x12, 20 steps): max error / max |g| = "
          f"{err32:.2e}")
    print(f"device gradient vs central finite differences (float64): worst relative error {err_fd:.2e}")
    if err32 > 1e-4 or err_fd > 1e-5:
        raise SystemExit("the device gradient does not match")
    print("the device gradient matches jax.grad and finite differences")
    losses, err, loop = descend(n, steps, iters, rng)
    print(f"gradient descent, {n}x{n} grid, {steps} steps ({loop.checkpoint_memory()['slots']} checkpoints of "
          f"{loop.checkpoint_memory()['checkpoint_every']} steps): loss {losses[0]:.3e} -> {losses[-1]:.3e} in "
          f"{iters} iterations ({len(losses) - 1} steps accepted); mean |kappa - kappa*| is {err:.2f} of the start's")
    if len(losses) < 2 or not losses[-1] < losses[0]:
        raise SystemExit("the loss did not decrease")
    print(f"{loop!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
