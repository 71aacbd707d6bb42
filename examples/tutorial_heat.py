"""The tutorial's model in one file (docs/tutorial.md): heat on a 2-D grid, from jax.numpy to a device loop and its gradient.

Run:  python examples/tutorial_heat.py            # every stage checked against the jnp loop
      python -m jaxgraph.compare examples/tutorial_heat.py:make_case --arg stage=loop --compare-functions

The model: explicit heat diffusion with a conductivity field kappa that varies
in space, on a periodic n x n grid (5-point Laplacian L, time step 1, stable for
kappa <= 0.25), in float32:

    u_{t+1} = u_t + kappa * (L u_t)

A hot disc sits at the centre; a sensor SENSOR_OFFSET cells to its right reads
the temperature. The stages of the tutorial, each a function here:

  jnp           the step in jax.numpy in a lax.fori_loop (what a researcher has)
  jax_call      the step as one CUDA kernel, through Kernel.jax_call, in that fori_loop
  graphed step  the kernel captured once (make_graphed_callables), replayed in that fori_loop
  device loop   the captured step run R times by one graphed_loop: one launch
  stop          run until the sensor reads LEVEL (graphed_loop(..., until=done))
  grad          jax.grad through the device loop (a hand-written adjoint kernel)

`make_case` is a factory for `python -m jaxgraph.compare` (docs/guide/compare.md):
`--arg stage=jnp|jax_call|graphed|loop|stop|grad` picks what it returns, each
stage with the ones before it to compare against. Without a GPU it returns the
jnp functions alone, and this script checks the jnp model against numpy,
compiles the kernels for sm_90 and says that it stops there.
"""

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxgraph

N = 256               # the grid is N x N
STEPS = 1000          # steps of a fixed-length run, and the most a stopped run takes
SENSOR_OFFSET = 24    # the sensor: this many cells right of the centre
LEVEL = 0.01          # the stopped run ends when the sensor reads this
TILE = 16             # the kernels' thread blocks are TILE x TILE

HEAT = r"""
// One step: out = u + kappa * (L u), L the periodic 5-point Laplacian; a thread per cell.
extern "C" __global__ void heat(float* out, const float* u, const float* kappa, int n) {
  int i = blockIdx.y * blockDim.y + threadIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n || j >= n) return;
  int up = ((i + n - 1) % n) * n + j, down = ((i + 1) % n) * n + j;
  int left = i * n + (j + n - 1) % n, right = i * n + (j + 1) % n, c = i * n + j;
  out[c] = u[c] + kappa[c] * (u[up] + u[down] + u[left] + u[right] - 4.0f * u[c]);
}
"""
REACHED = r"""
// The stop: set done once the sensor (element `at`) reads at least `level`.
extern "C" __global__ void reached(int* done, const float* u, int at, float level) {
  if (u[at] >= level) done[0] = 1;
}
"""
HEAT_BWD = r"""
// The step's adjoint: for a cotangent ct of out, gu = ct + L(kappa ct) (L is symmetric), gk = ct (L u).
extern "C" __global__ void heat_bwd(float* gu, float* gk, const float* u, const float* kappa,
                                    const float* ct, int n) {
  int i = blockIdx.y * blockDim.y + threadIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n || j >= n) return;
  int up = ((i + n - 1) % n) * n + j, down = ((i + 1) % n) * n + j;
  int left = i * n + (j + n - 1) % n, right = i * n + (j + 1) % n, c = i * n + j;
  gk[c] = ct[c] * (u[up] + u[down] + u[left] + u[right] - 4.0f * u[c]);
  gu[c] = ct[c] + kappa[up] * ct[up] + kappa[down] * ct[down] + kappa[left] * ct[left]
          + kappa[right] * ct[right] - 4.0f * kappa[c] * ct[c];
}
"""
SOURCE = HEAT + REACHED + HEAT_BWD


# ----------------------------------------------------------------------------
# Stage 1: the model in jax.numpy
# ----------------------------------------------------------------------------


def laplacian(u):
    return jnp.roll(u, 1, 0) + jnp.roll(u, -1, 0) + jnp.roll(u, 1, 1) + jnp.roll(u, -1, 1) - 4 * u


def heat_step(u, kappa):
    return u + kappa * laplacian(u)


def heat_jnp(u0, kappa, steps=STEPS):
    return jax.lax.fori_loop(0, steps, lambda i, u: heat_step(u, kappa), u0)


def heat_jnp_until(u0, kappa, at, level=LEVEL, max_steps=STEPS):
    """Steps until the sensor (flat index ``at``) reads ``level``: ``(u, steps_run)``, as the device loop returns."""
    def not_yet(carry):
        u, i = carry
        return (i < max_steps) & (u.reshape(-1)[at] < level)

    u, i = jax.lax.while_loop(not_yet, lambda c: (heat_step(c[0], kappa), c[1] + 1), (u0, jnp.int32(0)))
    return u, i.reshape(1)


