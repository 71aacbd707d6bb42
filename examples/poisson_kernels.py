"""examples/poisson_solver.py's solvers as a CUDA programmer writes them, run as jaxgraph device loops.

The kernels are in poisson_solver.cu. :class:`Kernels` builds, for one
problem (``poisson_solver.Problem``), the graphed step of ``per_step`` Jacobi
sweeps or CG iterations and the ``jaxgraph.graphed_loop`` that runs steps
until the kernels set the flag; the functions below run such a loop inside
``jax.jit`` or eagerly from the problem's initial state. ``xla_jacobi`` and
``xla_cg`` run the same kernels as ``Kernel.jax_call``s in a ``lax.while_loop``
(no graph: XLA launches them).
"""

import inspect
import pathlib

import numpy as np

import jaxgraph

THREADS = 256
SOURCE = (pathlib.Path(__file__).parent / "poisson_solver.cu").read_text()


class Kernels:
    """This file's kernels for one problem, and the steps (``per_step`` sweeps or iterations) built on them."""

    def __init__(self, prob, per_step=1):
        if per_step < 1:
            raise ValueError(f"per_step must be >= 1, got {per_step}")
        self.prob, self.per_step = prob, per_step
        self.jacobi, self.cg = (jaxgraph.Kernel(SOURCE, k) for k in ("jacobi", "cg_fused"))

    def jacobi_step(self, u, f, count, part):
        """``per_step`` sweeps, u -> u_out. count (in place) counts the sweeps; part holds the last sweep's
        per-block sums of squared updates (the next launch's test: all +inf before the first sweep), and
        ping-pongs with a scratch array like CG's p. Returns (u_out, count, part_out, flag)."""
        p, shape = self.prob, (self.prob.n, self.prob.n)
        update2, flag = jaxgraph.empty(1), jaxgraph.empty(1, np.int32)
        scratch = [jaxgraph.empty(shape) for _ in range(min(2, self.per_step - 1))]
        u_out = jaxgraph.empty(shape)
        parts = (part, jaxgraph.empty(p.blocks))
        part_out = part if self.per_step % 2 == 0 else jaxgraph.empty(p.blocks)
        for s in range(self.per_step):
            dst = u_out if s == self.per_step - 1 else scratch[s % 2]
            p_in, p_out = parts[s % 2], (part_out if s == self.per_step - 1 else parts[(s + 1) % 2])
            self.jacobi[p.blocks, THREADS](dst, p_out, flag, count, update2, u, f, p_in, p.h2, p.n, p.jacobi_tol2)
            u = dst
        return u_out, count, part_out, flag

    def jacobi_loop(self, max_sweeps, check_every=1):
        """(graphed sweeps, graphed_loop until their flag): at most ``max_sweeps`` sweeps."""
        n = self.prob.n
        graphed = jaxgraph.make_graphed_callables(
            self.jacobi_step, (np.zeros((n, n), np.float32), self.prob.f, np.zeros(1, np.int32),
                               np.full(self.prob.blocks, np.inf, np.float32)))
        steps = -(-max_sweeps // self.per_step) + 1  # + the launch that sees the last sweep converged
        return graphed, _until_loop(graphed, steps, self.jacobi_feed, check_every)

    @property
    def jacobi_feed(self):
        """The Jacobi step's ``{output: input}``: u, and the sums when an odd step leaves them in a new array."""
        return {0: 0, 2: 3} if self.per_step % 2 else {0: 0}

    def cg_step(self, x, p_dir, count, r, w, s, part, scal):
        """``per_step`` (even) pipelined CG iterations, one ``cg_fused`` kernel each; returns the inputs
        (all updated in place: r, w, s, part and scal ping-pong with scratch sets and end where they
        began) and the flag. part: [r.r | (A r).r] per block (2 x blocks), scal: [last r.r, last alpha]."""
        pb, shape = self.prob, (self.prob.n, self.prob.n)
        flag = jaxgraph.empty(1, np.int32)
        sets = ((r, w, s, part, scal), (jaxgraph.empty(shape), jaxgraph.empty(shape), jaxgraph.empty(shape),
                                         jaxgraph.empty(2 * pb.blocks), jaxgraph.empty(2)))
        for k in range(self.per_step):
            src, dst = sets[k % 2], sets[(k + 1) % 2]
            self.cg[pb.blocks, THREADS](x, p_dir, flag, count, *dst, *src, pb.n, pb.cg_tol2)
        return x, p_dir, count, r, w, s, part, scal, flag

    def cg_loop(self, max_iter, check_every=1):
        """(graphed iterations, graphed_loop until its flag): at most ``max_iter`` iterations."""
        if self.per_step % 2:
            raise ValueError(f"the CG step needs an even per_step (its arrays ping-pong), got {self.per_step}")
        z = np.zeros((self.prob.n, self.prob.n), np.float32)
        sample = (z, z, np.zeros(1, np.int32), z, z, z, np.zeros(2 * self.prob.blocks, np.float32),
                  np.zeros(2, np.float32))
        graphed = jaxgraph.make_graphed_callables(self.cg_step, sample)
        steps = -(-max_iter // self.per_step) + 1  # + the launch that sees the last iteration converged
        return graphed, _until_loop(graphed, steps, None, check_every)

    def xla_jacobi(self, max_sweeps, per_trip=1):
        """XLA launching the jacobi kernel (``Kernel.jax_call``) in a jitted lax.while_loop, ``per_trip``
        launches a trip (the loop reads the flag once a trip; a launch after convergence carries u over, so
        u and the count do not depend on ``per_trip``); f -> (u, sweeps)."""
        import jax
        import jax.numpy as jnp

        p = self.prob
        f32 = jax.ShapeDtypeStruct((p.n, p.n), jnp.float32)
        part, one = jax.ShapeDtypeStruct((p.blocks,), jnp.float32), jax.ShapeDtypeStruct((1,), jnp.float32)

        def solve(f):
            def body(state):
                u, part_in, flag, count = state
                for _ in range(per_trip):
                    u, part_in, flag, count, _ = self.jacobi.jax_call(
                        f32, part, flag, count, one, u, f, part_in, p.h2, p.n, p.jacobi_tol2, grid=p.blocks,
                        block=THREADS, inout=("flag", "count"))
                return u, part_in, flag, count

            init = (jnp.zeros((p.n, p.n), jnp.float32), jnp.full(p.blocks, jnp.inf, jnp.float32),
                    jnp.zeros(1, jnp.int32), jnp.zeros(1, jnp.int32))
            u, _, _, count = jax.lax.while_loop(lambda s: (s[2][0] == 0) & (s[3][0] < max_sweeps), body, init)
            return u, count[0]

        return jax.jit(solve)

    def xla_cg(self, max_iter, operator, per_trip=1):
        """XLA launching the cg_fused kernel (``Kernel.jax_call``) in a jitted lax.while_loop, ``per_trip``
        launches a trip (a launch after convergence does nothing); b -> (x, iterations). ``operator``: A in
        jax.numpy (for A b at the start, as ``cg_in_jit``)."""
        import jax
        import jax.numpy as jnp

        pb = self.prob
        f32 = jax.ShapeDtypeStruct((pb.n, pb.n), jnp.float32)
        part, two = jax.ShapeDtypeStruct((2 * pb.blocks,), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.float32)

        def solve(b):
            def body(state):
                x, p_dir, flag, count, *rest = state
                for _ in range(per_trip):  # x, p, flag and count in place; r, w, s and the sums into new arrays
                    x, p_dir, flag, count, *rest = self.cg.jax_call(
                        x, p_dir, flag, count, f32, f32, f32, part, two, *rest, pb.n, pb.cg_tol2, grid=pb.blocks,
                        block=THREADS, inout=("x", "p", "flag", "count"))
                return (x, p_dir, flag, count, *rest)

            zero, w = jnp.zeros_like(b), operator(b)
            sums = jnp.zeros(2 * pb.blocks, jnp.float32).at[0].set(jnp.sum(b * b)).at[pb.blocks].set(jnp.sum(w * b))
            init = (zero, zero, jnp.zeros(1, jnp.int32), jnp.zeros(1, jnp.int32), b, w, zero, sums,
                    jnp.array([jnp.inf, 1], jnp.float32))
            x, _, _, count, *_ = jax.lax.while_loop(lambda s: (s[2][0] == 0) & (s[3][0] < max_iter), body, init)
            return x, count[0]

        return jax.jit(solve)


def _until_loop(graphed, steps, feed, check_every):
    """graphed_loop until the step's flag (its last output); ``check_every`` > 1 needs the every-K stop."""
    flag = graphed.static_outputs[-1]
    if check_every == 1:
        return jaxgraph.graphed_loop(graphed, steps, feed=feed, until=flag)
    return jaxgraph.graphed_loop(graphed, steps, feed=feed, until=flag, check_every=check_every)


def has_check_every():
    """Whether this jaxgraph's graphed_loop has the every-K stop (``check_every=``)."""
    return "check_every" in inspect.signature(jaxgraph.graphed_loop).parameters


def jacobi_in_jit(loop):
    """The Jacobi device loop inside jax.jit: f -> (u, sweeps)."""
    import jax
    import jax.numpy as jnp

    blocks = loop.inputs[3].size

    def solve(f):
        part = jnp.full(blocks, jnp.inf, jnp.float32)  # "the sweep before the first" was not converged
        (u, count, _, _), _ = loop(jnp.zeros_like(f), f, jnp.zeros(1, jnp.int32), part)
        return u, count[0]

    return jax.jit(solve)


def cg_in_jit(loop, operator):
    """The CG device loop inside jax.jit: b -> (x, iterations); ``operator``: A in jax.numpy (for A b)."""
    import jax
    import jax.numpy as jnp

    blocks = loop.inputs[6].size // 2

    def solve(b):  # x = 0, p = 0, r = b, w = A b, s = 0, the sums of r.r and w.r; beta = 0 at the start
        zero, w = jnp.zeros_like(b), operator(b)
        part = jnp.zeros(2 * blocks, jnp.float32).at[0].set(jnp.sum(b * b)).at[blocks].set(jnp.sum(w * b))
        out, _ = loop(zero, zero, jnp.zeros(1, jnp.int32), b, w, zero, part, jnp.array([jnp.inf, 1], jnp.float32))
        return out[0], out[2][0]

    return jax.jit(solve)


def jacobi_eager(graphed, loop, prob):
    """The Jacobi device loop replayed from Python: () -> (u, sweeps) as device arrays."""
    u_s, f_s, count, part = graphed.static_inputs
    f_d, zero = jaxgraph.asarray(prob.f), jaxgraph.zeros((prob.n, prob.n))

    def run():
        u_s.copy_(zero)
        f_s.copy_(f_d)
        count.fill_(0)
        part.fill_(np.inf)
        loop.replay()
        return u_s, count  # after the last step the fed input holds u too

    return run


def cg_eager(graphed, loop, prob, operator):
    """The CG device loop replayed from Python: () -> (x, iterations) as device arrays; ``operator``: A
    in numpy (for A b)."""
    x, p_dir, count, r, w, s, part, scal = graphed.static_inputs
    b, w0 = prob.b.astype(np.float64), operator(prob.b)
    part0 = np.zeros(2 * prob.blocks, np.float32)
    part0[0], part0[prob.blocks] = np.sum(b * b), np.sum(w0 * b)
    init = [(dst, jaxgraph.asarray(src)) for dst, src in
            ((r, prob.b), (w, w0), (part, part0), (scal, np.array([np.inf, 1], np.float32)))]

    def run():
        for a in (x, p_dir, s, count):
            a.fill_(0)
        for dst, src in init:
            dst.copy_(src)
        loop.replay()
        return x, count

    return run


if __name__ == "__main__":  # a helper module: run, it says what it is and where the example is
    print('examples/poisson_kernels.py is a helper module of examples/poisson_solver.py (its device-loop solvers), not an example: run python examples/poisson_solver.py')
