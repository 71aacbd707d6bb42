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
  1. idiomatic JAX: the sweep in jax.numpy in a jitted lax.while_loop,
     the tolerance tested after every sweep; and its fair form, S sweeps
     a trip (S = `--sweeps-per-step`, as the device loop runs between
     reads of its flag; the sweeps after the stop masked: same result);
  2. XLA launching this file's `jacobi` kernel (Kernel.jax_call) in the
     same while_loop, one a trip and S a trip (the same kernels, no graph);
  3. jaxgraph.graphed_loop(..., until=flag): one CUDA graph runs the sweeps
     and stops on the device, eagerly and inside jax.jit (one FFI call);
     exact stop, and `check_every=K` (the flag read once per K steps).
  Conjugate gradients
  4. idiomatic JAX: jax.scipy.sparse.linalg.cg on the same matrix-free
     operator in jax.numpy, same tolerance, in jax.jit; and, fair, CG
     written in jax.numpy, S iterations a while_loop trip;
  5. XLA launching the CG kernel below (Kernel.jax_call), S a trip;
  6. jaxgraph: CG in the same device loop, exact and every-K stop, one
     kernel an iteration: pipelined CG (Chronopoulos and Gear), whose two
     dot products r.r and (A r).r come from one reduction.
  Grids up to 64 x 64 (4096 unknowns: one thread block's shared memory)
  7. jaxgraph: the single-block fast path (poisson_block.py), chosen
     automatically: one launch of 1024 threads runs up to
     `--block-per-launch` Jacobi sweeps or CG iterations with the state
     on chip, tests the tolerance after every one and stops right there;
     the device loop relaunches it until the flag, exact and every-K stop;
     and the same kernel through Kernel.jax_call in a while_loop. This
     path's speed is the kernel's: the graph only relaunches it.

The tables give each way against idiomatic JAX, and each jaxgraph way
against the same kernels through jax_call (what the graph adds to them).

The kernels are written as a CUDA programmer would: `jacobi` is one kernel a
sweep (each block stores its sum of squared updates; every block of the
next launch adds those sums up in a fixed order and stops, carrying u over
and setting the flag, if that sweep was within tolerance). A stencil after
an elementwise update recomputes that update at the neighbours instead of
waiting for a kernel to finish it (`cg_fused`: the neighbours' new r). Dot
products are per-block sums that the next launch's blocks each add up in
the same fixed order: no float atomics, so every run takes the same path.
The single-block kernels round every operation explicitly in a fixed order,
so their result and count are numpy's model of them bit for bit.
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
import pathlib
import sys
import time

import numpy as np

import jaxgraph

COMMAND_BUFFERS = {"on": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1",
                   "off": "--xla_gpu_enable_command_buffer=",
                   "while": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE,CONDITIONAL "
                            "--xla_gpu_graph_min_graph_size=1"}

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # poisson_kernels.py lives beside this file
from poisson_kernels import (THREADS, Kernels, cg_eager, cg_in_jit, has_check_every,  # noqa: E402
                             jacobi_eager, jacobi_in_jit)
import poisson_block  # noqa: E402  (the single-block fast path, grids up to 64 x 64)


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


def jnp_jacobi(prob, max_sweeps, per_trip=1):
    """Idiomatic Jacobi: the sweep in jax.numpy in a jitted lax.while_loop; f -> (u, sweeps).

    ``per_trip=1`` tests the tolerance after every trip of one sweep, as a user
    writes it. More runs ``per_trip`` sweeps a trip (the fair counterpart of a
    device loop that reads its flag once per step of that many sweeps): each
    still tests the sweep before it, and a sweep after convergence leaves u
    and the count as they were (``jnp.where``), so u and the count are the
    same as with one sweep a trip.
    """
    import jax
    import jax.numpy as jnp

    def sweep(u, f):
        p = jnp.pad(u, 1)
        u_new = 0.25 * (((p[1:-1, :-2] + p[1:-1, 2:]) + (p[:-2, 1:-1] + p[2:, 1:-1])) + prob.h2 * f)
        return u_new, jnp.sum((u_new - u) ** 2)

    def going(k, d2):
        return (d2 > prob.jacobi_tol2) & (k < max_sweeps)

    def solve(f):
        def body(state):
            k, u, d2 = state
            if per_trip == 1:
                u, d2 = sweep(u, f)
                return k + 1, u, d2
            for _ in range(per_trip):
                on = going(k, d2)
                u_new, d2_new = sweep(u, f)
                k, u, d2 = k + on.astype(k.dtype), jnp.where(on, u_new, u), jnp.where(on, d2_new, d2)
            return k, u, d2

        k, u, _ = jax.lax.while_loop(lambda s: going(s[0], s[2]), body,
                                     (jnp.int32(0), jnp.zeros_like(f), jnp.float32(jnp.inf)))
        return u, k

    return jax.jit(solve)


def jnp_cg(prob, max_iter, per_trip=1):
    """Conjugate gradients written in jax.numpy (not the library's), ``per_trip`` iterations a
    ``lax.while_loop`` trip, in jit; b -> (x, iterations).

    The textbook iteration on the matrix-free operator, stopping once
    ||r||^2 <= (rtol ||b||)^2 (jax.scipy's test). Each iteration tests the
    residual before it; one after convergence leaves the state and the count
    as they were, so the result and count do not depend on ``per_trip``: the
    fair counterpart of a device loop that reads its flag once per step of
    ``per_trip`` iterations.
    """
    import jax
    import jax.numpy as jnp

    def going(k, rr):
        return (rr > prob.cg_tol2) & (k < max_iter)

    def iteration(state):
        k, x, r, p, rr = state
        on = going(k, rr)
        ap = jnp_operator(p)
        alpha = rr / jnp.sum(p * ap)
        x_new, r_new = x + alpha * p, r - alpha * ap
        rr_new = jnp.sum(r_new * r_new)
        p_new = r_new + (rr_new / rr) * p
        keep = lambda new, old: jnp.where(on, new, old)  # noqa: E731
        return k + on.astype(k.dtype), keep(x_new, x), keep(r_new, r), keep(p_new, p), keep(rr_new, rr)

    def solve(b):
        def body(state):
            for _ in range(per_trip):
                state = iteration(state)
            return state

        init = (jnp.int32(0), jnp.zeros_like(b), b, b, jnp.sum(b * b))
        k, x, *_ = jax.lax.while_loop(lambda s: going(s[0], s[4]), body, init)
        return x, k

    return jax.jit(solve)


def jax_scipy_cg(prob, max_iter):
    """The call a JAX user makes: jax.scipy.sparse.linalg.cg on the matrix-free operator, in jit; b -> x."""
    import jax

    return jax.jit(lambda b: jax.scipy.sparse.linalg.cg(jnp_operator, b, tol=prob.rtol, atol=0.0,
                                                        maxiter=max_iter)[0])


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


def numpy_operator(x):
    """A x in numpy (in x's dtype): 4 x minus the four neighbours, zero outside."""
    q = np.pad(x, 1)
    return x.dtype.type(4) * x - ((q[1:-1, :-2] + q[1:-1, 2:]) + (q[:-2, 1:-1] + q[2:, 1:-1]))


def relative_residual(prob, x):
    """||b - A x|| / ||b|| in float64."""
    b = prob.b.astype(np.float64)
    return float(np.linalg.norm(b - numpy_operator(np.asarray(x, np.float64))) / np.linalg.norm(b))


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


def add_device_loops(runs, label, stops, build, eager, in_jit, arg):
    """Time a device loop eagerly and in ``jax.jit`` for each ``(how, k)`` stop (``k`` None: left out).

    ``build(k)`` gives ``(graphed, loop)``; ``eager(graphed, loop)`` and ``in_jit(loop)`` the functions to
    time, the latter called on ``arg``. Adds ``runs["jaxgraph: <label>, <how>, eager"]`` and ``... in jax.jit``.
    """
    for how, k in stops:
        if k is None:
            continue
        graphed, loop = build(k)
        runs[f"jaxgraph: {label}, {how}, eager"] = timed(eager(graphed, loop))
        solve = in_jit(loop)
        runs[f"jaxgraph: {label}, {how}, in jax.jit"] = timed(lambda: solve(arg))


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
                   help="Jacobi's every-K stop: steps between reads of the flag (default 8)")
    p.add_argument("--cg-check-every", type=int, default=4,
                   help="CG's every-K stop (default 4: up to K-1 steps of no-op kernels follow convergence)")
    p.add_argument("--block-per-launch", type=int, default=poisson_block.PER_LAUNCH,
                   help="grids up to 64 x 64: sweeps (iterations) per launch of the single-block kernels "
                        f"(default {poisson_block.PER_LAUNCH}; each stops early once converged)")
    p.add_argument("--no-jacobi", action="store_true", help="CG only (Jacobi needs ~n^2 sweeps)")
    p.add_argument("--quick", action="store_true", help="a 16 x 16 grid (tests)")
    p.add_argument("--command-buffers", choices=("default", "on", "off", "while"), default="default",
                   help="XLA's command buffers: JAX's defaults, or forced on, off, or on with WHILE (sets XLA_FLAGS)")
    args = p.parse_args(argv)
    if args.quick:
        args.grid = 16
    for name in ("grid", "max_sweeps", "max_iter", "sweeps_per_step", "check_every", "cg_check_every",
                 "block_per_launch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.sweeps_per_step % 2:
        p.error(f"--sweeps-per-step must be even (the pipelined CG's arrays ping-pong), got {args.sweeps_per_step}")
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
    block = poisson_block.BlockKernels(prob, args.block_per_launch) if poisson_block.fits(prob.n) else None
    every, cg_every = (args.check_every, args.cg_check_every) if has_check_every() else (None, None)
    f, b = jnp.asarray(prob.f), jnp.asarray(prob.b)
    flags = os.environ.get("XLA_FLAGS") or "unset: JAX's defaults"
    print(f"{prob.n} x {prob.n} Poisson problem, rtol {prob.rtol:g}; {args.sweeps_per_step} sweeps (iterations) "
          f"per device-loop step; XLA_FLAGS {flags}", flush=True)
    if every is None:
        print("this jaxgraph's graphed_loop has no check_every=: the every-K stop is left out", flush=True)
    tables, per = {}, args.sweeps_per_step  # the fair loops: as many a trip as the device loop runs a step
    same = {"Jacobi": {"jaxgraph: device loop": f"XLA: the jacobi kernel as {per} jax_calls a while_loop trip",
                       "jaxgraph: single block": "XLA (single block): the kernel as a jax_call in a while_loop"},
            "CG": {"jaxgraph: CG device loop": f"XLA: the cg_fused kernel as {per} jax_calls a while_loop trip",
                   "jaxgraph: single-block CG": "XLA (single block): the CG kernel as a jax_call in a while_loop"}}
    if not args.no_jacobi:
        print("[Jacobi] idiomatic JAX, XLA on the jacobi kernels, jaxgraph device loops", flush=True)
        idiomatic, xla = jnp_jacobi(prob, args.max_sweeps), kernels.xla_jacobi(args.max_sweeps)
        fair, xla_fair = jnp_jacobi(prob, args.max_sweeps, per), kernels.xla_jacobi(args.max_sweeps, per)
        runs = {"idiomatic JAX: jnp sweep in a jitted lax.while_loop": timed(lambda: idiomatic(f)),
                f"idiomatic JAX, fair: {per} sweeps a while_loop trip": timed(lambda: fair(f)),
                "XLA: the jacobi kernel as a jax_call in the while_loop": timed(lambda: xla(f)),
                same["Jacobi"]["jaxgraph: device loop"]: timed(lambda: xla_fair(f))}
        if block:
            xla_block = block.xla_jacobi(args.max_sweeps)
            runs[same["Jacobi"]["jaxgraph: single block"]] = timed(lambda: xla_block(f))
        stops = (("exact stop", 1), (f"every-{every} stop", every))
        add_device_loops(runs, "device loop", stops, lambda k: kernels.jacobi_loop(args.max_sweeps, k),
                         lambda g, loop: jacobi_eager(g, loop, prob), jacobi_in_jit, f)
        if block:
            add_device_loops(runs, "single block", stops, lambda k: block.jacobi_loop(args.max_sweeps, k),
                             lambda g, loop: poisson_block.jacobi_eager(g, loop, prob), poisson_block.jacobi_in_jit, f)
        worst = max(check.jacobi(name, u, n, args.max_sweeps) for name, ((u, n), _) in runs.items())
        counts = {name: n for name, ((_, n), _) in runs.items()}
        for kernel in (("XLA:", "jaxgraph: device loop"), ("XLA (single block)", "jaxgraph: single block")):
            ours = {n for name, n in counts.items() if name.startswith(kernel)}
            if len(ours) > 1:  # the same kernel, the same order of additions: the same sweep, however stopped
                raise AssertionError(f"the kernel's ways stopped after different sweeps: {counts}")
        if block:
            u_m, sweeps_m, _ = poisson_block.model_solve(prob, "jacobi", args.block_per_launch, args.max_sweeps)
            for name, ((u, n), _) in runs.items():
                if name.startswith(("jaxgraph: single block", "XLA (single block)")) and (
                        n != sweeps_m or not np.array_equal(u, u_m)):
                    raise AssertionError(f"{name}: {n} sweeps, not the numpy model's {sweeps_m} bit for bit")
        print(f"every Jacobi solution matches numpy's sweeps and the exact solution ({check.how}) to {worst:.1e} "
              f"of its largest value; sweeps: {counts}", flush=True)
        tables["Jacobi"] = runs
    print("[CG] jax.scipy.sparse.linalg.cg, CG in jnp, XLA on the CG kernels, jaxgraph device loops", flush=True)
    idiomatic_cg, none = jax_scipy_cg(prob, args.max_iter), jnp.zeros(1, jnp.int32)  # cg does not say its count
    fair_cg, xla_cg = jnp_cg(prob, args.max_iter, per), kernels.xla_cg(args.max_iter, jnp_operator, per)
    runs = {"idiomatic JAX: jax.scipy.sparse.linalg.cg in jax.jit": timed(lambda: (idiomatic_cg(b), none)),
            f"idiomatic JAX, fair: CG in jnp, {per} iterations a while_loop trip": timed(lambda: fair_cg(b)),
            same["CG"]["jaxgraph: CG device loop"]: timed(lambda: xla_cg(b))}
    if block:
        xla_block_cg = block.xla_cg(args.max_iter)
        runs[same["CG"]["jaxgraph: single-block CG"]] = timed(lambda: xla_block_cg(b))
    stops = (("exact stop", 1), (f"every-{cg_every} stop", cg_every))
    add_device_loops(runs, "CG device loop", stops, lambda k: kernels.cg_loop(args.max_iter, k),
                     lambda g, loop: cg_eager(g, loop, prob, numpy_operator), lambda loop: cg_in_jit(loop, jnp_operator), b)
    if block:
        add_device_loops(runs, "single-block CG", stops, lambda k: block.cg_loop(args.max_iter, k),
                         lambda g, loop: poisson_block.cg_eager(g, loop, prob), poisson_block.cg_in_jit, b)
    worst = max(check.cg(name, x) for name, ((x, _), _) in runs.items())
    counts = {name: n for name, ((_, n), _) in runs.items() if name.startswith("jaxgraph: CG")}
    if max(counts.values()) >= args.max_iter or max(counts.values()) - min(counts.values()) > 1:
        raise AssertionError(f"the CG loops stopped after too many, or different, iterations: {counts}")
    if block:
        x_m, its_m, _ = poisson_block.model_solve(prob, "cg", args.block_per_launch, args.max_iter)
        for name, ((x, n), _) in runs.items():
            if not name.startswith(("jaxgraph: single-block", "XLA (single block)")):
                continue
            if n != its_m or not np.array_equal(x, x_m):
                raise AssertionError(f"{name}: {n} iterations, not the numpy model's {its_m} bit for bit")
            counts[name] = n
    print(f"every CG solution is within tolerance (float64 residual) and matches the exact solution ({check.how}) "
          f"to {worst:.1e} of its largest value; jaxgraph's CG iterations: {sorted(set(counts.values()))}",
          flush=True)
    tables["CG"] = runs

    for method, runs in tables.items():  # jaxgraph's rows also against the same kernels through jax_call
        base = next(iter(runs.values()))[1]
        width = max(map(len, runs))
        unit = "sweeps" if method == "Jacobi" else "iters"
        print(f"\n{method}: {'way':<{width - len(method) - 2}}  {'ms':>8}  {unit:>7}  vs idiomatic JAX  "
              "vs the same kernels via jax_call")
        for name, ((_, n), seconds) in runs.items():
            ref = next((runs[x][1] for way, x in same[method].items() if name.startswith(way) and x in runs), None)
            vs = f"  {ref / seconds:6.2f}x" if ref else ""
            print(f"{name:<{width}}  {seconds * 1e3:8.3f}  {n if n else '?':>7}  {base / seconds:6.2f}x{' ' * 9}{vs}")
    print("\n(medians of 3 runs in this process at its XLA setting, a quick look: benchmarks/vs_idiomatic.py times "
          "each side at its best setting over interleaved rounds; results with their ranges in "
          "benchmarks/results/*-vs-idiomatic.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
