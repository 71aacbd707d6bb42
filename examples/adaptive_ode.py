"""An adaptive ODE solver as one device loop: Dormand-Prince 5(4) with a PI step-size controller.

Run:  python examples/adaptive_ode.py                    # Lorenz-96, N = 40, 1024 and 65536, t in [0, 10]
      python examples/adaptive_ode.py --quick            # N = 40 and 1024, t in [0, 2]: seconds
      python examples/adaptive_ode.py --n 1024 --command-buffers while   # XLA_FLAGS: on, off or while

The problem is Lorenz-96, dx_i/dt = (x_{i+1} - x_{i-2}) x_{i-1} - x_i + F with
F = 8 and periodic indices, from x = F plus a fresh random perturbation of
size 0.01, solved to t_end with rtol = atol = 1e-5 in float64.

The solver is one step graphed once and run to t_end by jaxgraph.graphed_loop(
..., until=done) as ONE device loop (one launch eagerly, one FFI call in
jax.jit). Nothing returns to the host between steps. A step is ONE kernel,
tile_step (adaptive_ode.cu): up to N = 256 one block holds the whole ring;
above, a grid of small blocks, each evaluating the seven stages of its tile plus a
halo of 21 elements in shared memory (no stage waits for another block).
Every block sums its share of the squared scaled error; the last block to
finish adds the sums in a fixed order and one thread runs the controller:
accept or reject, the next step clipped to land on t_end, the stop flag.
(path="stages": six kernels a step, one per stage, the stages in global
memory: the layout a first port takes, kept for comparison.)

The controller is diffrax's PIDController (its formula (4), error order 5,
safety 0.9, factors in [0.2, 10] and <= 0.9 after a rejection, a step ending
within 100 ulp of t_end clipped to it), so the solver takes the steps of
diffeqsolve(ODETerm(f), Dopri5(), 0, t_end, dt0, y0, stepsize_controller=
PIDController(rtol, atol, pcoeff=0.4, icoeff=0.3)). reference_solve() is the
same algorithm in float64 numpy, checked against scipy by the tests.

Checks: on [0, t_end], t_end is reached exactly, eager and jit runs agree bit
for bit, and the step counts are diffrax's. Lorenz-96 is chaotic: by t = 10,
rounding grows ~1e7-fold and scipy's DOP853 at tolerances 1e-10 and 1e-12
differ by O(1), so references are compared on [0, check_t] (default 2): the
numpy model's and diffrax's steps and solution (to 1e-8), an error against
solve_ivp(method="DOP853", rtol = atol = 1e-10) no larger than diffrax's, and
at rtol = atol = 1e-10 an error 100x smaller (and under 1e-2).

The table puts the solvers side by side, each in jax.jit: diffrax; Dopri5
by hand in jax.numpy in one lax.while_loop (jnp_solver: same steps); the
same tile_step kernel through Kernel.jax_call in a lax.while_loop (what the
kernel alone buys: XLA runs the loop); and the device loop (what the graph
adds). diffrax and scipy are optional (pip install -e ".[examples]"); without
them the example says which is missing and exits 0. benchmarks/vs_diffrax.py
times it properly (interleaved rounds, one process per XLA setting, each
solver at its best of four).
"""

import argparse
import importlib.util
import os
import pathlib
import sys
import time

import numpy as np

import jaxgraph

# The kernels of a step (tile_step; the stages path: stage_first, stage x4, error_control) live beside this file.
SOURCE = (pathlib.Path(__file__).parent / "adaptive_ode.cu").read_text()

# Dormand-Prince 5(4) (diffrax's and Hairer's tableau): A rows, 5th-order weights B, error weights E.
A = [np.array(r) for r in ([], [1 / 5], [3 / 40, 9 / 40], [44 / 45, -56 / 15, 32 / 9],
                           [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729],
                           [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656],
                           [35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84])]
E = np.array([35 / 384 - 1951 / 21600, 0, 500 / 1113 - 22642 / 50085, 125 / 192 - 451 / 720,
              -2187 / 6784 + 12231 / 42400, 11 / 84 - 649 / 6300, -1 / 60])
