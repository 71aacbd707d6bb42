"""Replay a captured CUDA graph inside jax.jit, between ordinary XLA operations.

Run:  python examples/jit_replay.py

1. Compile two small CUDA kernels and capture 100 launches of them into a
   CUDA graph, on static device arrays x_static -> y_static.
2. Turn the graph into a JAX function with jaxgraph.replayable.
3. Use it inside jax.jit with XLA ops before and after it: the whole graph
   replays as ONE custom call on XLA's stream. Check against numpy.
4. Call a kernel directly from jit with Kernel.jax_call.

On a machine without a CUDA GPU it says so in one line and exits 0.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with jaxgraph

import numpy as np

import jaxgraph

SOURCE = r"""
extern "C" __global__ void scale(float* y, const float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
extern "C" __global__ void add_one(float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += 1.0f;
}
"""


def reference(x: np.ndarray) -> np.ndarray:
    """What the graph computes, in numpy: y = 0.5 x, then y += 1 ninety-nine times."""
    y = np.float32(0.5) * x
    for _ in range(99):
        y = y + np.float32(1)
    return y


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    if jaxgraph.device_count() == 0:
        print("a CUDA GPU is needed to replay graphs inside jax.jit: none found, so this example stops here")
        return 0
    import jax
    import jax.numpy as jnp

    n, block = 1 << 16, 256
    blocks = (n + block - 1) // block
    scale = jaxgraph.Kernel(SOURCE, "scale")
    add_one = jaxgraph.Kernel(SOURCE, "add_one")

    # 1. Capture 100 launches on static arrays.
    x_static = jaxgraph.zeros(n, np.float32)
    y_static = jaxgraph.zeros(n, np.float32)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        scale[blocks, block](y_static, x_static, 0.5, n)
        for _ in range(99):
            add_one[blocks, block](y_static, n)

    # 2. A JAX function: its argument is copied into x_static, the graph
    #    replays, and y_static comes back as a new jax.Array.
    step = jaxgraph.replayable(g, inputs=[x_static], outputs=[y_static])

    # 3. Inside jit, composed with XLA ops, in stream order.
    @jax.jit
    def f(x):
        return jnp.tanh(step(x * 2.0 - 1.0)) * 3.0

    rng = np.random.default_rng()
    for _ in range(3):  # fresh inputs each call
        x = rng.standard_normal(n).astype(np.float32)
        got = np.asarray(f(jnp.asarray(x)))
        np.testing.assert_allclose(got, np.tanh(reference(x * 2 - 1)) * 3, rtol=1e-5, atol=1e-5)
    print(f"replayed a 100-launch graph inside jax.jit on {n} floats: matches numpy")

    # The same step in a loop: 1000 replays inside one jitted lax.fori_loop.
    x = jnp.asarray(rng.integers(-100, 100, n).astype(np.float32))
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, 1000, lambda i, v: step(v * 2.0), x))
    jax.block_until_ready(loop(x))
    start = time.perf_counter()
    jax.block_until_ready(loop(x))
    elapsed = time.perf_counter() - start
    print(f"1000 replays in a jitted fori_loop: {elapsed * 1e3:.1f} ms "
          f"({elapsed / 1000 / 100 * 1e6:.2f} us per captured kernel; one timed call, not a benchmark: "
          "benchmarks/run.py times it against its floor, benchmarks/vs_idiomatic.py against idiomatic JAX)")

    # 4. A kernel called directly from jit: one FFI custom call on XLA's stream.
    y = jax.jit(lambda x: scale.jax_call(jax.ShapeDtypeStruct(x.shape, x.dtype), x, 4.0, x.size))(x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(x) * 4, rtol=1e-6)
    print("Kernel.jax_call inside jax.jit: matches numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
