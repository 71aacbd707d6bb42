"""Quickstart: a CUDA kernel, captured into a graph, replayed eagerly and inside jax.jit.

Run:  python examples/quickstart.py   (without a GPU it compiles the kernel, says so and exits 0)
"""

import argparse
import sys

import numpy as np

argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

import jaxgraph  # noqa: E402

SRC = r"""
extern "C" __global__ void axpb(float* y, const float* x, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
}"""

if jaxgraph.device_count() == 0:  # NVRTC needs no GPU: compile anyway
    k = jaxgraph.Kernel(SRC, "axpb", arch="sm_90")
    print(f"compiled {k} to {len(k.cubin)} bytes; a CUDA GPU is needed for launching: none found")
    sys.exit(0)
import jax  # noqa: E402

n, rng = 1_000_003, np.random.default_rng()
k, grid = jaxgraph.Kernel(SRC, "axpb"), (n + 255) // 256    # NVRTC -> cubin, cached on disk
x, y = jaxgraph.asarray(rng.standard_normal(n, np.float32)), jaxgraph.empty(n)
g = jaxgraph.CUDAGraph()
with jaxgraph.graph(g):                                     # 3 launches captured: y = 8x + 7
    k[grid, 256](y, x, 2.0, 1.0, n)
    k[grid, 256](y, y, 2.0, 1.0, n)
    k[grid, 256](y, y, 2.0, 1.0, n)
g.replay()                                                  # eagerly: one cuGraphLaunch
np.testing.assert_allclose(y.numpy(), 8 * x.numpy() + 7, rtol=1e-5, atol=1e-5)
step = jaxgraph.replayable(g, inputs=[x], outputs=[y])      # the graph as a JAX function
f = jax.jit(lambda v: step(v * 0.5) - 7.0)                  # one FFI call between XLA ops
v = rng.standard_normal(n, np.float32)
np.testing.assert_allclose(np.asarray(f(v)), 4 * v, rtol=1e-5, atol=1e-5)
print(f"{k}: {n} elements, graph replayed eagerly and inside jax.jit: matches numpy")
print(g)                                                    # what the graph holds