F = 8.0
RTOL = ATOL = 1e-5
PCOEFF, ICOEFF = 0.4, 0.3          # a PI controller (diffrax's default is pcoeff=0, icoeff=1: I only)
SAFETY, FACTORMIN, FACTORMAX = 0.9, 0.2, 10.0  # diffrax's defaults
ERROR_ORDER = 5                    # diffrax's for Dopri5: min(5, 4) + 1
PATHS = ("tiled", "stages")        # one kernel a step (tile_step), or six (a kernel a stage)
BLOCK = 256                        # threads per block of the stages path
PER_THREAD = (1, 2, 4)             # tile_step's instances: elements a thread
# Geometry of the tiled step, from benchmarks/probes/ode_geometry.py (H200, us per attempted step in
# the device loop): one block 9.6 at N = 256 against 12.0 for tiles of 128 - 21; tiles of 256 x 1 as
# fast as any at N = 1000 and the fastest at 20000 (12.0 against 12.5 for 128 x 1, 13.3 for 256 x 2)
# and 65536 (12.8 against 13.5 and 13.2); one block of 1024 x 2 at N = 2000 13.4 against 12.1-12.4.
ONE_BLOCK_MAX = 256                # up to this n the tiled step is one block holding the whole ring
TILE_BLOCK, TILE_PER_THREAD = 256, 1  # above it: blocks of 256 threads, 1 element each (a tile of 235)
HALO = 21                          # the tile's halo: 14 elements on the left, 7 on the right
# st and ist slots (see SOURCE)
T_PREV, T_NEXT, INV_PREV = 0, 1, 2
ACCEPTED, INIT, N_ACCEPTED, N_REJECTED, BLOCKS_DONE, FINISHED, CUR = range(7)

COMMAND_BUFFERS = {"on": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1",
                   "off": "--xla_gpu_enable_command_buffer=",
                   "while": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE,CONDITIONAL "
                            "--xla_gpu_graph_min_graph_size=1"}


# ----------------------------------------------------------------------------
# The problem and the float64 numpy model of the device algorithm
# ----------------------------------------------------------------------------


def lorenz96(x, forcing=F):
    """dx/dt of Lorenz-96: (x[i+1] - x[i-2]) x[i-1] - x[i] + F, periodic."""
    return (np.roll(x, -1) - np.roll(x, 2)) * np.roll(x, 1) - x + forcing


def initial_state(n, rng):
    """x = F plus a fresh random perturbation of size 0.01 (float64)."""
    return F + 0.01 * rng.standard_normal(n)


def clip_time(t_end):
    """t_end minus 100 ulp: a step ending past it is clipped to t_end (as diffrax does)."""
    t = np.float64(t_end)
    for _ in range(100):
        t = np.nextafter(t, -np.inf)
    return float(t)


