// The single-block kernels of examples/poisson_block.py: a grid of up to 64 x 64 unknowns solved by one
// block of 1024 threads, its state in registers and shared memory, many sweeps (iterations) a launch.
//
// Thread t owns column c = t % 64 of rows 4 g .. 4 g + 3, g = t / 64 (points outside the n x n grid stay
// zero and add nothing): the neighbours above and below inside its strip are its own registers, the
// others come from a 64 x 64 shared copy (row stride 64 whatever n). A sweep (iteration) ends with a
// block sum that every warp finishes on its own from the warps' partial sums, so one __syncthreads
// serves both the stencil's shared copy and the sum. Every product and sum is an explicitly rounded
// float32 operation (__fmul_rn, __fadd_rn, ...: no contraction into FMAs), in a fixed order, so numpy
// reproduces the kernels' bits (tests/examples/test_poisson_block.py) and the stop falls on the same
// sweep (iteration) there and here.
#define SIDE 64
#define ROWS 4           // rows a thread owns
#define THREADS 1024     // SIDE * SIDE / ROWS

// The total of x over the block in a fixed order, the same in every thread: each warp's lanes in a
// shuffle tree, the warps' sums stored in part[32] (after the caller's writes, one barrier), then
// every warp adds the 32 sums in the same tree and broadcasts lane 0's total.
__device__ __forceinline__ float tree32(float x) {
  for (int o = 16; o > 0; o /= 2) x = __fadd_rn(x, __shfl_down_sync(0xffffffffu, x, o));
  return __shfl_sync(0xffffffffu, x, 0);
}

__device__ __forceinline__ float finish_total(const float* part) {
  return tree32(part[threadIdx.x & 31]);
}

struct Strip {
  int c, row0, n;
  bool col_in;
  __device__ Strip(int n_) : n(n_) {
    c = threadIdx.x % SIDE;
    row0 = ROWS * (threadIdx.x / SIDE);
    col_in = c < n;
  }
  __device__ bool in(int k) const { return col_in && row0 + k < n; }
  __device__ int global(int k) const { return (row0 + k) * n + c; }
  __device__ int shared(int k) const { return (row0 + k) * SIDE + c; }
  // ((left + right) + (up + down)) of own point k: zero outside the grid, as numpy's padded stencil.
  __device__ float neighbours(const float* sh, const float* own, int k) const {
    int row = row0 + k, j = shared(k);
    float left = c > 0 ? sh[j - 1] : 0.0f;
    float right = c < n - 1 ? sh[j + 1] : 0.0f;
    float up = k > 0 ? own[k - 1] : (row > 0 ? sh[j - SIDE] : 0.0f);
    float down = row + 1 < n ? (k < ROWS - 1 ? own[k + 1] : sh[j + SIDE]) : 0.0f;
    return __fadd_rn(__fadd_rn(left, right), __fadd_rn(up, down));
  }
};

// Up to `sweeps` Jacobi sweeps for 4 u - neighbours = h2 f, u updated in place (loaded at entry, stored
// at exit). After each sweep the block adds up the squared update; once that sum is <= tol2 the
// kernel stops right there (that sweep counts, as in numpy's Jacobi), stores u and sets *flag. A
// launch that finds *flag set does nothing (the every-K stop's extra launches). *count += the sweeps.
extern "C" __global__ void __launch_bounds__(THREADS) jacobi_block(float* u, int* flag, int* count, const float* f,
                                                                  float h2, int n, float tol2, int sweeps) {
  __shared__ float sh[2][SIDE * SIDE];
  __shared__ float part[2][32];
  if (*flag) return;  // every thread reads it before the first barrier; only thread 0 writes it, at the end
  Strip st(n);
  float v[ROWS], b[ROWS];
  for (int k = 0; k < ROWS; k++) {
    bool in = st.in(k);
    v[k] = in ? u[st.global(k)] : 0.0f;
    b[k] = in ? __fmul_rn(h2, f[st.global(k)]) : 0.0f;
    sh[0][st.shared(k)] = v[k];
  }
  __syncthreads();
  int done = 0, cur = 0;
  bool converged = false;
  while (done < sweeps) {
    float next[ROWS], d2 = 0.0f;
    for (int k = 0; k < ROWS; k++) {
      float nb = st.neighbours(sh[cur], v, k);
      next[k] = st.in(k) ? __fmul_rn(0.25f, __fadd_rn(nb, b[k])) : 0.0f;
      float d = __fsub_rn(next[k], v[k]);
      d2 = __fadd_rn(d2, __fmul_rn(d, d));
    }
    for (int k = 0; k < ROWS; k++) {
      v[k] = next[k];
      sh[cur ^ 1][st.shared(k)] = next[k];
    }
    for (int o = 16; o > 0; o /= 2) d2 = __fadd_rn(d2, __shfl_down_sync(0xffffffffu, d2, o));
    if ((threadIdx.x & 31) == 0) part[done & 1][threadIdx.x >> 5] = d2;
    // The one barrier of a sweep: the new u and the warps' sums are complete. The buffers written next
    // (sh[cur], part[(done + 1) & 1]) were last read before this barrier.
    __syncthreads();
    float total = finish_total(part[done & 1]);
    done++;
    cur ^= 1;
    if (total <= tol2) {  // the same total in every thread: the block leaves the loop together
      converged = true;
      break;
    }
  }
  for (int k = 0; k < ROWS; k++)
    if (st.in(k)) u[st.global(k)] = v[k];
  if (threadIdx.x == 0) {
    *count += done;
    if (converged) *flag = 1;
  }
}

