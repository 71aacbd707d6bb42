"""Host cost of one eager kernel launch: jaxgraph vs PyTorch eager vs cuda.core.

Each way launches the same tiny elementwise kernel (y = x + 1 on 4096 floats)
many times back to back; the figure is host wall time per launch once the
queue is warm (median over repeats). Run: python benchmarks/launch_overhead.py
"""

import statistics
import time

import numpy as np

import jaxgraph

N, LAUNCHES, REPEATS = 4096, 2000, 15
SRC = r"""
extern "C" __global__ void add_one(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
"""


def per_launch_us(launch, sync) -> float:
    launch(), sync()
    samples = []
    for _ in range(REPEATS):
        sync()
        start = time.perf_counter()
        for _ in range(LAUNCHES):
            launch()
        samples.append((time.perf_counter() - start) / LAUNCHES * 1e6)
        sync()
    return statistics.median(samples)


def main() -> None:
    kernel = jaxgraph.Kernel(SRC, "add_one")
    x = jaxgraph.asarray(np.random.default_rng().standard_normal(N, np.float32))
    y = jaxgraph.empty(N)
    s = jaxgraph.Stream()
    bound = kernel[N // 256, 256, 0, s]
    results = {"jaxgraph kernel[grid, block](...)": per_launch_us(lambda: bound(y, x, N), s.synchronize)}
    results["jaxgraph kernel.launch(...)"] = per_launch_us(
        lambda: kernel.launch(y, x, N, grid=N // 256, block=256, stream=s), s.synchronize)
    try:
        import torch

        tx = torch.randn(N, device="cuda")
        ty = torch.empty_like(tx)
        results["torch eager torch.add(x, 1, out=y)"] = per_launch_us(
            lambda: torch.add(tx, 1, out=ty), torch.cuda.synchronize)
    except ImportError:
        pass
    from cuda.core import LaunchConfig, launch
    from cuda.core import Stream as CoreStream

    core_stream = CoreStream.from_handle(int(s))
    config = LaunchConfig(grid=N // 256, block=256)
    core_kernel = kernel._library.get_kernel("add_one")
    n32 = np.int32(N)
    results["cuda.core launch(...) (typed args)"] = per_launch_us(
        lambda: launch(core_stream, config, core_kernel, y.ptr, x.ptr, n32), s.synchronize)
    width = max(map(len, results))
    print(f"{'way of launching':<{width}}  us per launch (median of {REPEATS} x {LAUNCHES})")
    for name, us in results.items():
        print(f"{name:<{width}}  {us:6.2f}")


if __name__ == "__main__":
    main()
