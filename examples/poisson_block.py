"""poisson_solver's fast path for small grids: one thread block, its state on chip, many sweeps a launch.

A grid of up to 64 x 64 unknowns (4096 floats: 16 KiB) fits one block's
shared memory, so a CUDA programmer solves it with one block of 1024 threads
(poisson_block.cu): each launch loads the state, runs up to ``per_launch``
Jacobi sweeps or CG iterations with ``__syncthreads`` and block sums instead
of grid-wide ones, tests the tolerance after every sweep (iteration) and
stops right there, stores the state, adds its sweeps to the count and sets
the flag once converged. The ``jaxgraph.graphed_loop`` over that one-kernel
step (``until=`` the flag) relaunches it until the flag is set, so the
exact stop costs one loop trip per ``per_launch`` sweeps, not one a sweep,
and the result and count are the same whatever ``per_launch`` and whichever
stop (a launch that finds the flag set does nothing).

Every operation in the kernels is an explicitly rounded float32 operation in
a fixed order; the numpy models below (:func:`jacobi_block_model`,
:func:`cg_block_model`: one launch each, the kernel's threads as rows of
arrays) compute the same bits, so the sweep the kernel stops at is the one
numpy stops at, and u is numpy's ``poisson_solver.numpy_jacobi`` after that
many sweeps, bit for bit.
"""

import pathlib

import numpy as np

import jaxgraph

SIDE, ROWS, THREADS = 64, 4, 1024  # the block's grid side, rows per thread, threads (SIDE * SIDE / ROWS)
PER_LAUNCH = 256  # default sweeps (iterations) per launch: the kernel stops early once converged
SOURCE = (pathlib.Path(__file__).parent / "poisson_block.cu").read_text()
f32 = np.float32


def fits(n):
    """Whether an n x n grid fits the single-block kernels (n <= 64)."""
    return 1 <= n <= SIDE


