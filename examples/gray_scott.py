"""A research loop: a Gray-Scott reaction-diffusion simulation whose step is graphed once, then
replayed inside a jitted lax.fori_loop, or run as a loop on the device.

Run:  python examples/gray_scott.py                            # 256 x 256 grid, 100 steps of 10 substeps
      python examples/gray_scott.py --grid 64 --steps 10 --substeps 4    # seconds
      python examples/gray_scott.py --command-buffers off      # XLA's command buffers off (or: on)

Two chemicals u and v react and diffuse on a periodic grid. One step is
`substeps` explicit Euler substeps, each two custom kernels (the 5-point
Laplacian of u and v, then the reaction update), then a one-thread kernel that
zeroes the total and a reduction kernel that adds v into it: 2 * substeps + 2
kernels. The step is a plain Python function that launches those kernels on
device arrays and updates u and v in place (see GrayScott.step for why), run
six ways on the same fresh random initial state:

  1. kernel by kernel from Python (jaxgraph's eager launches);
  2. graphed with jaxgraph.make_graphed_callables, replayed from a Python loop;
  3. the same kernels as Kernel.jax_call custom calls in a jitted lax.fori_loop:
     XLA launches them, or records them into its command buffers;
  4. the graphed step replayed inside the same jitted lax.fori_loop;
  5. jaxgraph.graphed_loop: one CUDA graph runs all the steps (a WHILE node of
     unrolled steps, u and v ping-ponging between the step's buffers), one launch;
  6. that device loop inside jax.jit, as one FFI call.

It checks one step against numpy, checks that the runs agree with each other
and with numpy, and prints how long each took.
"""

import argparse
import os
import sys
import time

import numpy as np

import jaxgraph

SOURCE = r"""
// The 5-point Laplacian of u and v on a periodic nx x ny grid (row-major).
extern "C" __global__ void laplacian(float* lu, float* lv, const float* u, const float* v, int nx, int ny) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= nx || y >= ny) return;
  int i = y * nx + x;
  int w = y * nx + (x + nx - 1) % nx, e = y * nx + (x + 1) % nx;
  int s = ((y + ny - 1) % ny) * nx + x, n = ((y + 1) % ny) * nx + x;
  lu[i] = u[w] + u[e] + u[s] + u[n] - 4.0f * u[i];
  lv[i] = v[w] + v[e] + v[s] + v[n] - 4.0f * v[i];
}

// One explicit Euler substep of Gray-Scott: diffusion plus the reaction u + 2v -> 3v.
extern "C" __global__ void react(float* u_out, float* v_out, const float* u, const float* v,
                                 const float* lu, const float* lv, float du, float dv,
                                 float feed, float kill, float dt, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float uvv = u[i] * v[i] * v[i];
  u_out[i] = u[i] + dt * (du * lu[i] - uvv + feed * (1.0f - u[i]));
  v_out[i] = v[i] + dt * (dv * lv[i] + uvv - (feed + kill) * v[i]);
}

// out[0] = 0, before `total` adds into it.
extern "C" __global__ void zero(float* out) { out[0] = 0.0f; }

// out[0] += sum(x); out zeroed first. One atomicAdd per block.
extern "C" __global__ void total(float* out, const float* x, int n) {
  __shared__ float part[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  part[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, part[0]);
}
"""

DU, DV, FEED, KILL, DT = 0.16, 0.08, 0.035, 0.065, 1.0  # spots, in grid units
COMMAND_BUFFERS = {"on": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1",
                   "off": "--xla_gpu_enable_command_buffer="}


