"""CUDA C++ sources shared by the tests."""

AXPY = r"""
template <typename T>
__global__ void axpy(T* __restrict__ y, const T* __restrict__ x, T a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""

ADD_ONE = r"""
extern "C" __global__ void add_one(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
"""

# Spins for `cycles` clock ticks, then writes: used to show stream ordering.
DELAYED_WRITE = r"""
extern "C" __global__ void delayed_write(float* out, float value, long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) { }
  out[threadIdx.x] = value;
}
"""

SCALAR_TYPES = r"""
#include <cuda_fp16.h>
extern "C" __global__ void scalars(double* out, signed char a, unsigned short b, long long c,
                                   unsigned int d, float e, double f, __half g, bool h) {
  out[0] = a; out[1] = b; out[2] = (double)c; out[3] = d; out[4] = e; out[5] = f;
  out[6] = __half2float(g); out[7] = h ? 1.0 : 0.0;
}
"""

# Conditional-node tests: loop bookkeeping done by the graph's own kernels.
CONDITIONAL = r"""
extern "C" __global__ void add_inplace(float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a;
}

// One trip of a counted loop: counter[0] += 1, remaining[0] -= 1 (one thread).
extern "C" __global__ void count_down(int* remaining, int* counter) {
  counter[0] += 1;
  remaining[0] -= 1;
}

// flag[0] = remaining[0] is even (one thread).
extern "C" __global__ void is_even(bool* flag, const int* remaining) {
  flag[0] = (remaining[0] % 2) == 0;
}

// history[row[0] * n + i] = x[i]
extern "C" __global__ void store_row(float* history, const float* x, const int* row, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) history[(long long)row[0] * n + i] = x[i];
}
"""
