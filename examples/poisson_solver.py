"""A 2-D Poisson problem solved to a tolerance on the device: Jacobi and conjugate gradients, against JAX.

Run:  python examples/poisson_solver.py                  # 64 x 64 grid, relative tolerance 1e-4
      python examples/poisson_solver.py --quick          # 16 x 16: seconds
      python examples/poisson_solver.py --grid 256 --no-jacobi       # Jacobi needs ~10^5 sweeps there
      python examples/poisson_solver.py --command-buffers on   # XLA's command buffers (off, on, while)

It solves -laplace(u) = f on the unit square (zero on the boundary), f fresh
random, with the 5-point stencil on a grid x grid interior: A u = h^2 f with
(A u)[i] = 4 u[i] - (its four neighbours, zero outside), matrix-free.

Jacobi sweeps until the update of a sweep is small: ||u_new - u|| <= rtol *
||first update||. Conjugate gradients iterate until ||r|| <= rtol * ||b||
(what jax.scipy.sparse.linalg.cg's `tol` means). Each way, idiomatic first:

  Jacobi
  1. idiomatic JAX: the sweep in jax.numpy in a jitted lax.while_loop;
  2. XLA launching this file's `jacobi` kernel (Kernel.jax_call) in the
     same while_loop;
  3. jaxgraph.graphed_loop(..., until=flag): one CUDA graph runs the sweeps
     and stops on the device, eagerly and inside jax.jit (one FFI call);
     exact stop, and `check_every=K` (the flag read once per K steps).
  Conjugate gradients
  4. idiomatic JAX: jax.scipy.sparse.linalg.cg on the same matrix-free
     operator in jax.numpy, same tolerance, in jax.jit;
  5. jaxgraph: CG as two kernels an iteration (the new direction p and
     A p with p.Ap; then the updates of x and r, r.r and the residual test
     that sets the flag), in the same device loop, exact and every-K stop.

The kernels are written as a CUDA programmer would: `jacobi` is one kernel a
sweep (each block sums its squared updates; the last block to finish adds
the blocks' sums in a fixed order, counts the sweep and sets the flag). CG's
first kernel computes the new direction of each point's neighbours itself
(p = r + beta p is elementwise), so it needs no kernel of its own; the dot
products are per-block sums that the next kernel's blocks (or its last
block) add up in a fixed order (no atomics on floats: every run takes the
same path).
A step of the loop is `--sweeps-per-step` sweeps (iterations); each kernel
first reads the flag and does nothing once it is set (a Jacobi sweep then
carries u over), so the result and the sweep count on the device are those
of the exact stop, whichever stop the loop uses: the every-K stop only
runs up to K-1 steps of such no-ops past convergence.

Every solution is checked against scipy (`scipy.sparse.linalg.spsolve` of
the same matrix, or numpy's sine-transform solve without scipy), Jacobi's
also against numpy running the same number of sweeps, CG's residual in
float64. `benchmarks/vs_idiomatic.py` times these properly (interleaved
rounds, each XLA setting in its own process). Without a GPU the example
says so and exits 0.
"""

import argparse
import os
import sys
import time

import numpy as np

import jaxgraph

THREADS = 256
COMMAND_BUFFERS = {"on": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1",
                   "off": "--xla_gpu_enable_command_buffer=",
                   "while": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE,CONDITIONAL "
                            "--xla_gpu_graph_min_graph_size=1"}

