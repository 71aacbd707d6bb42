"""Shared by the Poisson tests (no tests here): ``empty`` as in a captured graph, and the sweep numpy's
Jacobi stops at."""

import numpy as np

f32 = np.float32


class Captured:
    """``empty`` (``jaxgraph.empty``) as in a captured graph: the first call of the step allocates (poisoned
    arrays), every later call gets the same arrays in the same order."""

    def __init__(self):
        self.arrays, self.next = [], 0

    def empty(self, shape, dtype=f32):
        if self.next == len(self.arrays):
            self.arrays.append(np.full(shape, np.nan if np.dtype(dtype) == f32 else -7, dtype))
        self.next += 1
        return self.arrays[self.next - 1]


def float64_jacobi_stop(prob, most=10**6):
    """The first sweep (numpy's float32 sweeps) whose squared update, summed in float64, is within tolerance."""
    u = np.zeros_like(prob.f)
    for k in range(1, most + 1):
        q = np.pad(u, 1)
        new = f32(0.25) * (((q[1:-1, :-2] + q[1:-1, 2:]) + (q[:-2, 1:-1] + q[2:, 1:-1])) + prob.b)
        if float(np.sum((new.astype(np.float64) - u) ** 2)) <= prob.jacobi_tol2:
            return k
        u = new
    raise AssertionError("numpy's Jacobi did not converge")