def check_problem(n, t_end, rtol, atol, dt0, max_steps):
    """Validate a solve's settings; errors name the value and the limit."""
    for name, v in (("n", n), ("max_steps", max_steps)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if not 4 <= n < 2**31 // 7:
        raise ValueError(f"n must be in [4, {2**31 // 7}) (Lorenz-96 couples i-2..i+1), got {n}")
    if not 1 <= max_steps < 2**31:
        raise ValueError(f"max_steps must be in [1, 2**31), got {max_steps}")
    for name, v in (("t_end", t_end), ("rtol", rtol), ("atol", atol), ("dt0", dt0)):
        if not (isinstance(v, (float, int, np.floating, np.integer)) and not isinstance(v, bool)
                and np.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {v!r}")


def reference_solve(y0, t_end, rtol=RTOL, atol=ATOL, dt0=0.01, max_steps=100_000, forcing=F):
    """The device algorithm in float64 numpy: (y at t_end, t reached, accepted steps, rejected steps).

    Same tableau, same order of the stage sums, same controller and clipping
    as the kernels; differences from the GPU are rounding only.
    """
    check_problem(len(y0), t_end, rtol, atol, dt0, max_steps)
    y = np.array(y0, np.float64)
    t_prev, t_next, inv_prev = 0.0, min(float(dt0), t_end), 1.0
    t_clip, c1, c2 = clip_time(t_end), (PCOEFF + ICOEFF) / ERROR_ORDER, -PCOEFF / ERROR_ORDER
    k1, accepted, rejected = lorenz96(y, forcing), 0, 0
    for _ in range(max_steps):
        h = t_next - t_prev
        k = [k1]
        ys = y + h * (A[1][0] * k1)             # stage 2's input
        for s in range(2, 7):                   # k_s = f(Y_s), then Y_{s+1} (Y_7 is the solution)
            k.append(lorenz96(ys, forcing))
            acc = sum((A[s][j] * k[j] for j in range(s - 1)), A[s][s - 1] * k[s - 1])  # the kernels' order
            ys = y + h * acc
        y_new = ys
        k.append(lorenz96(y_new, forcing))      # k7, first same as last
        e = sum((E[j] * k[j] for j in range(6)), E[6] * k[6])
        scaled = h * e / (atol + rtol * np.maximum(np.abs(y), np.abs(y_new)))
        err = np.sqrt(np.sum(scaled * scaled) / len(y))
        keep = err < 1.0
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            inv = 1.0 / err
            factor = SAFETY * inv ** c1 * inv_prev ** c2
        factor = FACTORMIN if np.isnan(factor) else min(max(factor, 1.0 if keep else FACTORMIN),
                                                        FACTORMAX if keep else SAFETY)
        dt = h * factor
        if inv == 0.0 or np.isinf(inv):
            inv = 1.0
        next_t0 = t_next if keep else t_prev
        t_prev, t_next = min(next_t0, t_end), next_t0 + dt
        if t_next > t_clip:
            t_next = t_end if keep else t_prev + 0.5 * (t_end - t_prev)
        if keep:
            inv_prev, y, k1, accepted = inv, y_new, k[6], accepted + 1
        else:
            rejected += 1
        if t_prev >= t_end:
            break
    return y, t_prev, accepted, rejected


def scipy_solve(y0, t_end, method="DOP853", tol=1e-10):
    """scipy.integrate.solve_ivp to a tight tolerance: the reference solution at t_end."""
    from scipy.integrate import solve_ivp

    sol = solve_ivp(lambda t, x: lorenz96(x), (0.0, t_end), y0, method=method, rtol=tol, atol=tol)
    if not sol.success:
        raise RuntimeError(f"scipy's solve_ivp failed: {sol.message}")
    return sol.y[:, -1]


# ----------------------------------------------------------------------------
# The device solver
# ----------------------------------------------------------------------------


class AdaptiveDopri5:
    """Dormand-Prince 5(4) with a PI controller for Lorenz-96 of size ``n``, as one jaxgraph device loop.

    ``path="tiled"`` (the default): a step is ONE kernel, ``tile_step``: one
    block holding the whole ring up to n = 256 (``ONE_BLOCK_MAX``), else a
    grid of blocks each evaluating the seven stages on its tile plus a halo
    in shared memory, the error norm reduced across blocks by the last one
    to finish, which also runs the controller. ``path="stages"``: six kernels
    a step over ceil(n / 256) blocks, the stages in global memory.
    ``block`` and ``per_thread`` (1, 2 or 4) set the tiled path's geometry:
    one block when ``block * per_thread >= n``.

    ``solve(y0)`` runs it eagerly (one graph launch); ``jax_solve(y0)`` is the
    same loop as a JAX function (one FFI call; wrap it in ``jax.jit``);
    ``xla_solve(y0)`` launches the same kernels through ``Kernel.jax_call``
    in a ``lax.while_loop`` (XLA's loop, no graph of jaxgraph's). All return
    ``(y at t_end, t reached, accepted steps, rejected steps)``.
    """

    def __init__(self, n, t_end=10.0, rtol=RTOL, atol=ATOL, dt0=0.01, max_steps=100_000, forcing=F, path="tiled",
                 block=None, per_thread=None):
        check_problem(n, t_end, rtol, atol, dt0, max_steps)
        self.n, self.t_end, self.dt0, self.max_steps = int(n), float(t_end), float(dt0), int(max_steps)
        if path not in PATHS:
            raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
        self.path = path
        self._consts = (float(forcing), self.n, float(rtol), float(atol), self.t_end, clip_time(self.t_end),
                        (PCOEFF + ICOEFF) / ERROR_ORDER, -PCOEFF / ERROR_ORDER, SAFETY, FACTORMIN, FACTORMAX)
        if path == "tiled":
            self.block, self.per_thread, self.blocks = tile_geometry(self.n, block, per_thread)
        elif block is not None or per_thread is not None:
            raise ValueError("block and per_thread set the tiled path's geometry; the stages path runs "
                             f"{BLOCK}-thread blocks")
        else:
            self.block, self.per_thread, self.blocks = BLOCK, 1, (self.n + BLOCK - 1) // BLOCK
        self.launches = self._plan()
        self.kernels = {name: jaxgraph.Kernel(SOURCE, name) for name in dict.fromkeys(x[0] for x in self.launches)}
        y0 = np.zeros(self.n)
        self.graphed = jaxgraph.make_graphed_callables(self.step, (y0, *self.initial_state()))
        self.y, self.st, self.ist = self.graphed.static_inputs
        self.y_out, self.y_new, self.st_out, self.ist_out, self.done = self.graphed.static_outputs
        # No feed: the step updates its state in place; done stops the loop on the device.
        self.loop = jaxgraph.graphed_loop(self.graphed, self.max_steps, until=self.done)

    def __repr__(self):
        where = (f"one block of {self.block} threads" if self.blocks == 1 else
                 f"{self.blocks} blocks of {self.block} threads") + f", {self.per_thread} element(s) a thread"
        what = "one kernel a step (tile_step)" if self.path == "tiled" else "six kernels a step (the stages)"
        return f"<AdaptiveDopri5 n={self.n}: {what}, {where}>"

    def initial_state(self):
        """(st, ist) at t = 0: the first step is [0, min(dt0, t_end)], k1 still to compute, the state in y."""
        st = np.array([0.0, min(self.dt0, self.t_end), 1.0])
        return st, np.array([0, 1, 0, 0, 0, 0, 0], np.int32)  # INIT set, CUR = 0

    def _plan(self):
        """The step's launches: (kernel name, grid, block, dynamic shared memory, arguments); a str argument
        names a buffer of the step (y, y_new, K, ya, yb, partial, st, ist, done), anything else is a scalar."""
        forcing, n, rtol, atol, t_end, t_clip, c1, c2, safety, fmin, fmax = self._consts
        control = (forcing, n, rtol, atol, t_end, t_clip, c1, c2, safety, fmin, fmax)
        g, b = self.blocks, self.block
        if self.path == "tiled":
            shared = 2 * b * self.per_thread * 8  # two stage inputs of doubles
            return [(f"tile_step<{self.per_thread}>", g, b, shared,
                     ("y", "y_new", "partial", "st", "ist", "done", *control))]
        return [("stage_first", g, b, 0, ("y", "K", "ya", "y_new", "st", "ist", forcing, n)),
                ("stage", g, b, 0, ("K", "yb", "ya", "y", "st", 3, forcing, n)),
                ("stage", g, b, 0, ("K", "ya", "yb", "y", "st", 4, forcing, n)),
                ("stage", g, b, 0, ("K", "yb", "ya", "y", "st", 5, forcing, n)),
                ("stage", g, b, 0, ("K", "y_new", "yb", "y", "st", 6, forcing, n)),
                ("error_control", g, b, 0, ("K", "partial", "st", "ist", "done", "y", "y_new", *control))]

    def _scratch(self, empty):
        """The step's buffers besides y, st and ist, from ``empty(size, dtype)``."""
        n = self.n
        bufs = {"y_new": empty(n, np.float64), "partial": empty(self.blocks, np.float64),
                "done": empty(1, np.int32)}
        if self.path == "stages":
            bufs.update(K=empty(7 * n, np.float64), ya=empty(n, np.float64), yb=empty(n, np.float64))
        return bufs

    def step(self, y, st, ist):
        """One attempted step on device arrays; y (and y_new), st and ist are updated in place."""
        bufs = dict(self._scratch(jaxgraph.empty), y=y, st=st, ist=ist)
        for name, grid, block, shared, args in self.launches:
            self.kernels[name][grid, block, shared](*(bufs[a] if isinstance(a, str) else a for a in args))
        return y, bufs["y_new"], st, ist, bufs["done"]

    def result(self, y, y_new, st, ist):
        """(y at t reached, t, accepted, rejected) from the step's buffers (numpy or JAX arrays)."""
        if self.path == "tiled":  # the state is the buffer ist[CUR] names
            pick = ist[CUR] != 0
        else:  # the last accepted step is committed by the next step's first kernel: y_new until then
            pick = ist[ACCEPTED] != 0
        if isinstance(y, np.ndarray):
            return (y_new if pick else y), float(st[T_PREV]), int(ist[N_ACCEPTED]), int(ist[N_REJECTED])
        import jax.numpy as jnp

        return jnp.where(pick, y_new, y), st[T_PREV], ist[N_ACCEPTED], ist[N_REJECTED]

    def solve(self, y0):
        """Eager: write the initial state, one launch of the loop; returns (y, t, accepted, rejected)."""
        st, ist = self.initial_state()
        self.y.copy_(jaxgraph.asarray(np.asarray(y0, np.float64)))
        self.st.copy_(jaxgraph.asarray(st))
        self.ist.copy_(jaxgraph.asarray(ist))
        self.loop.replay()
        return self.result(self.y.numpy(), self.y_new.numpy(), self.st.numpy(), self.ist.numpy())

    def jax_solve(self, y0):
        """The loop as a JAX function of y0 (one FFI call): (y, t, accepted, rejected); needs jax_enable_x64."""
        import jax.numpy as jnp

        st, ist = self.initial_state()
        (y, y_new, st, ist, _), _ = self.loop(y0, jnp.asarray(st), jnp.asarray(ist))
        return self.result(y, y_new, st, ist)

    def xla_solve(self, y0):
        """The same kernels through ``Kernel.jax_call`` in a ``lax.while_loop`` that stops on the same flag.

        What a JAX user gets from the kernels alone, without jaxgraph's graphs:
        XLA runs the loop (with ``WHILE`` command buffers, as a CUDA graph of
        its own). Same kernels, same launches, same result bit for bit as
        :meth:`jax_solve`; needs jax_enable_x64.
        """
        import jax
        import jax.numpy as jnp

        st, ist = self.initial_state()
        names = ("y", "st", "ist", *self._scratch(lambda size, dtype: None))
        y0 = jnp.asarray(y0, jnp.float64)
        start = dict(y=y0, st=jnp.asarray(st), ist=jnp.asarray(ist),
                     **self._scratch(lambda size, dtype: jnp.zeros(size, dtype)))

        def body(carry):
            bufs = dict(zip(names, carry))
            for name, grid, block, shared, args in self.launches:
                kernel = self.kernels[name]
                written = [(p.name, a) for p, a in zip(kernel.params, args)
                           if p.is_pointer and not p.is_const_pointer]
                out = kernel.jax_call(*(bufs[a] if isinstance(a, str) else a for a in args), grid=grid,
                                      block=block, shared_mem=shared, inout=[p for p, _ in written])
                out = out if isinstance(out, tuple) else (out,)
                bufs.update((a, o) for (_, a), o in zip(written, out))
            return tuple(bufs[k] for k in names)

        def more(carry):
            ist = carry[2]
            return (ist[FINISHED] == 0) & (ist[N_ACCEPTED] + ist[N_REJECTED] < self.max_steps)

        out = dict(zip(names, jax.lax.while_loop(more, body, tuple(start[k] for k in names))))
        return self.result(out["y"], out["y_new"], out["st"], out["ist"])


def tile_geometry(n, block=None, per_thread=None):
    """(threads a block, elements a thread, blocks) of the tiled path for size ``n``.

    Up to ``ONE_BLOCK_MAX`` one block holds the whole ring (the fewest elements
    a thread that fit, threads rounded up to a warp); above, blocks of
    ``TILE_BLOCK`` threads and ``TILE_PER_THREAD`` elements a thread, each
    owning a tile of that many elements less the halo (21).
    """
    for name, v in (("block", block), ("per_thread", per_thread)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if per_thread is not None and per_thread not in PER_THREAD:
        raise ValueError(f"per_thread must be one of {PER_THREAD} (the kernel's instances), got {per_thread}")
    if block is not None and not (32 <= block <= 1024 and block % 32 == 0):
        raise ValueError(f"block must be a multiple of 32 in [32, 1024], got {block}")
    if block is None and per_thread is None and n > ONE_BLOCK_MAX:
        block, per_thread = TILE_BLOCK, TILE_PER_THREAD
    if per_thread is None:  # the fewest elements a thread that fit n into one block (of `block` threads)
        per_thread = next((m for m in PER_THREAD if (block or 1024) * m >= n), PER_THREAD[-1])
    if block is None:
        threads = -(-n // per_thread)
        block = min(1024, max(32, -(-threads // 32) * 32))
    width = block * per_thread
    if width >= n:
        return int(block), int(per_thread), 1
    if width <= HALO:
        raise ValueError(f"block * per_thread must exceed the halo ({HALO}) to tile n = {n}, got {width}")
    return int(block), int(per_thread), -(-n // (width - HALO))


# ----------------------------------------------------------------------------
# diffrax, the library a JAX user calls
# ----------------------------------------------------------------------------


def diffrax_solver(rtol=RTOL, atol=ATOL, dt0=0.01, max_steps=100_000, forcing=F):
    """jax.jit((y0, t_end) -> (y at t_end, t, accepted, rejected)) of diffrax's Dopri5 + PIDController.

    The code a JAX user writes: the same tolerances, controller coefficients
    and first step as :class:`AdaptiveDopri5`; float64 when ``jax_enable_x64`` is on.
    """
    import diffrax
    import jax
    import jax.numpy as jnp

    def f(t, x, args):
        return (jnp.roll(x, -1) - jnp.roll(x, 2)) * jnp.roll(x, 1) - x + forcing

    controller = diffrax.PIDController(rtol=rtol, atol=atol, pcoeff=PCOEFF, icoeff=ICOEFF)

    @jax.jit
    def solve(y0, t_end):
        sol = diffrax.diffeqsolve(diffrax.ODETerm(f), diffrax.Dopri5(), 0.0, t_end, dt0, y0,
                                  stepsize_controller=controller, max_steps=max_steps,
                                  saveat=diffrax.SaveAt(t1=True))
        return sol.ys[-1], sol.ts[-1], sol.stats["num_accepted_steps"], sol.stats["num_rejected_steps"]

    return solve


def jnp_solver(rtol=RTOL, atol=ATOL, dt0=0.01, max_steps=100_000, forcing=F):
    """jax.jit((y0, t_end) -> (y at t_end, t, accepted, rejected)): Dopri5 by hand in ``jax.numpy``.

    The solver a JAX user could write instead of calling diffrax: the same
    tableau and controller as diffrax's PIDController (and
    :func:`reference_solve`), every attempted step one trip of ONE
    ``lax.while_loop`` (XLA fuses each stage; no host round trip). It takes
    diffrax's steps (the tests and benchmarks/vs_diffrax.py check the counts).
    """
    import jax
    import jax.numpy as jnp

    c1, c2 = (PCOEFF + ICOEFF) / ERROR_ORDER, -PCOEFF / ERROR_ORDER

    def f(x):
        return (jnp.roll(x, -1) - jnp.roll(x, 2)) * jnp.roll(x, 1) - x + forcing

    @jax.jit
    def solve(y0, t_end):
        y0 = jnp.asarray(y0, jnp.float64)
        t_end = jnp.asarray(t_end, jnp.float64)
        t_clip = jax.lax.fori_loop(0, 100, lambda _, t: jnp.nextafter(t, -jnp.inf), t_end)  # clip_time

        def step(carry):
            y, k1, t_prev, t_next, inv_prev, accepted, rejected = carry
            h = t_next - t_prev
            k = [k1]
            ys = y + h * (A[1][0] * k1)
            for s in range(2, 7):
                k.append(f(ys))
                acc = A[s][s - 1] * k[s - 1]
                for j in range(s - 1):
                    acc = acc + A[s][j] * k[j]
                ys = y + h * acc
            y_new = ys
            k.append(f(y_new))
            e = E[6] * k[6]
            for j in range(6):
                e = e + E[j] * k[j]
            scaled = h * e / (atol + rtol * jnp.maximum(jnp.abs(y), jnp.abs(y_new)))
            err = jnp.sqrt(jnp.sum(scaled * scaled) / y.size)
            keep = err < 1.0
            inv = 1.0 / err
            factor = SAFETY * inv ** c1 * inv_prev ** c2
            factor = jnp.where(jnp.isnan(factor), FACTORMIN,
                               jnp.minimum(jnp.maximum(factor, jnp.where(keep, 1.0, FACTORMIN)),
                                           jnp.where(keep, FACTORMAX, SAFETY)))
            inv = jnp.where((inv == 0.0) | jnp.isinf(inv), 1.0, inv)
            next_t0 = jnp.where(keep, t_next, t_prev)
            t_prev = jnp.minimum(next_t0, t_end)
            t_next = next_t0 + h * factor
            t_next = jnp.where(t_next > t_clip, jnp.where(keep, t_end, t_prev + 0.5 * (t_end - t_prev)), t_next)
            return (jnp.where(keep, y_new, y), jnp.where(keep, k[6], k1), t_prev, t_next,
                    jnp.where(keep, inv, inv_prev), accepted + keep, rejected + (~keep))

        def more(carry):
            return (carry[2] < t_end) & (carry[5] + carry[6] < max_steps)

        zero = jnp.int32(0)
        start = (y0, f(y0), jnp.float64(0.0), jnp.minimum(jnp.float64(dt0), t_end), jnp.float64(1.0), zero, zero)
        y, _, t, _, _, accepted, rejected = jax.lax.while_loop(more, step, start)
        return y, t, accepted, rejected

    return solve


def timed(run, repeats):
    """Run once (compiles, warms up), then the median seconds of ``repeats`` runs and the last result."""
    out, times = run(), []
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    return out, float(np.median(times))


def check_size(n, t_end, check_t, settings, dfx_solve, repeats, rng):
    """Solve, check and time one size; prints what it checked. Returns the row of the table."""
    import jax
    import jax.numpy as jnp

    y0 = initial_state(n, rng)
    y0_j, same = jnp.asarray(y0), lambda a, b: float(np.abs(a - b).max())
    ode = AdaptiveDopri5(n, t_end, **settings)
    print(f"\nN = {n}: {ode!r}, graphed and looped", flush=True)
    solve_jit, xla_jit = jax.jit(ode.jax_solve), jax.jit(ode.xla_solve)
    jnp_solve = jnp_solver(**settings)
    host = lambda r: (np.asarray(r[0]), float(r[1]), int(r[2]), int(r[3]))  # noqa: E731
    eager, eager_s = timed(lambda: ode.solve(y0), repeats)
    in_jit, jit_s = timed(lambda: jax.block_until_ready(solve_jit(y0_j)), repeats)
    xla, xla_s = timed(lambda: jax.block_until_ready(xla_jit(y0_j)), repeats)
    mine, jnp_s = timed(lambda: jax.block_until_ready(jnp_solve(y0_j, t_end)), repeats)
    dfx, dfx_s = timed(lambda: jax.block_until_ready(dfx_solve(y0_j, t_end)), repeats)
    in_jit, xla, mine, dfx = (host(r) for r in (in_jit, xla, mine, dfx))
    # Same kernels, fixed-order reductions: eager, jit and XLA's loop are the same run, bit for bit.
    if eager[1] != t_end or in_jit[1] != t_end:
        raise AssertionError(f"N = {n}: stopped at t = {eager[1]!r} (eager), {in_jit[1]!r} (jit), not {t_end!r}")
    for name, other in (("jit", in_jit), ("jax_call in while_loop", xla)):
        if eager[1:] != other[1:] or not np.array_equal(eager[0], other[0]):
            raise AssertionError(f"N = {n}: eager and {name} runs differ: steps {eager[2:]} vs {other[2:]}")
    for name, other in (("diffrax", dfx), ("jnp Dopri5", mine)):
        off = abs(eager[2] - other[2]) + abs(eager[3] - other[3])
        if off > max(2, (other[2] + other[3]) // 100):  # rounding, amplified by chaos, may flip a marginal decision
            raise AssertionError(f"N = {n}: jaxgraph took {eager[2]} / {eager[3]} steps, {name} {other[2]} / {other[3]}")
    print(f"  [0, {t_end:g}]: t_end reached exactly; steps accepted / rejected: jaxgraph {eager[2]} / {eager[3]} "
          f"(eager, in jit and through jax_call, bit for bit the same), diffrax {dfx[2]} / {dfx[3]}, jnp Dopri5 "
          f"{mine[2]} / {mine[3]}; max |jaxgraph - diffrax| {same(eager[0], dfx[0]):.1e}", flush=True)

    # Against the numpy model and scipy, on [0, check_t] where scipy's answer is sharp.
    short = AdaptiveDopri5(n, check_t, **settings).solve(y0)
    model = reference_solve(y0, check_t, **settings)
    d_short = dfx_solve(y0_j, check_t)
    d_short = (np.asarray(d_short[0]), int(d_short[2]), int(d_short[3]))
    if short[2:] != model[2:] or short[1] != check_t:
        raise AssertionError(f"N = {n}: {short[2:]} steps to t = {short[1]!r}, the numpy model {model[2:]}")
    scale = 1 + np.abs(model[0]).max()
    np.testing.assert_allclose(short[0], model[0], rtol=0, atol=1e-8 * scale, err_msg=f"N = {n} vs numpy model")
    np.testing.assert_allclose(short[0], d_short[0], rtol=0, atol=1e-8 * scale, err_msg=f"N = {n} vs diffrax")
    ref = scipy_solve(y0, check_t)
    err, d_err = same(short[0], ref), same(d_short[0], ref)
    if err > 1.5 * d_err + 1e-9:  # the same algorithm: as far from scipy as diffrax, no further
        raise AssertionError(f"N = {n}: jaxgraph is {err:.2e} from scipy at t = {check_t}, diffrax {d_err:.2e}")
    tight = AdaptiveDopri5(n, check_t, **dict(settings, rtol=1e-10, atol=1e-10)).solve(y0)
    t_err = same(tight[0], ref)
    if t_err > min(1e-2, 0.01 * err):  # tighter tolerances must land much closer (the line below prints both)
        raise AssertionError(f"N = {n}: at rtol = atol = 1e-10 jaxgraph is {t_err:.2e} from scipy at t = {check_t}, "
                             f"at 1e-5 {err:.2e}")
    print(f"  [0, {check_t:g}]: matches the numpy model ({model[2]} / {model[3]} steps, max diff "
          f"{same(short[0], model[0]):.1e}) and diffrax ({d_short[1]} / {d_short[2]} steps, max diff "
          f"{same(short[0], d_short[0]):.1e}); max |y - scipy DOP853 at 1e-10|: jaxgraph {err:.1e}, diffrax "
          f"{d_err:.1e}; with rtol = atol = 1e-10 jaxgraph {t_err:.1e} ({tight[2]} / {tight[3]} steps)", flush=True)
    return n, dfx_s, jnp_s, xla_s, jit_s, eager_s, eager[2] + eager[3], repr(ode.loop)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", default=None, help="comma-separated sizes N (default 40,1024,65536; --quick: 40,1024)")
    p.add_argument("--t-end", type=float, default=None, help="integrate over [0, t_end] (default 10; --quick: 2)")
    p.add_argument("--rtol", type=float, default=RTOL, help=f"relative tolerance (default {RTOL})")
    p.add_argument("--atol", type=float, default=ATOL, help=f"absolute tolerance (default {ATOL})")
    p.add_argument("--dt0", type=float, default=0.01, help="first step size tried (default 0.01)")
    p.add_argument("--max-steps", type=int, default=4096,
                   help="give up after this many attempted steps (default 4096, diffrax's default)")
    p.add_argument("--check-t", type=float, default=2.0,
                   help="horizon of the checks against scipy (default 2: see above why not t_end)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per solver (median; default 5)")
    p.add_argument("--quick", action="store_true", help="N = 40, 1024 on [0, 2]: seconds, for tests")
    p.add_argument("--command-buffers", choices=("default", "on", "off", "while"), default="default",
                   help="XLA's command buffers: JAX's defaults, forced on or off, or on with WHILE,CONDITIONAL "
                        "(sets XLA_FLAGS)")
    args = p.parse_args(argv)
    sizes = [int(s) for s in (args.n or ("40,1024" if args.quick else "40,1024,65536")).split(",")]
    t_end = args.t_end if args.t_end is not None else (2.0 if args.quick else 10.0)
    for n in sizes:
        check_problem(n, t_end, args.rtol, args.atol, args.dt0, args.max_steps)
    if jaxgraph.device_count() == 0:
        print("a CUDA GPU is needed to run the solver: none found, so this example stops here")
        return 0
    missing = [m for m in ("diffrax", "scipy") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"this example compares against {' and '.join(missing)}, which is not installed: "
              f'pip install -e ".[examples]" (or pip install {" ".join(missing)}); stopping here')
        return 0
    if args.command_buffers != "default":
        os.environ["XLA_FLAGS"] = COMMAND_BUFFERS[args.command_buffers]
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng()
    settings = dict(rtol=args.rtol, atol=args.atol, dt0=args.dt0, max_steps=args.max_steps)
    flags = os.environ.get("XLA_FLAGS") or "unset: JAX's default command buffers"
    print(f"Lorenz-96, F = {F}, t in [0, {t_end}], rtol {args.rtol}, atol {args.atol}, dt0 {args.dt0}; "
          f"XLA_FLAGS {flags}", flush=True)
    rows = []
    dfx_solve = diffrax_solver(**settings)
    check_t = min(args.check_t, t_end)
    for n in sizes:
        rows.append(check_size(n, t_end, check_t, settings, dfx_solve, args.repeats, rng))
    # diffrax first: the call a JAX user makes instead; then what the kernel buys, then what the graph adds.
    print(f"\n{'N':>6}  {'diffrax':>8}  {'jnp Dopri5':>10}  {'kernel via jax_call':>19}  {'jaxgraph':>8}  "
          f"{'eager':>8}  {'us/step':>7}  {'vs diffrax':>10}  {'vs jnp':>6}  {'vs same kernel':>14}")
    for n, d, m, x, j, e, steps, _ in rows:
        print(f"{n:>6}  {d * 1e3:8.2f}  {m * 1e3:10.2f}  {x * 1e3:19.2f}  {j * 1e3:8.2f}  {e * 1e3:8.2f}  "
              f"{j / steps * 1e6:7.1f}  {d / j:9.1f}x  {m / j:5.1f}x  {x / j:13.2f}x")
    print(f"\n(ms per solve in jax.jit, eager: numpy in and out; medians of {args.repeats} single runs under this "
          "process's XLA flags; benchmarks/vs_diffrax.py runs the comparison properly, each at its best setting)")
    print(rows[-1][-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
