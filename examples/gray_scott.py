"""Gray-Scott reaction-diffusion: idiomatic JAX against the same model as CUDA kernels in one device loop.

Run:  python examples/gray_scott.py                  # 256 x 256 grid, 100 steps of 10 substeps
      python examples/gray_scott.py --quick          # a 48 x 48 grid, 5 steps of 3 substeps: seconds
      python examples/gray_scott.py --grid 1024 --per-launch 5 --tile 32 --threads 16   # shared-memory tiles
      python examples/gray_scott.py --command-buffers off   # XLA's command buffers off (or: on, while)

Two chemicals u and v react and diffuse on a periodic grid. A step is
`substeps` explicit Euler substeps (5-point Laplacian plus the reaction
u + 2v -> 3v), then the total of v is recorded: `steps` steps give the state
and a time series of the total. The same fresh random initial state is run
these ways, and every result is checked against numpy:

  1. idiomatic JAX: the model in jax.numpy (`jnp.roll` stencil) in a jitted
     lax.fori_loop, the program a JAX user writes. XLA fuses a substep into
     one kernel; it cannot fuse several substeps (each needs its
     neighbours' previous values).
  2. XLA launching this file's CUDA kernels (Kernel.jax_call) in the same
     jitted fori_loop: the fused kernel, then the temporally blocked one.
  3. jaxgraph: the step (kernels below) captured once and run as a device
     loop (jaxgraph.graphed_loop: every step in one CUDA graph, one launch),
     eagerly and inside jax.jit (one FFI call). A step runs one of:
     - `fused`: one substep per launch, the Laplacian and the reaction in
       one kernel, as XLA's fusion does (substeps kernels a step);
     - a temporally blocked kernel, `--per-launch` substeps per launch
       (ceil(substeps / per_launch) kernels a step: one or two by default). Each
       block reads its tile plus a halo as wide as the substeps it runs,
       advances them on chip (recomputing the halo its neighbours also
       compute) and writes the tile once: XLA cannot do this.
       `columns` (the default) holds the region in registers, a lane per
       column and a warp per strip of rows: west and east neighbours come
       by warp shuffles, only the rows between strips through shared
       memory (the region at most 32 wide). `blocked` (`--threads`) holds
       it in shared memory, any width up to 48 KiB.
     The step's last kernel also records the total of v: each block stores
     its sum, and the last block to finish adds them in a fixed order and
     stores the total at masses[count] (count += 1), so the loop keeps the
     time series on the device with no extra kernel.

The periodic boundaries are the same everywhere (a wrapped index, a roll).
The table leads with idiomatic JAX, then XLA on this file's kernels, then
jaxgraph; `benchmarks/vs_idiomatic.py` times them properly (interleaved
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

DU, DV, FEED, KILL, DT = 0.16, 0.08, 0.035, 0.065, 1.0  # spots, in grid units
COMMAND_BUFFERS = {"on": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1",
                   "off": "--xla_gpu_enable_command_buffer=",
                   "while": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE,CONDITIONAL "
                            "--xla_gpu_graph_min_graph_size=1"}


def _f32(x):
    """A float32 constant as a CUDA literal (the value numpy's float32 arithmetic uses)."""
    return f"{float(np.float32(x))!r}f"


# The model's constants are baked in: the same float32 values as numpy's reference.
MODEL = f"""
#define DU {_f32(DU)}
#define DV {_f32(DV)}
#define FEED {_f32(FEED)}
#define FEED_KILL {_f32(FEED + KILL)}
#define DT {_f32(DT)}
"""

# The kernels: examples/gray_scott.cu (the model's constants, TILE and HALO are prepended).
CUDA_SOURCE = (pathlib.Path(__file__).parent / "gray_scott.cu").read_text()


def default_blocking(nx, substeps):
    """``(per_launch, tile, threads, warps)`` for the step's temporally blocked kernel: the fastest of the
    15 candidates timed by ``benchmarks/probes/gray_scott_tiles.py`` (100 steps of 10 substeps, eager device
    loop, one run, median (min-max) of 5 rounds; ``benchmarks/results/nvidia-h100-80gb-hbm3-gray-scott-tiles.md``,
    H100, 2026-11-27), all the ``columns`` kernel. Per step, where idiomatic JAX takes 20.3, 16.3 and 56.9 us
    at grids 64, 256 and 1024 (``jnp`` at its best setting in ``nvidia-h100-80gb-hbm3-vs-idiomatic.md``):
    10 substeps a launch in 12 x 12 tiles on 32 x 8 threads at 64, 4.98 (4.97-4.99) us (used up to grid 128);
    5 in 22 x 22 tiles on 32 x 8 at 256, 8.13 (8.06-8.15) (used up to 512); on 32 x 4 at 1024, 35.02
    (34.94-35.18). The shared-memory ``blocked`` kernel's best took 6.64, 10.19 and 45.95 us there."""
    per_launch, tile, warps = (min(substeps, 10), 12, 8) if nx <= 128 else (min(substeps, 5), 22, 8 if nx <= 512 else 4)
    return per_launch, tile, 16, (None if per_launch == 1 else warps)  # one substep a launch: the fused kernel


def kernel_source(tile, per_launch, threads, warps=None, cuda_source=None):
    """gray_scott.cu (or ``cuda_source``) with the model's constants and a kernel's compile-time sizes."""
    return (MODEL + f"#define TILE {tile}\n#define HALO {per_launch}\n#define TS {threads}\n#define WARPS {warps or 8}\n"
            + (CUDA_SOURCE if cuda_source is None else cuda_source))


def blocked_shared_bytes(tile, per_launch, threads):
    """The blocked kernel's static shared memory: four tiles of (tile + 2 per_launch) rows at gray_scott.cu's
    pitch ``P``, plus 1 KiB for the block sums."""
    w = tile + 2 * per_launch
    pitch = w if threads >= 32 else w + (threads - w) % (2 * threads)
    return 16 * w * pitch + 1024


def check_tiling(substeps, per_launch, tile, threads, warps=None):
    """Raise ``ValueError`` naming the value and the limit when ``CudaGrayScott`` could not build this tiling."""
    if not 1 <= per_launch <= substeps:
        raise ValueError(f"per_launch must be in [1, substeps={substeps}], got {per_launch}")
    if tile < 1:
        raise ValueError(f"tile must be >= 1, got {tile}")
    if threads not in (8, 16, 32):
        raise ValueError(f"threads (a block's side) must be 8, 16 or 32, got {threads}")
    if warps is not None:
        if per_launch == 1:
            raise ValueError("warps selects the columns kernel, which runs several substeps a launch: "
                             f"per_launch must be > 1, got {per_launch}")
        if not 1 <= warps <= 32:
            raise ValueError(f"warps must be in [1, 32] (a block of 32 x warps threads), got {warps}")
        if tile + 2 * per_launch > 32:
            raise ValueError(f"the columns kernel needs tile + 2 per_launch <= 32 (a lane per column), got "
                             f"tile {tile} + 2 x {per_launch} = {tile + 2 * per_launch}")
    elif per_launch > 1 and blocked_shared_bytes(tile, per_launch, threads) > 48 * 1024:
        raise ValueError(f"tile {tile} with a halo of {per_launch} on {threads} x {threads} threads needs "
                         f"{blocked_shared_bytes(tile, per_launch, threads)} bytes of shared memory, over 48 KiB")


class CudaGrayScott:
    """The CUDA programmer's step on an ``nx`` x ``nx`` grid: ``substeps`` substeps, ``per_launch`` at a time.

    ``per_launch=1`` runs the ``fused`` kernel once per substep (16 x 16
    threads). More runs a temporally blocked kernel compiled for a halo of
    ``per_launch`` points around tiles of ``tile`` x ``tile``:

    - ``blocked`` (``warps=None``): the tile and its halo in shared memory
      (``blocked_shared_bytes``, at most 48 KiB) on ``threads`` x ``threads``
      threads (8, 16 or 32);
    - ``columns`` (``warps`` given): a lane per column of the region and a warp
      per strip of its rows, the state in registers, on 32 x ``warps`` threads;
      the region, ``tile + 2 per_launch``, at most 32 wide.

    The step's last kernel records the total of v at masses[count]
    (``steps``: the length of that time series).
    """

    def __init__(self, nx, substeps, per_launch, steps, tile=16, threads=16, warps=None, cuda_source=None):
        check_tiling(substeps, per_launch, tile, threads, warps)
        threads = 16 if per_launch == 1 else threads
        self.nx, self.substeps, self.per_launch, self.steps, self.tile = nx, substeps, per_launch, steps, tile
        self.threads, self.warps = threads, warps
        self.kernel = jaxgraph.Kernel(kernel_source(tile, per_launch, threads, warps, cuda_source),
                                      "fused" if per_launch == 1 else "blocked" if warps is None else "columns")
        side = 16 if per_launch == 1 else tile
        self.grid = ((nx + side - 1) // side,) * 2
        self.block = (threads, threads) if warps is None else (32, warps)
        self.blocks = self.grid[0] * self.grid[1]
        full, rest = divmod(substeps, per_launch)
        self.runs = [per_launch] * full + ([rest] if rest else [])  # substeps of each launch
        self.arrived = jaxgraph.zeros(1, np.uint32)  # the recording block leaves it at 0

    @property
    def name(self):
        if self.per_launch == 1:
            return "fused"
        if self.warps is None:
            return f"blocked x{self.per_launch} ({self.tile}x{self.tile} tiles, {self.threads}x{self.threads} threads)"
        return f"columns x{self.per_launch} ({self.tile}x{self.tile} tiles, 32x{self.warps} threads)"

    def _scalars(self, j, t):
        last = int(j == len(self.runs) - 1)
        return (self.nx, self.steps, last) if self.per_launch == 1 else (self.nx, self.steps, last, t)

    def step(self, u, v, masses, count):
        """Device arrays -> (u, v after one step, masses, count): masses[count] = total of v, count += 1.

        u and v move into new arrays (the loop's feed swaps them with the
        inputs: no copies); masses and count are updated in place.
        """
        shape = (self.nx, self.nx)
        scratch = [(jaxgraph.empty(shape), jaxgraph.empty(shape)) for _ in range(min(2, len(self.runs) - 1))]
        out, partial = (jaxgraph.empty(shape), jaxgraph.empty(shape)), jaxgraph.empty(self.blocks)
        src = (u, v)
        for j, t in enumerate(self.runs):
            dst = out if j == len(self.runs) - 1 else scratch[j % 2]
            self.kernel[self.grid, self.block](*dst, partial, self.arrived, masses, count, *src, *self._scalars(j, t))
            src = dst
        return out[0], out[1], masses, count

    def xla_step(self, u, v, masses, count, arrived):
        """The same kernels on JAX arrays, one XLA custom call each (``Kernel.jax_call``)."""
        import jax
        import jax.numpy as jnp

        f32 = jax.ShapeDtypeStruct(u.shape, jnp.float32)
        part = jax.ShapeDtypeStruct((self.blocks,), jnp.float32)
        for j, t in enumerate(self.runs):
            u, v, _, arrived, masses, count = self.kernel.jax_call(
                f32, f32, part, arrived, masses, count, u, v, *self._scalars(j, t), grid=self.grid, block=self.block,
                inout=("arrived", "masses", "count"))
        return u, v, masses, count, arrived

    def device_loop(self):
        """``(graphed step, graphed_loop)``: every step in one CUDA graph, u and v fed back."""
        nx, steps = self.nx, self.steps
        sample = (np.zeros((nx, nx), np.float32),) * 2 + (np.zeros(steps, np.float32), np.zeros(1, np.int32))
        graphed = jaxgraph.make_graphed_callables(self.step, sample)
        return graphed, jaxgraph.graphed_loop(graphed, steps, feed={0: 0, 1: 1})


def jnp_simulation(steps, substeps):
    """Idiomatic JAX: the model in ``jax.numpy`` in a jitted ``lax.fori_loop``; (u, v) -> (u, v, totals)."""
    import jax
    import jax.numpy as jnp

    def laplacian(a):
        return jnp.roll(a, 1, 1) + jnp.roll(a, -1, 1) + jnp.roll(a, 1, 0) + jnp.roll(a, -1, 0) - 4 * a

    def substep(u, v):
        uvv = u * v * v
        return (u + DT * (DU * laplacian(u) - uvv + FEED * (1 - u)),
                v + DT * (DV * laplacian(v) + uvv - (FEED + KILL) * v))

    def body(i, carry):
        u, v, masses = carry
        for _ in range(substeps):
            u, v = substep(u, v)
        return u, v, masses.at[i].set(jnp.sum(v))

    return jax.jit(lambda u, v: jax.lax.fori_loop(0, steps, body, (u, v, jnp.zeros(steps, jnp.float32))))


def xla_simulation(model):
    """``model.xla_step`` in the same jitted fori_loop: XLA launches this file's kernels."""
    import jax
    import jax.numpy as jnp

    def run(u, v):
        carry = (u, v, jnp.zeros(model.steps, jnp.float32), jnp.zeros(1, jnp.int32), jnp.zeros(1, jnp.uint32))
        return jax.lax.fori_loop(0, model.steps, lambda i, c: model.xla_step(*c), carry)[:3]

    return jax.jit(run)


def loop_in_jit(loop):
    """The device loop inside ``jax.jit``, one FFI call: (u, v) -> (u, v, totals)."""
    import jax
    import jax.numpy as jnp

    steps = loop.steps

    def run(u, v):
        out = loop(u, v, jnp.zeros(steps, jnp.float32), jnp.zeros(1, jnp.int32))
        return out[:3]

    return jax.jit(run)


def loop_eager(graphed, loop, u0, v0):
    """The device loop replayed from Python: returns a function () -> (u, v, totals) as device arrays."""
    u_s, v_s, masses, count = graphed.static_inputs
    u_d, v_d = jaxgraph.asarray(u0), jaxgraph.asarray(v0)

    def run():
        u_s.copy_(u_d)  # the initial state into the step's inputs (device copies, no host sync)
        v_s.copy_(v_d)
        count.fill_(0)
        loop.replay()
        return u_s, v_s, masses  # after the last step the fed inputs hold the state too

    return run


def reference(u, v, steps, substeps):
    """numpy, in float32: the state after ``steps`` steps and the total of v after each."""
    f = np.float32
    masses = []
    for _ in range(steps):
        for _ in range(substeps):
            lu = np.roll(u, 1, 1) + np.roll(u, -1, 1) + np.roll(u, 1, 0) + np.roll(u, -1, 0) - f(4) * u
            lv = np.roll(v, 1, 1) + np.roll(v, -1, 1) + np.roll(v, 1, 0) + np.roll(v, -1, 0) - f(4) * v
            uvv = u * v * v
            u, v = (u + f(DT) * (f(DU) * lu - uvv + f(FEED) * (f(1) - u)),
                    v + f(DT) * (f(DV) * lv + uvv - f(FEED + KILL) * v))
        masses.append(v.sum(dtype=np.float64))
    return u, v, np.array(masses)


def initial_state(nx, rng):
    """u = 1, v = 0 with a seeded square in the middle, plus fresh noise everywhere."""
    u, v = np.ones((nx, nx), np.float32), np.zeros((nx, nx), np.float32)
    a, b = nx // 2 - nx // 10, nx // 2 + nx // 10
    u[a:b, a:b], v[a:b, a:b] = 0.5, 0.25
    u += 0.02 * rng.random((nx, nx), np.float32)
    v += 0.02 * rng.random((nx, nx), np.float32)
    return u, v


def check(name, got, want):
    """Assert (u, v, totals) match numpy's within float32 tolerance; return the largest difference in v."""
    u, v, m = (np.asarray(a.numpy() if isinstance(a, jaxgraph.DeviceArray) else a) for a in got)
    np.testing.assert_allclose(u, want[0], rtol=0, atol=1e-4, err_msg=name)
    np.testing.assert_allclose(v, want[1], rtol=0, atol=1e-4, err_msg=name)
    # A total adds up n^2 values, each within float32 rounding of numpy's: 1e-3 of it, or 1e-6 a point
    np.testing.assert_allclose(m, want[2], rtol=1e-3, atol=1e-6 * v.size, err_msg=name)
    return float(np.abs(v - want[1]).max())


def timed(run, repeats=5):
    """Run once (compiles, warms up), then ``repeats`` more, each until its work is done.

    Returns ``(the last run's results on the host, median seconds)``. A quick
    look only: benchmarks/vs_idiomatic.py times these properly.
    """
    import jax

    jax.block_until_ready(run())
    times = []
    for _ in range(repeats):
        jaxgraph.synchronize()
        start = time.perf_counter()
        out = jax.block_until_ready(run())
        jaxgraph.synchronize()
        times.append(time.perf_counter() - start)
    return tuple(np.asarray(a.numpy() if isinstance(a, jaxgraph.DeviceArray) else a) for a in out), \
        float(np.median(times))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", type=int, default=256, help="grid side (default 256)")
    p.add_argument("--steps", type=int, default=100, help="steps: totals recorded (default 100)")
    p.add_argument("--substeps", type=int, default=10, help="substeps per step (default 10)")
    p.add_argument("--per-launch", type=int, default=None,
                   help="substeps per launch of the blocked kernels (default: default_blocking's, 10 up to grid 128, "
                        "else 5)")
    p.add_argument("--tile", type=int, default=None,
                   help="the blocked kernels' tile side (default: default_blocking's, 12 up to grid 128, else 22)")
    p.add_argument("--threads", type=int, default=None, choices=(8, 16, 32),
                   help="run the blocked kernel (shared-memory tiles) on THREADS x THREADS threads, not the "
                        "columns kernel")
    p.add_argument("--warps", type=int, default=None,
                   help="the columns kernel's warps (a block of 32 x WARPS threads; default: default_blocking's; "
                        "unused with --per-launch 1, which runs the fused kernel alone)")
    p.add_argument("--quick", action="store_true", help="48 x 48 grid, 5 steps of 3 substeps (tests)")
    p.add_argument("--command-buffers", choices=("default", "on", "off", "while"), default="default",
                   help="XLA's command buffers: JAX's defaults, or forced on, off, or on with WHILE (sets XLA_FLAGS)")
    args = p.parse_args(argv)
    if args.quick:
        args.grid, args.steps, args.substeps = 48, 5, 3
    for name in ("grid", "steps", "substeps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.threads is not None and args.warps is not None:
        p.error("--threads runs the blocked kernel and --warps the columns kernel: give one of them")
    per_launch, tile, threads, warps = default_blocking(args.grid, args.substeps)
    args.per_launch = per_launch if args.per_launch is None else args.per_launch
    args.tile = tile if args.tile is None else args.tile
    if args.threads is None:
        if args.warps is None and args.tile + 2 * args.per_launch > 32:  # a region too wide for the columns kernel
            args.threads = 16
        else:
            args.threads, args.warps = threads, warps if args.warps is None else args.warps
    if args.per_launch == 1:
        args.warps = None  # one substep a launch: the fused kernel alone
    try:
        check_tiling(args.substeps, args.per_launch, args.tile, args.threads, args.warps)
    except ValueError as e:  # before anything runs, as argparse reports a bad option
        p.error(str(e))
    return args


def main(argv=None):
    args = parse_args(argv)
    if jaxgraph.device_count() == 0:
        print("a CUDA GPU is needed to run the simulation: none found, so this example stops here")
        return 0
    if args.command_buffers != "default":
        os.environ["XLA_FLAGS"] = COMMAND_BUFFERS[args.command_buffers]
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with jaxgraph
    import jax.numpy as jnp

    nx, steps, substeps = args.grid, args.steps, args.substeps
    rng = np.random.default_rng()
    u0, v0 = initial_state(nx, rng)
    want = reference(u0, v0, steps, substeps)
    u, v = jnp.asarray(u0), jnp.asarray(v0)
    flags = os.environ.get("XLA_FLAGS") or "unset: JAX's defaults"
    print(f"{nx} x {nx} grid, {steps} steps of {substeps} substeps; XLA_FLAGS {flags}", flush=True)

    runs = {}
    print("[1/4] idiomatic JAX: jnp.roll stencil in a jitted lax.fori_loop", flush=True)
    idiomatic = jnp_simulation(steps, substeps)
    runs["idiomatic JAX: jnp in a jitted fori_loop"] = timed(lambda: idiomatic(u, v))
    models = [CudaGrayScott(nx, substeps, 1, steps)]
    if args.per_launch > 1:
        models.append(CudaGrayScott(nx, substeps, args.per_launch, steps, args.tile, args.threads, args.warps))
    print(f"[2/4] XLA launching this file's kernels ({', '.join(m.name for m in models)}) in the fori_loop",
          flush=True)
    for m in models:
        sim = xla_simulation(m)
        runs[f"XLA: {m.name} kernels as jax_calls in the fori_loop"] = timed(lambda sim=sim: sim(u, v))
    print("[3/4] jaxgraph: the step as a device loop (graphed_loop), replayed eagerly and inside jax.jit", flush=True)
    loops = []
    for m in models:
        graphed, loop = m.device_loop()
        loops.append((m, loop))
        per_step = len(m.runs)
        runs[f"jaxgraph: {m.name} device loop, eager ({per_step} kernels/step)"] = timed(
            loop_eager(graphed, loop, u0, v0))
        in_jit = loop_in_jit(loop)
        runs[f"jaxgraph: {m.name} device loop in jax.jit ({per_step} kernels/step)"] = timed(
            lambda in_jit=in_jit: in_jit(u, v))

    print("[4/4] checking every way against numpy", flush=True)
    worst = max(check(name, out, want) for name, (out, _) in runs.items())
    print(f"\nthe {len(runs)} ways agree, and each matches numpy's u, v and {steps} totals (largest difference in v: "
          f"{worst:.1e}); total of v {want[2][0]:.1f} -> {want[2][-1]:.1f}\n")

    first = "idiomatic JAX: jnp in a jitted fori_loop"
    base = runs[first][1]
    width = max(map(len, runs))
    print(f"{'way of running ' + str(steps) + ' steps':<{width}}  {'ms':>8}  {'us/step':>8}  vs idiomatic JAX  "
          "vs the same kernels via jax_call")
    for name, (_, seconds) in runs.items():  # a device loop also against its own kernels through XLA: the graph's part
        same = next((runs[f"XLA: {m.name} kernels as jax_calls in the fori_loop"][1] for m in models
                     if name.startswith(f"jaxgraph: {m.name} device loop")), None)
        vs = f"  {same / seconds:6.2f}x" if same else ""
        print(f"{name:<{width}}  {seconds * 1e3:8.3f}  {seconds / steps * 1e6:8.2f}  {base / seconds:6.2f}x{' ' * 9}{vs}")
    best = min(s for name, (_, s) in runs.items() if "jaxgraph" in name and "jit" in name)
    print(f"\nfastest jaxgraph device loop in jit vs idiomatic JAX (this process's XLA setting, median of 5): "
          f"{base / best:.2f}x\n(a quick look: benchmarks/vs_idiomatic.py times each side at its best XLA setting "
          "over interleaved rounds; results with their ranges in benchmarks/results/*-vs-idiomatic.md)")
    for m, loop in loops:
        print(f"{m.name}: {loop!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