class BlockKernels:
    """The single-block kernels for one problem (``poisson_solver.Problem``, n <= 64) and their device loops."""

    def __init__(self, prob, per_launch=PER_LAUNCH):
        if not fits(prob.n):
            raise ValueError(f"the single-block kernels take grids of up to {SIDE} x {SIDE}, got {prob.n} x {prob.n}")
        if per_launch < 1:
            raise ValueError(f"per_launch must be >= 1, got {per_launch}")
        self.prob, self.per_launch = prob, per_launch
        self.jacobi, self.cg = (jaxgraph.Kernel(SOURCE, k) for k in ("jacobi_block", "cg_block"))

    def jacobi_step(self, u, f, count):
        """One launch: up to ``per_launch`` sweeps on u in place; returns (u, count, flag)."""
        p = self.prob
        flag = jaxgraph.empty(1, np.int32)
        self.jacobi[1, THREADS](u, flag, count, f, p.h2, p.n, p.jacobi_tol2, self.per_launch)
        return u, count, flag

    def jacobi_loop(self, max_sweeps, check_every=1):
        """(graphed step, graphed_loop until its flag): at most ``max_sweeps`` sweeps (rounded up to launches)."""
        n = self.prob.n
        graphed = jaxgraph.make_graphed_callables(
            self.jacobi_step, (np.zeros((n, n), f32), self.prob.f, np.zeros(1, np.int32)))
        return graphed, _until_loop(graphed, -(-max_sweeps // self.per_launch), check_every)

    def cg_step(self, x, count, b, r, w, p_dir, s, scal):
        """One launch: up to ``per_launch`` pipelined CG iterations, all the state updated in place (the
        first launch, count == 0, starts from x = 0 and b alone); returns the inputs but b (only read), and
        the flag."""
        pb = self.prob
        flag = jaxgraph.empty(1, np.int32)
        self.cg[1, THREADS](x, flag, count, r, w, p_dir, s, scal, b, pb.n, pb.cg_tol2, self.per_launch)
        return x, count, r, w, p_dir, s, scal, flag

    def cg_loop(self, max_iter, check_every=1):
        """(graphed step, graphed_loop until its flag): at most ``max_iter`` iterations (rounded up to launches)."""
        z = np.zeros((self.prob.n, self.prob.n), f32)
        graphed = jaxgraph.make_graphed_callables(
            self.cg_step, (z, np.zeros(1, np.int32), self.prob.b, z, z, z, z, np.zeros(4, f32)))
        return graphed, _until_loop(graphed, -(-max_iter // self.per_launch), check_every)


    def xla_jacobi(self, max_sweeps):
        """The same kernel as a ``Kernel.jax_call`` in a jitted lax.while_loop, one launch (up to
        ``per_launch`` sweeps) a trip until the flag (no graph: XLA launches it); f -> (u, sweeps)."""
        import jax
        import jax.numpy as jnp

        p = self.prob

        def solve(f):
            def body(state):
                return self.jacobi.jax_call(*state, f, p.h2, p.n, p.jacobi_tol2, self.per_launch, grid=1,
                                            block=THREADS, inout=("u", "flag", "count"))

            init = (jnp.zeros_like(f), jnp.zeros(1, jnp.int32), jnp.zeros(1, jnp.int32))
            u, _, count = jax.lax.while_loop(lambda s: (s[1][0] == 0) & (s[2][0] < max_sweeps), body, init)
            return u, count[0]

        return jax.jit(solve)

    def xla_cg(self, max_iter):
        """The same kernel as a ``Kernel.jax_call`` in a jitted lax.while_loop, one launch (up to
        ``per_launch`` iterations) a trip until the flag; b -> (x, iterations)."""
        import jax
        import jax.numpy as jnp

        pb = self.prob

        def solve(b):
            def body(state):
                return self.cg.jax_call(*state, b, pb.n, pb.cg_tol2, self.per_launch, grid=1, block=THREADS,
                                        inout=("x", "flag", "count", "r", "w", "p", "s", "scal"))

            zero = jnp.zeros_like(b)  # the first launch (count 0) starts from x = 0 and b alone
            init = (zero, jnp.zeros(1, jnp.int32), jnp.zeros(1, jnp.int32), zero, zero, zero, zero,
                    jnp.zeros(4, jnp.float32))
            x, _, count, *_ = jax.lax.while_loop(lambda s: (s[1][0] == 0) & (s[2][0] < max_iter), body, init)
            return x, count[0]

        return jax.jit(solve)


def _until_loop(graphed, steps, check_every):
    flag = graphed.static_outputs[-1]
    if check_every == 1:
        return jaxgraph.graphed_loop(graphed, steps, until=flag)
    return jaxgraph.graphed_loop(graphed, steps, until=flag, check_every=check_every)


def jacobi_in_jit(loop):
    """The single-block Jacobi loop inside jax.jit: f -> (u, sweeps)."""
    import jax
    import jax.numpy as jnp

    def solve(f):
        (u, count, _), _ = loop(jnp.zeros_like(f), f, jnp.zeros(1, jnp.int32))
        return u, count[0]

    return jax.jit(solve)


def cg_in_jit(loop):
    """The single-block CG loop inside jax.jit: b -> (x, iterations)."""
    import jax
    import jax.numpy as jnp

    def solve(b):
        zero = jnp.zeros_like(b)
        out, _ = loop(zero, jnp.zeros(1, jnp.int32), b, zero, zero, zero, zero, jnp.zeros(4, jnp.float32))
        return out[0], out[1][0]

    return jax.jit(solve)


def jacobi_eager(graphed, loop, prob):
    """The single-block Jacobi loop replayed from Python: () -> (u, sweeps) as device arrays."""
    u, f, count = graphed.static_inputs
    f_d, zero = jaxgraph.asarray(prob.f), jaxgraph.zeros((prob.n, prob.n))

    def run():
        u.copy_(zero)
        f.copy_(f_d)
        count.fill_(0)
        loop.replay()
        return u, count

    return run


def cg_eager(graphed, loop, prob):
    """The single-block CG loop replayed from Python: () -> (x, iterations) as device arrays."""
    x, count, b, *_ = graphed.static_inputs
    b_d = jaxgraph.asarray(prob.b)

    def run():
        count.fill_(0)  # the first launch then starts from x = 0 and b (the other state is written before read)
        b.copy_(b_d)
        loop.replay()
        return x, count

    return run


# ----------------------------------------------------------------------------
# The kernels in numpy: one launch each, thread t's registers as row t
# ----------------------------------------------------------------------------


class Strips:
    """The kernels' thread layout for an n x n grid: thread t owns column t % 64 of rows 4 (t // 64) .. + 3."""

    def __init__(self, n):
        t = np.arange(THREADS)
        self.n, self.col = n, (t % SIDE)[:, None]
        self.row = ROWS * (t // SIDE)[:, None] + np.arange(ROWS)  # (threads, ROWS)
        self.inside = (self.col < n) & (self.row < n)
        self.glob = np.where(self.inside, self.row * n + self.col, 0)
        self.sh = self.row * SIDE + self.col  # the shared copy's index (row stride 64): all 4096, once each

    def load(self, a):
        return np.where(self.inside, np.ravel(a)[self.glob], f32(0)).astype(f32)

    def store(self, a, v):
        a.reshape(-1)[self.glob[self.inside]] = v[self.inside]

    def shared(self, v):
        sh = np.empty(SIDE * SIDE, f32)
        sh[self.sh] = v
        return sh

    def neighbours(self, sh, own):
        """((left + right) + (up + down)) of every thread's points, as ``Strip::neighbours``."""
        n, c, row, j, last = self.n, self.col, self.row, self.sh, SIDE * SIDE - 1
        zero = np.zeros((THREADS, 1), f32)
        left = np.where(c > 0, sh[np.maximum(j - 1, 0)], f32(0))
        right = np.where(c < n - 1, sh[np.minimum(j + 1, last)], f32(0))
        first, final = np.arange(ROWS) == 0, np.arange(ROWS) == ROWS - 1
        up = np.where(first, np.where(row > 0, sh[np.maximum(j - SIDE, 0)], f32(0)),
                      np.concatenate([zero, own[:, :-1]], axis=1))
        down = np.where(row + 1 < n, np.where(final, sh[np.minimum(j + SIDE, last)],
                                              np.concatenate([own[:, 1:], zero], axis=1)), f32(0))
        return (left + right) + (up + down)


def tree32(a):
    """Lane 0's total of a shuffle-down tree over the last axis (32 lanes), in float32."""
    a = np.array(a, f32)
    for o in (16, 8, 4, 2, 1):
        a[..., :o] = a[..., :o] + a[..., o:2 * o]
    return a[..., 0]


def block_total(terms):
    """The kernels' block sum of ``terms`` (threads x ROWS): each thread's in row order, each warp's in a
    tree, the 32 warps' sums in the same tree."""
    acc = np.zeros(THREADS, f32)
    for k in range(ROWS):
        acc = acc + terms[:, k]
    return tree32(tree32(acc.reshape(32, 32)))


def jacobi_block_model(u, flag, count, f, h2, n, tol2, sweeps):
    """``jacobi_block`` in numpy: one launch, u, flag and count updated in place."""
    if flag[0]:
        return
    st = Strips(n)
    v, b = st.load(u), st.load(f) * f32(h2)
    sh, done, converged = st.shared(v), 0, False
    while done < sweeps:
        nxt = np.where(st.inside, f32(0.25) * (st.neighbours(sh, v) + b), f32(0))
        d = nxt - v
        total = block_total(d * d)
        v, sh, done = nxt, st.shared(nxt), done + 1
        if total <= tol2:
            converged = True
            break
    st.store(u, v)
    count[0] += done
    if converged:
        flag[0] = 1


def cg_block_model(x, flag, count, r, w, p, s, scal, b, n, tol2, iters):
    """``cg_block`` in numpy: one launch, the state updated in place."""
    if flag[0]:
        return
    first, st = count[0] == 0, Strips(n)
    if first:
        zero = np.zeros((THREADS, ROWS), f32)
        xv, rv, wv, pv, sv = zero, st.load(b), zero, zero, zero
        gamma, delta, gamma_last, alpha_last = f32(0), f32(0), f32(np.inf), f32(1)
    else:
        xv, rv, wv, pv, sv = (st.load(a) for a in (x, r, w, p, s))
        gamma, delta, gamma_last, alpha_last = (f32(v) for v in scal)
    done, start = 0, first
    converged = not first and gamma <= tol2
    while not converged and done < iters:
        alpha = f32(0)
        if not start:
            beta = gamma / gamma_last
            alpha = gamma / (delta - beta * gamma / alpha_last)
            sv = wv + beta * sv
            pv = rv + beta * pv
            xv = xv + alpha * pv
            rv = rv - alpha * sv
        wv = np.where(st.inside, f32(4) * rv - st.neighbours(st.shared(rv), rv), f32(0))
        g, d = block_total(rv * rv), block_total(wv * rv)
        if not start:
            gamma_last, alpha_last, done = gamma, alpha, done + 1
        start, gamma, delta = False, g, d
        converged = gamma <= tol2
    for a, v in ((x, xv), (r, rv), (w, wv), (p, pv), (s, sv)):
        st.store(a, v)
    scal[:] = gamma, delta, gamma_last, alpha_last
    count[0] += done
    if converged:
        flag[0] = 1


def model_solve(prob, method, per_launch=PER_LAUNCH, most=10**6):
    """The device loop over the numpy models (the exact stop): (u or x, sweeps or iterations, launches)."""
    n, flag, count = prob.n, np.zeros(1, np.int32), np.zeros(1, np.int32)
    state = np.zeros((n, n), f32)
    if method == "jacobi":
        launch = lambda: jacobi_block_model(state, flag, count, prob.f, prob.h2, n, prob.jacobi_tol2,  # noqa: E731
                                            per_launch)
    else:
        rest = [np.full((n, n), np.nan, f32) for _ in range(4)] + [np.full(4, np.nan, f32)]
        launch = lambda: cg_block_model(state, flag, count, *rest, prob.b, n, prob.cg_tol2, per_launch)  # noqa: E731
    for launches in range(1, -(-most // per_launch) + 1):
        launch()
        if flag[0]:
            return state, int(count[0]), launches
    raise AssertionError(f"the {method} model did not converge within {most} sweeps (iterations)")


if __name__ == "__main__":  # a helper module: run, it says what it is and where the example is
    print('examples/poisson_block.py is a helper module of examples/poisson_solver.py (its single-block fast path for small grids), not an example: run python examples/poisson_solver.py')
