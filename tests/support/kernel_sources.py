"""The CUDA C++ sources of the tests: one constant a kernel (or a small family), written once.

A test module imports the constants it uses and joins them into the source it
compiles (``AXPB + INC``); identical text compiles once (the cubin
cache is keyed on the source). Elementwise kernels take ``n`` last and guard
``i < n``. Not here: the CUDA text of error tests (broken on purpose), the
kernel a fresh venv compiles in ``test_install.py`` and the CuPy kernels of
the foreign-kernel tests (they are CuPy's, not jaxgraph's).
"""

# ---------------------------------------------------------------------------
# Elementwise float kernels
# ---------------------------------------------------------------------------

AXPY = r"""
template <typename T>
__global__ void axpy(T* __restrict__ y, const T* __restrict__ x, T a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""

# out = a x + y, templated, with a separate output.
AXPY_OUT = r"""
template <typename T>
__global__ void axpy_out(T* out, const T* x, const T* y, T a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + y[i];
}
"""

# y = a x + y, float, extern "C".
SAXPY = r"""
extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
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

# y = a x + b.
AXPB = r"""
extern "C" __global__ void axpb(float* y, const float* x, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
}
"""

SCALE = r"""
extern "C" __global__ void scale(float* y, const float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
"""

# y = a x, with x not declared const (so jaxgraph must assume the kernel writes it).
SCALE_NONCONST = r"""
extern "C" __global__ void scale_nonconst(float* y, float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
"""

ADD = r"""
extern "C" __global__ void add(float* z, const float* x, const float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) z[i] = x[i] + y[i];
}
"""

MUL = r"""
extern "C" __global__ void mul(float* z, const float* x, const float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) z[i] = x[i] * y[i];
}
"""

# y += 1, in place.
INC = r"""
extern "C" __global__ void inc(float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += 1.0f;
}
"""

# y += x, in place.
ACCUMULATE = r"""
extern "C" __global__ void accumulate(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}
"""

# s = a + b and d = a - b: two outputs, outputs first.
SUM_DIFF = r"""
extern "C" __global__ void sum_diff(float* s, float* d, const float* a, const float* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { s[i] = a[i] + b[i]; d[i] = a[i] - b[i]; }
}
"""

# The same, outputs and inputs interleaved (s, a, d, b): results follow the parameter order.
SUM_DIFF_INTERLEAVED = r"""
extern "C" __global__ void sum_diff_interleaved(float* s, const float* a, float* d, const float* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { s[i] = a[i] + b[i]; d[i] = a[i] - b[i]; }
}
"""

# y = x * x and its backward dx = 2 x g.
SQUARE = r"""
extern "C" __global__ void square(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * x[i];
}
extern "C" __global__ void square_bwd(float* dx, const float* x, const float* y, const float* g, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dx[i] = 2.0f * x[i] * g[i];
}
"""

# y = x * x * w and its backward.
SQUARE_MUL = r"""
extern "C" __global__ void square_mul(float* y, const float* x, const float* w, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * x[i] * w[i];
}
extern "C" __global__ void square_mul_bwd(float* gx, float* gw, const float* x, const float* w,
                                          const float* g, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { gx[i] = 2.0f * x[i] * w[i] * g[i]; gw[i] = x[i] * x[i] * g[i]; }
}
"""

# count[0] += 1 (one thread), and y = x + count[0]: state a graph carries between replays.
COUNT = r"""
extern "C" __global__ void bump(float* count) { count[0] += 1.0f; }
extern "C" __global__ void add_count(float* y, const float* x, const float* count, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + count[0];
}
"""

# ---------------------------------------------------------------------------
# Reductions, raw bytes, scalars
# ---------------------------------------------------------------------------

# out[0] += sum(x), static shared memory, any grid: out must be zeroed first.
BLOCK_SUM = r"""
extern "C" __global__ void block_sum(float* out, const float* x, int n) {
  __shared__ float partial[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  partial[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, partial[0]);
}
"""

# out[0] = sum(x) from one block, dynamic shared memory (blockDim.x floats at launch).
BLOCK_SUM_DYNAMIC = r"""
extern "C" __global__ void block_sum_dynamic(float* out, const float* x, int n) {
  extern __shared__ float partial[];
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  partial[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int t = 0; t < blockDim.x; ++t) total += partial[t];
    out[0] = total;
  }
}
"""

# y = (1 - a) x + a x[(i + 1) % n]: reads a neighbour, so it cannot run in place.
NEIGHBOUR_MIX = r"""
extern "C" __global__ void smooth(float* y, const float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = (1.0f - a) * x[i] + a * x[(i + 1) % n];
}
"""

# out[0] = 0 (one thread), then out[0] += sum(x) (one atomicAdd per element).
ZERO_THEN_TOTAL = r"""
extern "C" __global__ void zero(float* out) { out[0] = 0.0f; }
extern "C" __global__ void total(float* out, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(out, x[i]);
}
"""

# count[0] = number of x[i] > 0 (count zeroed first).
COUNT_POSITIVE = r"""
extern "C" __global__ void count_positive(int* count, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && x[i] > 0.0f) atomicAdd(count, 1);
}
"""

