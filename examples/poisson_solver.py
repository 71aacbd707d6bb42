"""An iterative solver run to a tolerance on the device: Jacobi on a 2-D Poisson problem.

Run:  python examples/poisson_solver.py                  # 64 x 64 grid, relative tolerance 1e-4
      python examples/poisson_solver.py --grid 16        # seconds
      python examples/poisson_solver.py --command-buffers off   # XLA's command buffers off (or: on)

It solves -laplace(u) = f on the unit square (zero on the boundary), f fresh
random, with the 5-point stencil on a grid x grid interior, by Jacobi
sweeps until the update of a sweep is small: ||u_new - u|| <= rtol * ||first
update||. A sweep is two custom kernels: `jacobi` (the new iterate, and per
block the sum of squared updates, in a fixed order) and `converged` (one
thread: adds the blocks' sums in order and sets a flag). Nothing is random
in the arithmetic, so every way below stops after the same sweep:

  1. host loop: the graphed sweep replayed from Python, the flag read back
     after every sweep (one host round trip per sweep);
  2. XLA: jax.lax.while_loop over the same kernels as Kernel.jax_call
     custom calls (XLA brings the predicate to the host every iteration);
  3. jaxgraph.graphed_loop(..., until=flag): one CUDA graph runs the sweeps
     and stops on the device after the sweep that set the flag;
  4. that device loop inside jax.jit, as one FFI call.

The solution is checked against the exact solution of the discrete problem
(scipy's sparse solver, or numpy's sine-transform solve without scipy) and
against numpy running the same number of Jacobi sweeps.
"""

import argparse
import os
import sys
import time

import numpy as np

import jaxgraph

SOURCE = r"""
// One Jacobi sweep for (4 u - neighbours) / h^2 = f, zero outside the n x n grid.
// partial[b] = sum over block b of (u_new - u)^2, reduced in a fixed order (deterministic).
extern "C" __global__ void jacobi(float* u_new, float* partial, const float* u, const float* f, float h2, int n) {
  __shared__ float part[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float d = 0.0f;
  if (i < n * n) {
    int x = i % n, y = i / n;
    float s = (x > 0 ? u[i - 1] : 0.0f) + (x < n - 1 ? u[i + 1] : 0.0f)
            + (y > 0 ? u[i - n] : 0.0f) + (y < n - 1 ? u[i + n] : 0.0f);
    float v = 0.25f * (s + h2 * f[i]);
    d = v - u[i];
    u_new[i] = v;
  }
  part[threadIdx.x] = d * d;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = part[0];
}

// One thread: the squared norm of the sweep's update, and whether it is within tolerance.
extern "C" __global__ void converged(int* flag, float* update2, const float* partial, int blocks, float tol2) {
  float s = 0.0f;
  for (int b = 0; b < blocks; ++b) s += partial[b];
  *update2 = s;
  *flag = s <= tol2;
}
"""

COMMAND_BUFFERS = {"on": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1",
                   "off": "--xla_gpu_enable_command_buffer="}


def exact_solution(f, h):
    """The discrete problem's exact solution: scipy's sparse LU, or numpy's sine-transform solve."""
    n = f.shape[0]
    try:
        import scipy.sparse as sp
        import scipy.sparse.linalg as spla

        t = sp.diags([-np.ones(n - 1), 2 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1])
        a = (sp.kron(sp.identity(n), t) + sp.kron(t, sp.identity(n))) / h**2
        return spla.spsolve(a.tocsc(), f.astype(np.float64).ravel()).reshape(n, n), "scipy.sparse.linalg.spsolve"
    except ImportError:
        k = np.arange(1, n + 1)
        s = np.sqrt(2 / (n + 1)) * np.sin(np.pi * np.outer(k, k) / (n + 1))  # orthogonal, symmetric
        lam = (2 - 2 * np.cos(np.pi * k / (n + 1))) / h**2
        return s @ ((s @ f.astype(np.float64) @ s) / (lam[:, None] + lam[None, :])) @ s, "numpy sine transform"


def numpy_jacobi(f, h2, sweeps):
    """``sweeps`` Jacobi sweeps from zero in float32, as the kernel computes them."""
    u = np.zeros_like(f)
    p = np.zeros((f.shape[0] + 2, f.shape[1] + 2), np.float32)
    for _ in range(sweeps):
        p[1:-1, 1:-1] = u
        u = np.float32(0.25) * ((p[1:-1, :-2] + p[1:-1, 2:]) + (p[:-2, 1:-1] + p[2:, 1:-1]) + np.float32(h2) * f)
    return u


