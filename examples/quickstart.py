"""Quickstart: compile a CUDA C++ kernel, launch it on device arrays, check it against numpy.

Run:  python examples/quickstart.py

On a machine without a CUDA GPU it still compiles the kernel to a cubin (NVRTC
needs no GPU), says in one line that launching needs a GPU, and exits 0.
"""

import sys

import numpy as np

import jaxgraph

SOURCE = r"""
template <typename T>
__global__ void axpy(T* y, const T* x, T a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""


def main() -> int:
    if jaxgraph.device_count() == 0:
        kernel = jaxgraph.Kernel(SOURCE, "axpy<float>", arch="sm_90")
        print(f"compiled {kernel} to a {len(kernel.cubin)}-byte cubin "
              f"({'from the disk cache' if kernel.cache_hit else 'with NVRTC'})")
        print("a CUDA GPU is needed for launching: none found, so the quickstart stops here")
        return 0

    kernel = jaxgraph.Kernel(SOURCE, "axpy<float>")   # for this GPU's architecture
    n, block = 1_000_003, 256                          # n need not divide the block
    rng = np.random.default_rng()
    x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)

    d_x, d_y = jaxgraph.asarray(x), jaxgraph.asarray(y)  # host -> device
    kernel[(n + block - 1) // block, block](d_y, d_x, 2.0, n)
    result = d_y.numpy()                                 # device -> host (waits for the stream)

    expected = np.float32(2.0) * x + y
    np.testing.assert_allclose(result, expected, rtol=1e-6, atol=1e-6)
    print(f"{kernel} on {n} elements matches numpy; first values: {result[:4]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
