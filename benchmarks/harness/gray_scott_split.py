"""The workload of ``gray_scott_bench.py``: gray_scott's step as the example wrote it before it fused its substeps.

Two kernels a substep (the Laplacian, then the reaction), then a kernel that
zeroes the total and one that adds v into it: ``2 * substeps + 2`` kernels.
``examples/gray_scott.py`` now runs one fused or temporally blocked kernel a
substep run; this step stays as the benchmark's subject (a graphed step in a
jitted ``fori_loop`` against XLA launching the same kernels).
"""

from __future__ import annotations

__all__ = ["GrayScott", "SPLIT_SOURCE"]

SPLIT_SOURCE = r"""
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


class GrayScott:
    """examples/gray_scott.py's former step: two kernels a substep (Laplacian, then reaction), on an ``nx`` x ``nx``
    grid, kept here as this benchmark's workload; ``gs`` is the example module (constants, reference)."""

    def __init__(self, gs, nx, substeps):
        import jaxgraph

        self.gs, self.nx, self.n, self.substeps = gs, nx, nx * nx, substeps
        self.laplacian, self.react, self.zero, self.total = (jaxgraph.Kernel(SPLIT_SOURCE, k)
                                                             for k in ("laplacian", "react", "zero", "total"))
        self.grid2, self.grid1 = ((nx + 15) // 16, (nx + 15) // 16), (self.n + 255) // 256

    @property
    def constants(self):
        return self.gs.DU, self.gs.DV, self.gs.FEED, self.gs.KILL, self.gs.DT

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
        import jaxgraph

        shape = (self.nx, self.nx)
        lu, lv = jaxgraph.empty(shape), jaxgraph.empty(shape)
        pairs = ((u, v), (jaxgraph.empty(shape), jaxgraph.empty(shape)))
        for s in range(self.substeps):
            u_next, v_next = pairs[(self.substeps - 1 - s) % 2]  # the last substep writes u, v
            self.laplacian[self.grid2, (16, 16)](lu, lv, u, v, self.nx, self.nx)
            self.react[self.grid1, 256](u_next, v_next, u, v, lu, lv, *self.constants, self.n)
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
            u, v = self.react.jax_call(f32, f32, u, v, lu, lv, *self.constants, self.n, grid=self.grid1)
        mass = self.zero.jax_call(jax.ShapeDtypeStruct((1,), jnp.float32), grid=1, block=1)
        mass = self.total.jax_call(mass, v, self.n, inout=("out",), grid=self.grid1)
        return u, v, mass