def timed(run):
    """Run once (compiles, warms up), then time a second run; returns (its result, seconds)."""
    run()
    jaxgraph.synchronize()
    start = time.perf_counter()
    result = run()
    jaxgraph.synchronize()
    return result, time.perf_counter() - start


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", type=int, default=64, help="interior points per side (default 64)")
    p.add_argument("--rtol", type=float, default=1e-4, help="stop when the update shrank by this (default 1e-4)")
    p.add_argument("--max-sweeps", type=int, default=200_000, help="give up after this many sweeps")
    p.add_argument("--command-buffers", choices=("default", "on", "off"), default="default",
                   help="XLA's command buffers: JAX's defaults, or forced on or off (sets XLA_FLAGS)")
    args = p.parse_args(argv)
    if jaxgraph.device_count() == 0:
        print("a CUDA GPU is needed to run the solver: none found, so this example stops here")
        return 0
    if args.command_buffers != "default":
        os.environ["XLA_FLAGS"] = COMMAND_BUFFERS[args.command_buffers]
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp

    n, max_sweeps = args.grid, args.max_sweeps
    h = 1.0 / (n + 1)
    h2 = np.float32(h * h)
    blocks = (n * n + 255) // 256
    f = np.random.default_rng().standard_normal((n, n)).astype(np.float32)
    # From u = 0 the first update is h^2 f / 4: the tolerance is relative to it.
    tol2 = np.float32((args.rtol * np.linalg.norm(h2 * f / 4)) ** 2)
    jacobi, converged = (jaxgraph.Kernel(SOURCE, k) for k in ("jacobi", "converged"))

    def sweep(u, f):
        """One sweep on device arrays: (u_new, flag, squared update)."""
        u_new, partial = jaxgraph.empty(u.shape), jaxgraph.empty(blocks)
        flag, update2 = jaxgraph.empty(1, np.int32), jaxgraph.empty(1)
        jacobi[blocks, 256](u_new, partial, u, f, h2, n)
        converged[1, 1](flag, update2, partial, blocks, tol2)
        return u_new, flag, update2

    print(f"[1/5] {n} x {n} Poisson problem; graphing a Jacobi sweep (2 kernels)", flush=True)
    graphed = jaxgraph.make_graphed_callables(sweep, (np.zeros((n, n), np.float32), f))
    u_s, _ = graphed.static_inputs
    u_out, flag, update2 = graphed.static_outputs
    zero = jaxgraph.zeros((n, n))
    runs = {}

    print("[2/5] host loop: replay, read the flag, repeat", flush=True)

    def host_loop():
        u_s.copy_(zero)
        for sweeps in range(1, max_sweeps + 1):
            graphed.graph.replay()
            if flag.numpy()[0]:
                break
            u_s.copy_(u_out)
        return u_out.numpy(), sweeps

    runs["host loop: graph replay + flag read per sweep"] = timed(host_loop)

    flags = os.environ.get("XLA_FLAGS") or "unset: JAX's default command buffers"
    print(f"[3/5] jax.lax.while_loop over the same kernels as jax_calls (XLA_FLAGS {flags})", flush=True)
    f32 = jax.ShapeDtypeStruct((n, n), jnp.float32)

    def body(state):
        sweeps, u, _ = state
        u, partial = jacobi.jax_call(f32, jax.ShapeDtypeStruct((blocks,), jnp.float32), u, fj, h2, n, grid=blocks)
        done, _ = converged.jax_call(jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((1,), jnp.float32),
                                     partial, blocks, tol2, grid=1, block=1)
        return sweeps + 1, u, done

    fj = jnp.asarray(f)
    solve_xla = jax.jit(lambda u: jax.lax.while_loop(lambda s: (s[2][0] == 0) & (s[0] < max_sweeps), body,
                                                      (jnp.int32(0), u, jnp.zeros(1, jnp.int32))))
    u0 = jnp.zeros((n, n), jnp.float32)

    def xla():
        sweeps, u, _ = jax.block_until_ready(solve_xla(u0))
        return np.asarray(u), int(sweeps)

    runs["XLA: jax.lax.while_loop of jax_calls"] = timed(xla)

    loop = jaxgraph.graphed_loop(graphed, max_sweeps, feed={0: 0}, until=flag)
    print(f"[4/5] device loop: graphed_loop(..., until=flag), exact stop: the flag checked after every sweep "
          f"({loop.ping_pong})", flush=True)

    def device_loop():
        u_s.copy_(zero)
        loop.replay()
        return u_out.numpy(), int(loop.steps_run.numpy()[0])

    runs["jaxgraph: device loop, until= flag"] = timed(device_loop)
    print("[5/5] the device loop inside jax.jit (one FFI call)", flush=True)
    solve_jit = jax.jit(loop)

    def device_loop_jit():
        (u, _, _), sweeps = jax.block_until_ready(solve_jit(u0, fj))
        return np.asarray(u), int(np.asarray(sweeps)[0])

    runs["jaxgraph: device loop inside jax.jit"] = timed(device_loop_jit)

    # Same kernels, same order of additions: every way stops after the same sweep.
    counts = {name: sweeps for name, ((_, sweeps), _) in runs.items()}
    if len(set(counts.values())) != 1:
        raise AssertionError(f"the ways stopped after different sweeps: {counts}")
    sweeps = next(iter(counts.values()))
    if sweeps >= max_sweeps:
        raise AssertionError(f"not converged after {max_sweeps} sweeps; raise --max-sweeps")
    exact, how = exact_solution(f, h)
    ref = numpy_jacobi(f, h2, sweeps)
    scale = float(np.abs(exact).max())
    for name, ((u, _), _) in runs.items():
        np.testing.assert_allclose(u, ref, rtol=0, atol=5e-4 * scale, err_msg=name)  # float32 rounding
        np.testing.assert_allclose(u, exact, rtol=0, atol=0.05 * scale, err_msg=name)
    error = max(float(np.abs(r[0][0] - exact).max()) for r in runs.values()) / scale
    print(f"\nconverged after {sweeps} sweeps in every way; each matches numpy's {sweeps} sweeps and the exact "
          f"solution ({how}) to {error:.1e} of its largest value\n")

    xla_s = runs["XLA: jax.lax.while_loop of jax_calls"][1]
    width = max(map(len, runs))
    print(f"{'way of running ' + str(sweeps) + ' sweeps':<{width}}  {'ms':>8}  {'us/sweep':>8}  vs lax.while_loop")
    for name, (_, seconds) in runs.items():
        print(f"{name:<{width}}  {seconds * 1e3:8.2f}  {seconds / sweeps * 1e6:8.2f}  {xla_s / seconds:6.2f}x")
    print(f"\n{loop!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