SOURCE = r"""
// The sum of x over a block of 256 threads in a fixed order, returned to every thread.
__device__ float block_total(float x) {
  __shared__ float warp_sums[8];
  __shared__ float result;
  int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  for (int o = 16; o > 0; o /= 2) x += __shfl_down_sync(0xffffffffu, x, o);  // lane 0: its warp's sum
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    x = lane < 8 ? warp_sums[lane] : 0.0f;
    for (int o = 4; o > 0; o /= 2) x += __shfl_down_sync(0xffffffffu, x, o);
    if (lane == 0) result = x;
  }
  __syncthreads();
  return result;  // the next call writes `result` only after a barrier every thread passes after reading it
}

// The sum of the blocks' partial sums, in a fixed order (every block that calls it gets the same).
__device__ float sum_parts(const float* part, int blocks) {
  float s = 0.0f;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) s += __ldcg(part + b);
  return block_total(s);
}

// (A u)[i] without the diagonal: the four neighbours of i on the n x n grid, zero outside.
__device__ float neighbours(const float* u, int i, int n) {
  int x = i % n, y = i / n;
  return ((x > 0 ? u[i - 1] : 0.0f) + (x < n - 1 ? u[i + 1] : 0.0f))
       + ((y > 0 ? u[i - n] : 0.0f) + (y < n - 1 ? u[i + n] : 0.0f));
}

// One Jacobi sweep for 4 u - neighbours = h2 f. Once *flag is set (an earlier sweep converged) it
// only carries u over. Each block stores its sum of squared updates; the last block to finish adds
// them in order, stores the total in *update2, counts the sweep and sets *flag within tolerance.
extern "C" __global__ void jacobi(float* u_new, float* partial, unsigned int* arrived, int* flag, int* count,
                                  float* update2, const float* u, const float* f, float h2, int n, float tol2) {
  __shared__ bool last;
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (*flag) {
    if (i < n * n) u_new[i] = u[i];
    return;
  }
  float d = 0.0f;
  if (i < n * n) {
    float v = 0.25f * (neighbours(u, i, n) + h2 * f[i]);
    d = v - u[i];
    u_new[i] = v;
  }
  float mine = block_total(d * d);
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = mine;
    __threadfence();
    last = atomicAdd(arrived, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  float s = sum_parts(partial, gridDim.x);
  if (threadIdx.x == 0) {
    *update2 = s;
    *count += 1;
    if (s <= tol2) *flag = 1;
    *arrived = 0;
  }
}

// Conjugate gradients, two kernels an iteration. rr = {r.r of the last iteration, r.r now};
// beta = rr[1] / rr[0] (0 at the start: p_in = 0 there). Kernel 1: p = r + beta p_in into p_out
// and ap = A p, computing the neighbours' new p on the fly (it is elementwise), so no kernel
// has to finish p first; partial[block] = its share of p.Ap.
extern "C" __global__ void cg_direction(float* p_out, float* ap, float* partial, const float* r, const float* p_in,
                                        const float* rr, const int* flag, int n) {
  if (*flag) return;
  float beta = rr[1] / rr[0];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float d = 0.0f;
  if (i < n * n) {
    int x = i % n, y = i / n;
    float pi = r[i] + beta * p_in[i];
    float nb = ((x > 0 ? r[i - 1] + beta * p_in[i - 1] : 0.0f) + (x < n - 1 ? r[i + 1] + beta * p_in[i + 1] : 0.0f))
             + ((y > 0 ? r[i - n] + beta * p_in[i - n] : 0.0f) + (y < n - 1 ? r[i + n] + beta * p_in[i + n] : 0.0f));
    float a = 4.0f * pi - nb;
    p_out[i] = pi;
    ap[i] = a;
    d = pi * a;
  }
  float mine = block_total(d);
  if (threadIdx.x == 0) partial[blockIdx.x] = mine;
}

// Kernel 2: alpha = rr[1] / p.Ap (each block adds the partial sums itself, in the same order),
// x += alpha p, r -= alpha Ap; each block stores its share of the new r.r, and the last block to
// finish adds them in order, moves rr along, counts the iteration and sets *flag once
// ||r||^2 <= tol2.
extern "C" __global__ void cg_update(float* x, float* r, float* partial2, float* rr, unsigned int* arrived,
                                     int* flag, int* count, const float* p, const float* ap, const float* partial,
                                     int nn, float tol2) {
  __shared__ bool last;
  if (*flag) return;
  float alpha = rr[1] / sum_parts(partial, gridDim.x);
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float d = 0.0f;
  if (i < nn) {
    x[i] += alpha * p[i];
    float ri = r[i] - alpha * ap[i];
    r[i] = ri;
    d = ri * ri;
  }
  float mine = block_total(d);
  if (threadIdx.x == 0) {
    partial2[blockIdx.x] = mine;
    __threadfence();
    last = atomicAdd(arrived, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  float rr_new = sum_parts(partial2, gridDim.x);
  if (threadIdx.x == 0) {
    rr[0] = rr[1];
    rr[1] = rr_new;
    *count += 1;
    if (rr_new <= tol2) *flag = 1;
    *arrived = 0;
  }
}
"""


