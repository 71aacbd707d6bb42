"""The workload: a chain of N dependent ``add_one`` kernels on 4096 floats, and its numpy check.

The first kernel computes ``y = x + 1`` from the static input, the other N - 1
run in place (``y = y + 1``), so one pass leaves ``x + N`` in ``y`` and
leaves ``x`` untouched: every replay computes the same thing from its input.
Inputs are random integers stored as float32, so ``x + steps`` is exact and
the check is bit-for-bit equality with numpy.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

__all__ = ["BLOCK", "ELEMENTS", "GRID", "SOURCE", "Chain", "check_equal", "check_result", "random_input"]

ELEMENTS = 4096
BLOCK = 256
GRID = ELEMENTS // BLOCK

SOURCE = r"""
extern "C" __global__ void add_one(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
"""


def random_input(rng: np.random.Generator) -> np.ndarray:
    """Fresh random input: integers in [-1000, 1000) as float32, so adding up to 2**23 stays exact."""
    return rng.integers(-1000, 1000, ELEMENTS).astype(np.float32)


def check_result(got: Any, x: np.ndarray, steps: int) -> str:
    """Raise ``AssertionError`` unless ``got == x + steps`` exactly; return what was checked."""
    return check_equal(got, x + np.float32(steps), x, f"x + {steps}")


def check_equal(got: Any, want: np.ndarray, x: np.ndarray, what: str) -> str:
    """Raise ``AssertionError`` unless ``got`` equals numpy's ``want`` (computed from ``x`` as ``what``)."""
    got = np.asarray(got)
    if got.shape != want.shape:
        raise AssertionError(f"wrong result shape {got.shape}, expected {want.shape}")
    bad = np.flatnonzero(got != want)
    if bad.size:
        i = int(bad[0])
        raise AssertionError(f"wrong result: expected {what}; {bad.size} of {x.size} elements differ, "
                             f"e.g. [{i}]: got {got[i]}, expected {want[i]} (x = {x[i]})")
    return f"{what} on {x.size} random floats matches numpy"


class Chain:
    """N launches of ``add_one`` captured into one ``jaxgraph.CUDAGraph`` on static arrays.

    Attributes
    ----------
    n : int
    x_s, y_s : jaxgraph.DeviceArray
        The static input and output (new zeroed arrays unless given).
    graph : jaxgraph.CUDAGraph
    """

    def __init__(self, kernel: Any, n: int, x_s: Any = None, y_s: Any = None):
        import jaxgraph

        self.n = n
        self.x_s = jaxgraph.zeros(ELEMENTS, np.float32) if x_s is None else x_s
        self.y_s = jaxgraph.zeros(ELEMENTS, np.float32) if y_s is None else y_s
        self.graph = jaxgraph.CUDAGraph()
        launch = kernel[GRID, BLOCK]  # launches on the current stream: the capture stream below
        with jaxgraph.graph(self.graph):
            launch(self.y_s, self.x_s, ELEMENTS)
            for _ in range(n - 1):
                launch(self.y_s, self.y_s, ELEMENTS)

    def check(self, run_once: Callable[[], Any], rng: np.random.Generator) -> str:
        """Load fresh input, poison the output, ``run_once()``, and compare the output with numpy."""
        import jaxgraph

        x = random_input(rng)
        self.x_s.copy_(x)
        self.y_s.fill_(np.nan)  # a replay that does nothing cannot pass
        # copy_/fill_ ran on the current stream; the replay may go to another, non-blocking one.
        jaxgraph.synchronize()
        run_once()
        jaxgraph.synchronize()
        return check_result(self.y_s.numpy(), x, self.n)

    def close(self) -> None:
        """Destroy the graph now rather than at garbage collection."""
        self.graph.reset()