COPY_BYTES = r"""
extern "C" __global__ void copy_bytes(void* dst, const void* src, long long nbytes) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < nbytes) ((char*)dst)[i] = ((const char*)src)[i];
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

# Every kind of argument at once: pointers of two element types and scalars of five C types.
MIXED_PARAMS = r"""
#include <cuda_fp16.h>
extern "C" __global__ void mixed(float* y, const float* x, const double* w, float a, int n,
                                 long long shift, __half h, bool flag) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + (float)w[i] + (float)shift + __half2float(h) + (flag ? 1.0f : 0.0f);
}
"""

# Reverses each block's 16 * blockDim.x elements through 64 KiB of dynamic shared memory (1024 threads).
REVERSE_BLOCK = r"""
extern "C" __global__ void reverse_block(float* y, const float* x, int n) {
  extern __shared__ float tile[];   // 16 floats per thread: 64 KiB for a block of 1024
  int base = blockIdx.x * blockDim.x * 16;
  for (int k = 0; k < 16; ++k) {
    int i = base + k * blockDim.x + threadIdx.x;
    tile[k * blockDim.x + threadIdx.x] = i < n ? x[i] : 0.0f;
  }
  __syncthreads();
  int last = blockDim.x * 16 - 1;
  for (int k = 0; k < 16; ++k) {
    int j = k * blockDim.x + threadIdx.x;
    int i = base + j;
    if (i < n) y[i] = tile[last - j];
  }
}
"""

# ---------------------------------------------------------------------------
# Timing: kernels that spin, to show stream ordering
# ---------------------------------------------------------------------------

# Spins for `cycles` clock ticks, then writes.
DELAYED_WRITE = r"""
extern "C" __global__ void delayed_write(float* out, float value, long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) { }
  out[threadIdx.x] = value;
}
"""

# Spins for `cycles` clock ticks, then copies.
SPIN_COPY = r"""
extern "C" __global__ void spin_copy(float* out, const float* in, long long cycles, int n) {
  long long start = clock64();
  while (clock64() - start < cycles) { }
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}
"""

# Spins for `cycles` clock ticks, then y = x + 1: a kernel slow enough that calls queue up.
SPIN_ADD_ONE = r"""
extern "C" __global__ void spin_add_one(float* y, const float* x, long long cycles, int n) {
  long long start = clock64();
  while (clock64() - start < cycles) { }
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
"""

# ---------------------------------------------------------------------------
# Loops and conditional nodes: bookkeeping done by the graph's own kernels
# ---------------------------------------------------------------------------

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

# Kernels that set a conditional node's value on the device (cudaGraphSetConditional).
SET_CONDITIONAL = r"""
// cudaGraphSetConditional as <cuda_device_runtime_api.h> declares it (a builtin: no device
// runtime to link), spelled out because NVIDIA's runtime wheel lacks that header's crt/ includes.
extern "C" __device__ __attribute__((cudart_builtin)) void cudaGraphSetConditional(unsigned long long handle,
                                                                                 unsigned int value);

// The condition of `handle` from a device value: a predicate, a switch index, a trip count.
extern "C" __global__ void set_condition(unsigned long long handle, const int* value) {
  cudaGraphSetConditional(handle, (unsigned int)value[0]);
}

// Before a WHILE node: n trips (clamped, so a wrong binding cannot hang the GPU).
extern "C" __global__ void start_count(unsigned long long handle, int* counter, const int* n) {
  int trips = min(max(n[0], 0), 64);
  counter[0] = trips;
  cudaGraphSetConditional(handle, trips > 0 ? 1u : 0u);
}

// One WHILE trip done: count down, loop again while trips are left.
extern "C" __global__ void count_down_while(unsigned long long handle, int* counter) {
  int left = --counter[0];
  cudaGraphSetConditional(handle, left > 0 ? 1u : 0u);
}
"""

# A loop flag written by kernels, for the capture API's WHILE regions.
LOOP_FLAG = r"""
extern "C" __global__ void start_loop(int* counter, int* flag, const int* n) {
  counter[0] = min(max(n[0], 0), 64);
  flag[0] = counter[0] > 0;
}
extern "C" __global__ void step_loop(int* counter, int* flag) { flag[0] = --counter[0] > 0; }
"""

# graphed_loop steps: y = 0.5 x + b, counting steps and raising a stop flag at stop_at.
LOOP_STEP = r"""
extern "C" __global__ void lstep(float* y, const float* x, const float* b, int* counter, int* flag,
                                 const int* stop_at, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 0.5f * x[i] + b[i];
  if (i == 0) {
    int c = atomicAdd(counter, 1) + 1;
    if (c >= *stop_at) *flag = 1;
  }
}
extern "C" __global__ void lstep_inplace(float* x, const float* b, int* counter, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = 0.5f * x[i] + b[i];
  if (i == 0) atomicAdd(counter, 1);
}
"""

# A user kernel drawing from jaxgraph's Philox generator (after Generator.CUDA_HEADER).
MY_NOISE = r"""
extern "C" __global__ void my_noise(float* out, const unsigned long long* state, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = jaxgraph_philox_uniform(state, i);
}
"""