def problem(n=N):
    """The same inputs in every process: a hot disc at the centre, a smooth conductivity field, the sensor's index."""
    y, x = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    u0 = (((x - n // 2) ** 2 + (y - n // 2) ** 2) < 8 ** 2).astype(np.float32)
    bump = np.exp(-((x - n / 3) ** 2 + (y - n / 2) ** 2) / (2 * (n / 6) ** 2))
    kappa = (0.05 + 0.15 * bump).astype(np.float32)
    at = (n // 2) * n + n // 2 + SENSOR_OFFSET
    return u0, kappa, at


# ----------------------------------------------------------------------------
# Stages 2-5: the kernel, the graphed step, the device loops, the gradient
# ----------------------------------------------------------------------------


def kernels(arch=None):
    """The three kernels, compiled by NVRTC (``arch="sm_90"`` compiles without a GPU)."""
    return {name: jaxgraph.Kernel(SOURCE, name, arch=arch) for name in ("heat", "heat_bwd", "reached")}


class Heat:
    """The model's GPU stages for one grid size (needs a GPU)."""

    def __init__(self, n=N, steps=STEPS):
        self.n, self.steps = n, steps
        self.k = kernels()
        self.grid = ((n + TILE - 1) // TILE, (n + TILE - 1) // TILE)
        u0, kappa, self.at = problem(n)
        self.done = jaxgraph.zeros((1,), np.int32)            # the stop flag the `reached` kernel sets
        # Stage 3 and 5: the step captured once, with its backward.
        self.step = jaxgraph.make_graphed_callables(self.advance, (u0, kappa), backward=self.advance_bwd)
        # Stage 4: R steps in one launch; and until the sensor reads LEVEL (at most R steps).
        self.loop = jaxgraph.graphed_loop(self.step, steps, feed={0: 0})
        stop_step = jaxgraph.make_graphed_callables(self.advance_until, (u0, kappa))
        self.loop_until = jaxgraph.graphed_loop(stop_step, steps, feed={0: 0}, until=self.done)

    def advance(self, u, kappa):
        out = jaxgraph.empty(u.shape)
        self.k["heat"][self.grid, (TILE, TILE)](out, u, kappa, self.n)
        return out

    def advance_bwd(self, u, kappa, out, ct):
        gu, gk = jaxgraph.empty(u.shape), jaxgraph.empty(u.shape)
        self.k["heat_bwd"][self.grid, (TILE, TILE)](gu, gk, u, kappa, ct, self.n)
        return gu, gk

    def advance_until(self, u, kappa):
        out = self.advance(u, kappa)
        self.k["reached"][1, 1](self.done, out, self.at, LEVEL)
        return out

    def step_jax_call(self, u, kappa):
        """Stage 2: one step as one FFI call of the kernel, in order with XLA's work."""
        return self.k["heat"].jax_call(jax.ShapeDtypeStruct(u.shape, u.dtype), u, kappa, self.n,
                                       grid=self.grid, block=(TILE, TILE))

    def jax_call_loop(self, u0, kappa):
        return jax.lax.fori_loop(0, self.steps, lambda i, u: self.step_jax_call(u, kappa), u0)

    def jax_call_until(self, u0, kappa):
        def not_yet(carry):
            u, i = carry
            return (i < self.steps) & (u.reshape(-1)[self.at] < LEVEL)

        u, i = jax.lax.while_loop(not_yet, lambda c: (self.step_jax_call(c[0], kappa), c[1] + 1),
                                  (u0, jnp.int32(0)))
        return u, i.reshape(1)

    def graphed_loop_in_fori(self, u0, kappa):
        return jax.lax.fori_loop(0, self.steps, lambda i, u: self.step(u, kappa), u0)


def loss_jnp(kappa, u0, u_obs, steps=STEPS):
    return jnp.mean((heat_jnp(u0, kappa, steps) - u_obs) ** 2)


def observed(n=N, steps=STEPS):
    """A 'measured' final state: the model run from a uniform conductivity of 0.1 (the inverse problem's data)."""
    u0, _, _ = problem(n)
    return np.asarray(heat_jnp(jnp.asarray(u0), jnp.full((n, n), 0.1, jnp.float32), steps))


# ----------------------------------------------------------------------------
# The factory for python -m jaxgraph.compare
# ----------------------------------------------------------------------------

STAGES = ("jnp", "jax_call", "graphed", "loop", "stop", "grad")


def make_case(stage: str = "loop", n: int = N, steps: int = STEPS) -> dict:
    """``{label: (fn, args)}`` for ``python -m jaxgraph.compare``: the stage's function and the ones before it.

    ``stage`` is one of ``jnp``, ``jax_call``, ``graphed``, ``loop`` (fixed count: the jnp loop,
    then each stage up to it), ``stop`` (until the sensor reads LEVEL: jnp, jax_call, device loop)
    or ``grad`` (the gradient of the loss w.r.t. kappa: jnp, device loop). Without a GPU: the jnp
    functions alone.
    """
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    u0, kappa, at = problem(n)
    u0, kappa = jnp.asarray(u0), jnp.asarray(kappa)
    gpu = jaxgraph.device_count() > 0
    heat = Heat(n, steps) if gpu and stage != "jnp" else None
    if stage == "stop":
        cases = {"jnp": (lambda u, k: heat_jnp_until(u, k, at, LEVEL, steps), (u0, kappa))}
        if heat:
            cases["jax_call"] = (heat.jax_call_until, (u0, kappa))
            cases["device loop"] = (heat.loop_until, (u0, kappa))
        return cases
    if stage == "grad":
        u_obs = jnp.asarray(observed(n, steps))
        cases = {"jnp": (jax.grad(lambda k: loss_jnp(k, u0, u_obs, steps)), (kappa,))}
        if heat:
            cases["device loop"] = (jax.grad(lambda k: jnp.mean((heat.loop(u0, k) - u_obs) ** 2)), (kappa,))
        return cases
    cases = {"jnp": (lambda u, k: heat_jnp(u, k, steps), (u0, kappa))}
    if heat:
        upto = STAGES.index(stage)
        cases["jax_call"] = (heat.jax_call_loop, (u0, kappa))
        if upto >= STAGES.index("graphed"):
            cases["graphed step"] = (heat.graphed_loop_in_fori, (u0, kappa))
        if upto >= STAGES.index("loop"):
            cases["device loop"] = (heat.loop, (u0, kappa))
    return cases


# ----------------------------------------------------------------------------
# Run every stage and check it against the jnp model
# ----------------------------------------------------------------------------


def check_jnp_against_numpy(n=32, steps=50):
    """The jnp loop against the same steps in numpy (float64): the largest difference."""
    u0, kappa, _ = problem(n)
    u = u0.astype(np.float64)
    for _ in range(steps):
        lap = np.roll(u, 1, 0) + np.roll(u, -1, 0) + np.roll(u, 1, 1) + np.roll(u, -1, 1) - 4 * u
        u = u + kappa * lap
    return float(np.max(np.abs(np.asarray(heat_jnp(jnp.asarray(u0), jnp.asarray(kappa), steps)) - u)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=128, help="the grid is n x n (default 128)")
    p.add_argument("--steps", type=int, default=STEPS, help=f"steps (default {STEPS})")
    args = p.parse_args(argv)
    err = check_jnp_against_numpy()
    if err > 1e-5:
        raise SystemExit(f"the jnp model differs from numpy by {err:.2e}")
    print(f"the jnp model matches numpy (largest difference {err:.1e})")
    if jaxgraph.device_count() == 0:
        compiled = kernels(arch="sm_90")
        print(f"compiled {', '.join(compiled)} for sm_90; a CUDA GPU is needed to run them: none found, "
              "so this example stops here")
        return 0
    n, steps = args.n, args.steps
    heat = Heat(n, steps)
    u0, kappa, at = (jnp.asarray(a) if isinstance(a, np.ndarray) else a for a in problem(n))
    want = np.asarray(heat_jnp(u0, kappa, steps))
    for label, fn in (("jax_call", heat.jax_call_loop), ("graphed step", heat.graphed_loop_in_fori),
                      ("device loop", heat.loop)):
        got = np.asarray(jax.jit(fn)(u0, kappa))
        if not np.allclose(got, want, rtol=1e-4, atol=1e-6):
            raise SystemExit(f"{label}: differs from the jnp loop by {np.max(np.abs(got - want)):.2e}")
        print(f"{label}: {steps} steps match the jnp loop")
    (u, ran), (u_ref, ran_ref) = jax.jit(heat.loop_until)(u0, kappa), heat_jnp_until(u0, kappa, at, LEVEL, steps)
    ran, ran_ref = int(np.asarray(ran)[0]), int(np.asarray(ran_ref)[0])
    if abs(ran - ran_ref) > 1 or not np.allclose(u, heat_jnp(u0, kappa, ran), rtol=1e-4, atol=1e-6):
        raise SystemExit(f"the stopped loop ran {ran} steps, the jnp while_loop {ran_ref}")
    print(f"until the sensor reads {LEVEL}: {ran} steps (the jnp while_loop: {ran_ref}); the state matches")
    u_obs = jnp.asarray(observed(n, steps))
    g = jax.jit(jax.grad(lambda k: jnp.mean((heat.loop(u0, k) - u_obs) ** 2)))(kappa)
    g_ref = jax.grad(loss_jnp)(kappa, u0, u_obs, steps)
    rel = float(jnp.max(jnp.abs(g - g_ref)) / jnp.max(jnp.abs(g_ref)))
    if rel > 1e-3:
        raise SystemExit(f"the device gradient differs from jax.grad of the jnp loss: {rel:.2e} of its largest")
    print(f"jax.grad through the device loop matches jax.grad of the jnp loss ({rel:.1e} of its largest); "
          f"checkpoints: {heat.loop.checkpoint_memory()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
