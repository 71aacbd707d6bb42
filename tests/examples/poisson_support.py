"""Shared by the Poisson tests (no tests here): ``empty`` as in a captured graph, and numpy's Jacobi stop."""

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