class GrayScott:
    """The kernels and the step, on an ``nx`` x ``nx`` grid."""

    def __init__(self, nx, substeps):
        self.nx, self.n, self.substeps = nx, nx * nx, substeps
        self.laplacian, self.react, self.zero, self.total = (jaxgraph.Kernel(SOURCE, k)
                                                             for k in ("laplacian", "react", "zero", "total"))
        self.grid2, self.grid1 = ((nx + 15) // 16, (nx + 15) // 16), (self.n + 255) // 256

    def step(self, u, v):
        """Device arrays u, v -> (u, v, [total of v]) after ``substeps`` substeps: the code a researcher writes.

        u and v are updated in place: the substeps ping-pong between them and
        one scratch pair, ordered so that the last one writes u and v (with an
        odd count the first reaction runs in place, which is safe: it is
        elementwise, and the Laplacian went to lu, lv). A graphed step whose
        outputs are its inputs is, inside ``jax.jit``, a replay whose outputs
        share its operands' buffers (XLA aliases them), so ``lax.fori_loop``
        carries the state in place, as it does for XLA's own kernels. A step
        returning new arrays would make XLA copy each of them into the loop's
        carry on every trip (two 256 KiB copies a step on the default grid).
        The total is zeroed by a kernel, not a memset: jaxgraph points kernel
        arguments at XLA's buffers, but copies an output a memset node writes
        out of the graph's own array after each replay.
        """
        shape = (self.nx, self.nx)
        lu, lv = jaxgraph.empty(shape), jaxgraph.empty(shape)
        pairs = ((u, v), (jaxgraph.empty(shape), jaxgraph.empty(shape)))
        for s in range(self.substeps):
            u_next, v_next = pairs[(self.substeps - 1 - s) % 2]  # the last substep writes u, v
            self.laplacian[self.grid2, (16, 16)](lu, lv, u, v, self.nx, self.nx)
            self.react[self.grid1, 256](u_next, v_next, u, v, lu, lv, DU, DV, FEED, KILL, DT, self.n)
            u, v = u_next, v_next
        mass = jaxgraph.empty(1)
        self.zero[1, 1](mass)
        self.total[self.grid1, 256](mass, v, self.n)
        return u, v, mass

    def xla_step(self, u, v):
        """The same kernels on JAX arrays, one XLA custom call each (``Kernel.jax_call``)."""
        import jax
        import jax.numpy as jnp

        f32 = jax.ShapeDtypeStruct(u.shape, jnp.float32)
        for _ in range(self.substeps):
            lu, lv = self.laplacian.jax_call(f32, f32, u, v, self.nx, self.nx, grid=self.grid2, block=(16, 16))
            u, v = self.react.jax_call(f32, f32, u, v, lu, lv, DU, DV, FEED, KILL, DT, self.n, grid=self.grid1)
        mass = self.zero.jax_call(jax.ShapeDtypeStruct((1,), jnp.float32), grid=1, block=1)
        mass = self.total.jax_call(mass, v, self.n, inout=("out",), grid=self.grid1)
        return u, v, mass


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


def timed(run, repeats=5):
    """Run once (compiles and warms up), then time ``repeats`` more runs, each until its work is done.

    ``run`` returns (u, v, totals of v) as device or JAX arrays (and has waited
    for JAX's); the last run's are copied to the host after the clocks stop.
    Returns ``(numpy results, median seconds)``. (benchmarks/gray_scott_bench.py
    measures the jitted loops properly: interleaved rounds, one process per XLA setting.)
    """
    run()
    times = []
    for _ in range(repeats):
        jaxgraph.synchronize()
        start = time.perf_counter()
        u, v, masses = run()
        jaxgraph.synchronize()
        times.append(time.perf_counter() - start)

    def host(a):
        return a.numpy() if isinstance(a, jaxgraph.DeviceArray) else np.asarray(a)

    masses = np.concatenate([host(m) for m in masses]) if isinstance(masses, list) else host(masses)
    return (host(u), host(v), masses), float(np.median(times))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", type=int, default=256, help="grid side (default 256)")
    p.add_argument("--steps", type=int, default=100, help="steps, i.e. graph replays (default 100)")
    p.add_argument("--substeps", type=int, default=10, help="substeps per step (default 10)")
    p.add_argument("--command-buffers", choices=("default", "on", "off"), default="default",
                   help="XLA's command buffers: JAX's defaults, or forced on or off (sets XLA_FLAGS)")
    args = p.parse_args(argv)
    if jaxgraph.device_count() == 0:
        print("a CUDA GPU is needed to run the simulation: none found, so this example stops here")
        return 0
    if args.command_buffers != "default":
        os.environ["XLA_FLAGS"] = COMMAND_BUFFERS[args.command_buffers]
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with jaxgraph
    import jax
    import jax.numpy as jnp

    nx, steps, substeps = args.grid, args.steps, args.substeps
    kernels = steps * (2 * substeps + 2)
    rng = np.random.default_rng()
    u0, v0 = initial_state(nx, rng)

    print(f"[1/8] compiling 4 kernels; graphing a step of {2 * substeps + 2} kernels on a {nx} x {nx} grid", flush=True)
    model = GrayScott(nx, substeps)
    graphed = jaxgraph.make_graphed_callables(model.step, (u0, v0))

    print("[2/8] checking one step against numpy on fresh random input", flush=True)
    u1, v1 = initial_state(nx, rng)
    got = [np.asarray(a) for a in jax.jit(graphed)(u1, v1)]
    want = reference(u1, v1, 1, substeps)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.reshape(np.shape(w)), w, rtol=1e-4, atol=1e-5)

    print(f"[3/8] {steps} steps, kernel by kernel from Python", flush=True)
    u0_d, v0_d = jaxgraph.asarray(u0), jaxgraph.asarray(v0)

    def eager(step):
        u, v, masses = jaxgraph.empty(u0.shape).copy_(u0_d), jaxgraph.empty(v0.shape).copy_(v0_d), []  # updated in place
        for _ in range(steps):
            u, v, m = step(u, v)
            masses.append(jaxgraph.empty(1).copy_(m))  # a graph's outputs are overwritten by its next replay
        return u, v, masses

    runs = {}
    runs["kernels launched one by one from Python"] = timed(lambda: eager(model.step))
    print(f"[4/8] {steps} steps, the graph replayed from a Python loop", flush=True)
    runs["graph replayed from a Python loop"] = timed(lambda: eager(graphed))

    def fori(step):
        def body(i, carry):
            u, v, masses = carry
            u, v, m = step(u, v)
            return u, v, masses.at[i].set(m[0])

        sim = jax.jit(lambda u, v: jax.lax.fori_loop(0, steps, body, (u, v, jnp.zeros(steps, jnp.float32))))
        u, v = jnp.asarray(u0), jnp.asarray(v0)
        return lambda: jax.block_until_ready(sim(u, v))

    flags = os.environ.get("XLA_FLAGS") or "unset: JAX's default command buffers"
    print(f"[5/8] {steps} steps in a jitted lax.fori_loop of jax_call kernels (XLA_FLAGS {flags})", flush=True)
    runs["XLA: jax_call kernels in a jitted fori_loop"] = timed(fori(model.xla_step))
    print(f"[6/8] {steps} steps in a jitted lax.fori_loop of graph replays", flush=True)
    runs["jaxgraph: graphed step in a jitted fori_loop"] = timed(fori(graphed))

    loop = jaxgraph.graphed_loop(graphed, steps, feed={0: 0, 1: 1})  # outputs u, v feed inputs u, v
    print(f"[7/8] {steps} steps as one device loop, one launch ({loop.unroll} steps per WHILE trip, "
          f"{loop.ping_pong})", flush=True)
    u_s, v_s = graphed.static_inputs

    def device_loop():
        u_s.copy_(u0_d)  # the initial state into the step's inputs (device copies, no host sync)
        v_s.copy_(v0_d)
        loop.replay()
        return graphed.static_outputs  # u, v and the total of v after the last step

    runs["jaxgraph: device loop (graphed_loop), one launch"] = timed(device_loop)
    print(f"[8/8] {steps} steps as the device loop inside jax.jit (one FFI call)", flush=True)
    in_jit = jax.jit(loop)
    u0_j, v0_j = jnp.asarray(u0), jnp.asarray(v0)
    runs["jaxgraph: device loop inside jax.jit"] = timed(lambda: jax.block_until_ready(in_jit(u0_j, v0_j)))

    u_ref, v_ref, m_ref = reference(u0, v0, steps, substeps)
    first = next(iter(runs.values()))[0]
    for name, ((u, v, m), _) in runs.items():
        np.testing.assert_allclose(u, first[0], rtol=0, atol=1e-5, err_msg=name)  # the same kernels
        np.testing.assert_allclose(v, first[1], rtol=0, atol=1e-5, err_msg=name)
        # Float atomics: any order. A device loop keeps only the last step's total.
        np.testing.assert_allclose(m, m_ref[-m.size:], rtol=1e-3, err_msg=name)
        np.testing.assert_allclose(u, u_ref, rtol=0, atol=1e-4, err_msg=name)
        np.testing.assert_allclose(v, v_ref, rtol=0, atol=1e-4, err_msg=name)
    worst = max(float(np.abs(r[0][1] - v_ref).max()) for r in runs.values())
    print(f"\nthe {len(runs)} runs agree, and each matches numpy (largest difference in v: {worst:.1e}); "
          f"total of v {m_ref[0]:.1f} -> {m_ref[-1]:.1f}\n")

    base = runs["kernels launched one by one from Python"][1]
    width = max(map(len, runs))
    print(f"{'way of running ' + str(steps) + ' steps (' + str(kernels) + ' kernels)':<{width}}  "
          f"{'ms':>8}  {'us/kernel':>9}  speedup")
    for name, (_, seconds) in runs.items():
        print(f"{name:<{width}}  {seconds * 1e3:8.2f}  {seconds / kernels * 1e6:9.2f}  {base / seconds:6.1f}x")
    xla = runs["XLA: jax_call kernels in a jitted fori_loop"][1]
    ours = runs["jaxgraph: graphed step in a jitted fori_loop"][1]
    print(f"\ngraphed step vs XLA on the same kernels, both in jit: {xla / ours:.2f}x")
    device = runs["jaxgraph: device loop inside jax.jit"][1]
    print(f"device loop in jit vs XLA's fori_loop on the same kernels: {xla / device:.2f}x\n")
    print(graphed.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