// Up to `iters` iterations of pipelined conjugate gradients (Chronopoulos and Gear, as cg_fused in
// poisson_solver.cu) for A x = b, A the 5-point operator. Each thread keeps x, r, w = A r, p and s of
// its points in registers; r also goes to shared memory for the stencil. The first launch (*count ==
// 0) starts from x = 0: r = b, w = A b, gamma = r.r, delta = w.r, beta = 0. Later launches load x, r, w,
// p, s and scal = [gamma, delta, gamma_last, alpha_last] where the previous one stored them. Whenever
// gamma = r.r <= tol2 (after the start or after an iteration) the kernel stops there, stores its state
// and sets *flag; a launch that finds *flag set does nothing. *count += the iterations.
extern "C" __global__ void __launch_bounds__(THREADS) cg_block(float* x, int* flag, int* count, float* r, float* w,
                                                              float* p, float* s, float* scal, const float* b, int n,
                                                              float tol2, int iters) {
  __shared__ float rs[SIDE * SIDE];
  __shared__ float part[2][32];
  if (*flag) return;
  bool first = *count == 0;  // read by every thread before the first barrier; thread 0 writes it at the end
  Strip st(n);
  float xv[ROWS], rv[ROWS], wv[ROWS], pv[ROWS], sv[ROWS];
  float gamma = 0.0f, delta = 0.0f, gamma_last, alpha_last;
  for (int k = 0; k < ROWS; k++) {
    bool in = st.in(k);
    int g = st.global(k);
    xv[k] = in && !first ? x[g] : 0.0f;
    rv[k] = in ? (first ? b[g] : r[g]) : 0.0f;
    wv[k] = in && !first ? w[g] : 0.0f;
    pv[k] = in && !first ? p[g] : 0.0f;
    sv[k] = in && !first ? s[g] : 0.0f;
  }
  int done = 0;
  bool start = first;
  if (!first) {
    gamma = scal[0], delta = scal[1], gamma_last = scal[2], alpha_last = scal[3];
  } else {
    gamma_last = __int_as_float(0x7f800000), alpha_last = 1.0f;  // beta = gamma / inf = 0
  }
  bool converged = !first && gamma <= tol2;
  // One pass of the loop body per iteration; with `start` the update is skipped (the first launch's
  // w = A b and its sums).
  while (!converged && done < iters) {
    float alpha = 0.0f;
    if (!start) {
      float beta = __fdiv_rn(gamma, gamma_last);
      alpha = __fdiv_rn(gamma, __fsub_rn(delta, __fdiv_rn(__fmul_rn(beta, gamma), alpha_last)));
      for (int k = 0; k < ROWS; k++) {
        sv[k] = __fadd_rn(wv[k], __fmul_rn(beta, sv[k]));
        pv[k] = __fadd_rn(rv[k], __fmul_rn(beta, pv[k]));
        xv[k] = __fadd_rn(xv[k], __fmul_rn(alpha, pv[k]));
        rv[k] = __fsub_rn(rv[k], __fmul_rn(alpha, sv[k]));
      }
    }
    for (int k = 0; k < ROWS; k++) rs[st.shared(k)] = rv[k];
    // r complete in shared memory; the previous pass's reads of rs and part ended before its barrier below.
    __syncthreads();
    float g = 0.0f, d = 0.0f;
    for (int k = 0; k < ROWS; k++) {
      float nb = st.neighbours(rs, rv, k);
      wv[k] = st.in(k) ? __fsub_rn(__fmul_rn(4.0f, rv[k]), nb) : 0.0f;
      g = __fadd_rn(g, __fmul_rn(rv[k], rv[k]));
      d = __fadd_rn(d, __fmul_rn(wv[k], rv[k]));
    }
    for (int o = 16; o > 0; o /= 2) {
      g = __fadd_rn(g, __shfl_down_sync(0xffffffffu, g, o));
      d = __fadd_rn(d, __shfl_down_sync(0xffffffffu, d, o));
    }
    if ((threadIdx.x & 31) == 0) {
      part[0][threadIdx.x >> 5] = g;
      part[1][threadIdx.x >> 5] = d;
    }
    __syncthreads();  // the warps' sums complete; no thread writes part or rs again before the next barrier
    float g_total = finish_total(part[0]), d_total = finish_total(part[1]);
    if (!start) {
      gamma_last = gamma;
      alpha_last = alpha;
      done++;
    }
    start = false;
    gamma = g_total;
    delta = d_total;
    converged = gamma <= tol2;
  }
  for (int k = 0; k < ROWS; k++) {
    if (!st.in(k)) continue;
    int gi = st.global(k);
    x[gi] = xv[k];
    r[gi] = rv[k];
    w[gi] = wv[k];
    p[gi] = pv[k];
    s[gi] = sv[k];
  }
  if (threadIdx.x == 0) {
    scal[0] = gamma, scal[1] = delta, scal[2] = gamma_last, scal[3] = alpha_last;
    *count += done;
    if (converged) *flag = 1;
  }
}