class Problem:
    """The n x n problem: f, h^2, the right-hand side b = h^2 f and the two tolerances (squared)."""

    def __init__(self, n, rtol, rng):
        self.n, self.rtol = n, rtol
        self.h = 1.0 / (n + 1)
        self.h2 = np.float32(self.h * self.h)
        self.f = rng.standard_normal((n, n)).astype(np.float32)
        self.b = (self.h2 * self.f).astype(np.float32)
        self.blocks = (n * n + THREADS - 1) // THREADS
        # Jacobi: from u = 0 the first update is b / 4. CG: ||r|| <= rtol ||b||, as jax.scipy's cg.
        self.jacobi_tol2 = np.float32((rtol * np.linalg.norm(self.b.astype(np.float64) / 4)) ** 2)
        self.cg_tol2 = np.float32((rtol * np.linalg.norm(self.b.astype(np.float64))) ** 2)


# ----------------------------------------------------------------------------
# Idiomatic JAX
# ----------------------------------------------------------------------------


def jnp_operator(x):
    """A x, matrix-free in jax.numpy: 4 x minus the four neighbours (zero outside the grid)."""
    import jax.numpy as jnp

    p = jnp.pad(x, 1)
    return 4 * x - ((p[1:-1, :-2] + p[1:-1, 2:]) + (p[:-2, 1:-1] + p[2:, 1:-1]))


def jnp_jacobi(prob, max_sweeps):
    """Idiomatic Jacobi: the sweep in jax.numpy in a jitted lax.while_loop; f -> (u, sweeps)."""
    import jax
    import jax.numpy as jnp

    def solve(f):
        def cond(state):
            k, _, d2 = state
            return (d2 > prob.jacobi_tol2) & (k < max_sweeps)

        def body(state):
            k, u, _ = state
            p = jnp.pad(u, 1)
            u_new = 0.25 * (((p[1:-1, :-2] + p[1:-1, 2:]) + (p[:-2, 1:-1] + p[2:, 1:-1])) + prob.h2 * f)
            return k + 1, u_new, jnp.sum((u_new - u) ** 2)

        k, u, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), jnp.zeros_like(f), jnp.float32(jnp.inf)))
        return u, k

    return jax.jit(solve)


def jax_scipy_cg(prob, max_iter):
    """The call a JAX user makes: jax.scipy.sparse.linalg.cg on the matrix-free operator, in jit; b -> x."""
    import jax

    return jax.jit(lambda b: jax.scipy.sparse.linalg.cg(jnp_operator, b, tol=prob.rtol, atol=0.0,
                                                        maxiter=max_iter)[0])


# ----------------------------------------------------------------------------
# The kernels: as XLA custom calls, and as jaxgraph device loops
# ----------------------------------------------------------------------------


class Kernels:
    """This file's kernels for one problem, and the steps (``per_step`` sweeps or iterations) built on them."""

    def __init__(self, prob, per_step=1):
        if per_step < 1:
            raise ValueError(f"per_step must be >= 1, got {per_step}")
        self.prob, self.per_step = prob, per_step
        self.jacobi, self.cg_direction, self.cg_update = (
            jaxgraph.Kernel(SOURCE, k) for k in ("jacobi", "cg_direction", "cg_update"))
        self.arrived = jaxgraph.zeros(1, np.uint32)  # each kernel's last block leaves it at 0

    def jacobi_step(self, u, f, count):
        """``per_step`` sweeps, u -> u_out; count (in place) counts the sweeps that ran; the flag is set once
        one converged. Returns (u_out, count, flag)."""
        p, shape = self.prob, (self.prob.n, self.prob.n)
        partial, update2 = jaxgraph.empty(p.blocks), jaxgraph.empty(1)
        flag = jaxgraph.empty(1, np.int32)
        scratch = [jaxgraph.empty(shape) for _ in range(min(2, self.per_step - 1))]
        u_out = jaxgraph.empty(shape)
        for s in range(self.per_step):
            dst = u_out if s == self.per_step - 1 else scratch[s % 2]
            self.jacobi[p.blocks, THREADS](dst, partial, self.arrived, flag, count, update2, u, f, p.h2, p.n,
                                           p.jacobi_tol2)
            u = dst
        return u_out, count, flag

    def cg_step(self, x, r, p_dir, rr, count):
        """``per_step`` CG iterations on (x, r, p, rr = [last r.r, r.r], count); returns them and the flag.

        x, r, rr and count are updated in place; p ping-pongs with a scratch
        array, ending in p_dir itself after an even number of iterations and
        in a new array after an odd one (the loop feeds it back).
        """
        p, shape = self.prob, (self.prob.n, self.prob.n)
        ap, part1, part2 = jaxgraph.empty(shape), jaxgraph.empty(p.blocks), jaxgraph.empty(p.blocks)
        flag = jaxgraph.empty(1, np.int32)
        bufs = (p_dir, jaxgraph.empty(shape))
        p_out = p_dir if self.per_step % 2 == 0 else jaxgraph.empty(shape)
        for s in range(self.per_step):
            src, dst = bufs[s % 2], (p_out if s == self.per_step - 1 else bufs[(s + 1) % 2])
            self.cg_direction[p.blocks, THREADS](dst, ap, part1, r, src, rr, flag, p.n)
            self.cg_update[p.blocks, THREADS](x, r, part2, rr, self.arrived, flag, count, dst, ap, part1,
                                              p.n * p.n, p.cg_tol2)
        return x, r, p_out, rr, count, flag

    def jacobi_loop(self, max_sweeps, check_every=1):
        """(graphed sweep, graphed_loop until its flag): at most ``max_sweeps`` sweeps."""
        n = self.prob.n
        graphed = jaxgraph.make_graphed_callables(
            self.jacobi_step, (np.zeros((n, n), np.float32), self.prob.f, np.zeros(1, np.int32)))
        steps = -(-max_sweeps // self.per_step)
        return graphed, _until_loop(graphed, steps, {0: 0}, check_every)

    def cg_loop(self, max_iter, check_every=1):
        """(graphed iterations, graphed_loop until its flag): at most ``max_iter`` iterations."""
        n = self.prob.n
        z = np.zeros((n, n), np.float32)
        graphed = jaxgraph.make_graphed_callables(
            self.cg_step, (z, z, z, np.zeros(2, np.float32), np.zeros(1, np.int32)))
        steps = -(-max_iter // self.per_step)
        return graphed, _until_loop(graphed, steps, {2: 2} if self.per_step % 2 else None, check_every)

    def xla_jacobi(self, max_sweeps):
        """XLA launching the jacobi kernel (``Kernel.jax_call``) in a jitted lax.while_loop; f -> (u, sweeps)."""
        import jax
        import jax.numpy as jnp

        p = self.prob
        out = (jax.ShapeDtypeStruct((p.n, p.n), jnp.float32), jax.ShapeDtypeStruct((p.blocks,), jnp.float32))

        def solve(f):
            def body(state):
                u, arrived, flag, count = state
                u, _, arrived, flag, count, _ = self.jacobi.jax_call(
                    *out, arrived, flag, count, jax.ShapeDtypeStruct((1,), jnp.float32), u, f, p.h2, p.n,
                    p.jacobi_tol2, grid=p.blocks, block=THREADS, inout=("arrived", "flag", "count"))
                return u, arrived, flag, count

            init = (jnp.zeros((p.n, p.n), jnp.float32), jnp.zeros(1, jnp.uint32), jnp.zeros(1, jnp.int32),
                    jnp.zeros(1, jnp.int32))
            u, _, _, count = jax.lax.while_loop(lambda s: (s[2][0] == 0) & (s[3][0] < max_sweeps), body, init)
            return u, count[0]

        return jax.jit(solve)


def _until_loop(graphed, steps, feed, check_every):
    """graphed_loop until the step's flag (its last output); ``check_every`` > 1 needs the every-K stop."""
    flag = graphed.static_outputs[-1]
    if check_every == 1:
        return jaxgraph.graphed_loop(graphed, steps, feed=feed, until=flag)
    return jaxgraph.graphed_loop(graphed, steps, feed=feed, until=flag, check_every=check_every)


def has_check_every():
    """Whether this jaxgraph's graphed_loop has the every-K stop (``check_every=``)."""
    import inspect

    return "check_every" in inspect.signature(jaxgraph.graphed_loop).parameters


def jacobi_in_jit(loop):
    """The Jacobi device loop inside jax.jit: f -> (u, sweeps)."""
    import jax
    import jax.numpy as jnp

    def solve(f):
        (u, count, _), _ = loop(jnp.zeros_like(f), f, jnp.zeros(1, jnp.int32))
        return u, count[0]

    return jax.jit(solve)


def cg_in_jit(loop):
    """The CG device loop inside jax.jit: b -> (x, iterations)."""
    import jax
    import jax.numpy as jnp

    def solve(b):
        rr = jnp.stack([jnp.float32(1), jnp.sum(b * b)])  # beta = 0 at the start (p = 0 there)
        (x, _, _, _, count, _), _ = loop(jnp.zeros_like(b), b, jnp.zeros_like(b), rr, jnp.zeros(1, jnp.int32))
        return x, count[0]

    return jax.jit(solve)


def jacobi_eager(graphed, loop, prob):
    """The Jacobi device loop replayed from Python: () -> (u, sweeps) as device arrays."""
    u_s, f_s, count = graphed.static_inputs
    f_d, zero = jaxgraph.asarray(prob.f), jaxgraph.zeros((prob.n, prob.n))

    def run():
        u_s.copy_(zero)
        f_s.copy_(f_d)
        count.fill_(0)
        loop.replay()
        return u_s, count  # after the last step the fed input holds u too

    return run


def cg_eager(graphed, loop, prob):
    """The CG device loop replayed from Python: () -> (x, iterations) as device arrays."""
    x, r, p_dir, rr, count = graphed.static_inputs
    b = jaxgraph.asarray(prob.b)
    rr0 = jaxgraph.asarray(np.array([1, np.dot(prob.b.ravel(), prob.b.ravel())], np.float32))

    def run():
        x.fill_(0)
        r.copy_(b)
        p_dir.fill_(0)
        rr.copy_(rr0)
        count.fill_(0)
        loop.replay()
        return x, count

    return run


# ----------------------------------------------------------------------------
# References (numpy, scipy)
# ----------------------------------------------------------------------------


def exact_solution(prob):
    """The discrete problem's exact solution: scipy's sparse LU, or numpy's sine-transform solve."""
    n, f, h = prob.n, prob.f, prob.h
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


def numpy_jacobi(prob, sweeps):
    """``sweeps`` Jacobi sweeps from zero in float32, as the kernel computes them."""
    u = np.zeros_like(prob.f)
    p = np.zeros((prob.n + 2, prob.n + 2), np.float32)
    for _ in range(sweeps):
        p[1:-1, 1:-1] = u
        u = np.float32(0.25) * (((p[1:-1, :-2] + p[1:-1, 2:]) + (p[:-2, 1:-1] + p[2:, 1:-1])) + prob.b)
    return u


def relative_residual(prob, x):
    """||b - A x|| / ||b|| in float64."""
    x = np.asarray(x, np.float64)
    p = np.pad(x, 1)
    ax = 4 * x - ((p[1:-1, :-2] + p[1:-1, 2:]) + (p[:-2, 1:-1] + p[2:, 1:-1]))
    b = prob.b.astype(np.float64)
    return float(np.linalg.norm(b - ax) / np.linalg.norm(b))


class Checker:
    """Checks every solution against the references (computed once per problem)."""

    def __init__(self, prob):
        self.prob = prob
        self.exact, self.how = exact_solution(prob)
        self.scale = float(np.abs(self.exact).max())
        self._jacobi = {}

    def jacobi(self, name, u, sweeps, max_sweeps):
        """u after ``sweeps`` sweeps: numpy's same sweeps (float32 rounding) and the exact solution."""
        if sweeps >= max_sweeps:
            raise AssertionError(f"{name}: not converged after {max_sweeps} sweeps")
        if sweeps not in self._jacobi:
            self._jacobi[sweeps] = numpy_jacobi(self.prob, sweeps)
        np.testing.assert_allclose(u, self._jacobi[sweeps], rtol=0, atol=5e-4 * self.scale, err_msg=name)
        np.testing.assert_allclose(u, self.exact, rtol=0, atol=0.05 * self.scale, err_msg=name)
        return float(np.abs(u - self.exact).max()) / self.scale

    def cg(self, name, x):
        """x's residual (within tolerance, allowing float32 drift) and its distance to the exact solution."""
        res = relative_residual(self.prob, x)
        if not res <= 2 * self.prob.rtol:
            raise AssertionError(f"{name}: relative residual {res:.2e} above 2 x rtol = {2 * self.prob.rtol:.1e}")
        np.testing.assert_allclose(x, self.exact, rtol=0, atol=0.01 * self.scale, err_msg=name)
        return float(np.abs(x - self.exact).max()) / self.scale


# ----------------------------------------------------------------------------
# The example
# ----------------------------------------------------------------------------


def timed(run, repeats=3):
    """Run once (compiles, warms up), then ``repeats`` more; ((results on the host), median seconds)."""
    import jax

    jax.block_until_ready(run())
    times = []
    for _ in range(repeats):
        jaxgraph.synchronize()
        start = time.perf_counter()
        out = jax.block_until_ready(run())
        jaxgraph.synchronize()
        times.append(time.perf_counter() - start)
    u, count = (np.asarray(a.numpy() if isinstance(a, jaxgraph.DeviceArray) else a) for a in out)
    return (u, int(np.ravel(count)[0])), float(np.median(times))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", type=int, default=64, help="interior points per side (default 64)")
    p.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance (default 1e-4)")
    p.add_argument("--max-sweeps", type=int, default=400_000, help="give up after this many Jacobi sweeps")
    p.add_argument("--max-iter", type=int, default=20_000, help="give up after this many CG iterations")
    p.add_argument("--sweeps-per-step", type=int, default=8,
                   help="sweeps (CG iterations) per step of the device loop (default 8)")
    p.add_argument("--check-every", type=int, default=8,
                   help="the every-K stop's K: steps between reads of the flag (default 8)")
    p.add_argument("--no-jacobi", action="store_true", help="CG only (Jacobi needs ~n^2 sweeps)")
    p.add_argument("--quick", action="store_true", help="a 16 x 16 grid (tests)")
    p.add_argument("--command-buffers", choices=("default", "on", "off", "while"), default="default",
                   help="XLA's command buffers: JAX's defaults, or forced on, off, or on with WHILE (sets XLA_FLAGS)")
    args = p.parse_args(argv)
    if args.quick:
        args.grid = 16
    for name in ("grid", "max_sweeps", "max_iter", "sweeps_per_step", "check_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 0 < args.rtol < 1:
        p.error(f"--rtol must be in (0, 1), got {args.rtol}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if jaxgraph.device_count() == 0:
        print("a CUDA GPU is needed to run the solvers: none found, so this example stops here")
        return 0
    if args.command_buffers != "default":
        os.environ["XLA_FLAGS"] = COMMAND_BUFFERS[args.command_buffers]
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax.numpy as jnp

    prob = Problem(args.grid, args.rtol, np.random.default_rng())
    check = Checker(prob)
    kernels = Kernels(prob, args.sweeps_per_step)
    every = args.check_every if has_check_every() else None
    f, b = jnp.asarray(prob.f), jnp.asarray(prob.b)
    flags = os.environ.get("XLA_FLAGS") or "unset: JAX's defaults"
    print(f"{prob.n} x {prob.n} Poisson problem, rtol {prob.rtol:g}; {args.sweeps_per_step} sweeps (iterations) "
          f"per device-loop step; XLA_FLAGS {flags}", flush=True)
    if every is None:
        print("this jaxgraph's graphed_loop has no check_every=: the every-K stop is left out", flush=True)
    tables = {}
    if not args.no_jacobi:
        print("[Jacobi] idiomatic JAX, XLA on the jacobi kernel, jaxgraph device loops", flush=True)
        idiomatic, xla = jnp_jacobi(prob, args.max_sweeps), kernels.xla_jacobi(args.max_sweeps)
        runs = {"idiomatic JAX: jnp sweep in a jitted lax.while_loop": timed(lambda: idiomatic(f)),
                "XLA: the jacobi kernel as a jax_call in the while_loop": timed(lambda: xla(f))}
        for how, k in (("exact stop", 1), (f"every-{every} stop", every)):
            if k is None:
                continue
            graphed, loop = kernels.jacobi_loop(args.max_sweeps, k)
            runs[f"jaxgraph: device loop, {how}, eager"] = timed(jacobi_eager(graphed, loop, prob))
            solve = jacobi_in_jit(loop)
            runs[f"jaxgraph: device loop, {how}, in jax.jit"] = timed(lambda solve=solve: solve(f))
        worst = max(check.jacobi(name, u, n, args.max_sweeps) for name, ((u, n), _) in runs.items())
        counts = {name: n for name, ((_, n), _) in runs.items()}
        ours = {n for name, n in counts.items() if not name.startswith("idiomatic")}
        if len(ours) != 1:  # the same kernel, the same order of additions: the same sweep, however stopped
            raise AssertionError(f"the kernel's ways stopped after different sweeps: {counts}")
        print(f"every Jacobi solution matches numpy's sweeps and the exact solution ({check.how}) to {worst:.1e} "
              f"of its largest value; sweeps: {counts}", flush=True)
        tables["Jacobi"] = runs
    print("[CG] jax.scipy.sparse.linalg.cg, jaxgraph device loops", flush=True)
    idiomatic_cg, none = jax_scipy_cg(prob, args.max_iter), jnp.zeros(1, jnp.int32)  # cg does not say its count
    runs = {"idiomatic JAX: jax.scipy.sparse.linalg.cg in jax.jit": timed(lambda: (idiomatic_cg(b), none))}
    for how, k in (("exact stop", 1), (f"every-{every} stop", every)):
        if k is None:
            continue
        graphed, loop = kernels.cg_loop(args.max_iter, k)
        runs[f"jaxgraph: CG device loop, {how}, eager"] = timed(cg_eager(graphed, loop, prob))
        solve = cg_in_jit(loop)
        runs[f"jaxgraph: CG device loop, {how}, in jax.jit"] = timed(lambda solve=solve: solve(b))
    worst = max(check.cg(name, x) for name, ((x, _), _) in runs.items())
    counts = {name: n for name, ((_, n), _) in runs.items() if not name.startswith("idiomatic")}
    if len(set(counts.values())) != 1 or next(iter(counts.values())) >= args.max_iter:
        raise AssertionError(f"the CG loops stopped after different (or too many) iterations: {counts}")
    print(f"every CG solution is within tolerance (float64 residual) and matches the exact solution ({check.how}) "
          f"to {worst:.1e} of its largest value; jaxgraph's CG ran {next(iter(counts.values()))} iterations",
          flush=True)
    tables["CG"] = runs

    for method, runs in tables.items():
        base = next(iter(runs.values()))[1]
        width = max(map(len, runs))
        print(f"\n{method}: {'way':<{width - len(method) - 2}}  {'ms':>8}  {'sweeps':>7}  vs idiomatic JAX")
        for name, ((_, n), seconds) in runs.items():
            print(f"{name:<{width}}  {seconds * 1e3:8.3f}  {n if n else '?':>7}  {base / seconds:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
