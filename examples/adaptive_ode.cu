// The kernels of examples/adaptive_ode.py (read there into jaxgraph.Kernel). Two ways to run one
// attempted step of Dormand-Prince 5(4) for Lorenz-96 in float64:
//
// tile_step<M>  the whole step in ONE kernel (the default path, "tiled"). Each block loads its tile
//               of y (M elements a thread) plus a halo of 14 elements on the left and 7 on the right
//               into shared memory, and evaluates all seven stages there: each evaluation of f spends
//               2 halo elements on the left and 1 on the right (f(x)_i reads x[i-2..i+1]), so after
//               k1..k7 the tile's own elements are exact and nothing crossed a block boundary. One
//               block holding the whole ring (n <= blockDim.x * M) needs no halo. y and y_new are
//               two buffers swapped by a flag (ist[CUR]) instead of copied, so no block writes what
//               another reads. The scaled error's squares are summed per block; the last block to
//               finish (an atomic counter) adds the blocks' sums in a fixed order (every run takes
//               the same steps) and one thread runs the controller. k1 = f(y) is recomputed each
//               step instead of kept from the last (first same as last): the same value, bit for bit.
// the stages    stage_first, stage (x4), error_control: one kernel per stage over a grid of blocks,
//               the stages' results in global memory (the "stages" path, kept for comparison):
//   stage_first   commits the previous step if it was accepted (y <- y_new, k1 <- k7: first same
//                 as last), evaluates stage 2 (its input y + h a21 k1 formed on the fly) and forms
//                 stage 3's input; on the first step it also evaluates k1 = f(y);
//   stage (x4)    stages 3 to 6: k_s = f(Y_s) and the next stage's input, the last being y_new;
//   error_control k7 = f(y_new), the embedded error h sum_j e_j k_j scaled by atol + rtol
//                 max(|y|, |y_new|), squared and summed per block; the last block to finish
//                 adds the blocks' sums and runs the controller, as tile_step does.
// K holds k1..k7 (the stages path), each n long.
// st (float64): [t_prev, t_next, inv_prev]; ist (int32): [accepted, init, accepted steps,
// rejected steps, blocks done, done, cur]. The step attempted is [t_prev, t_next]; the tiled path's
// state is y0 when cur == 0, else y1.
#define T_PREV 0
#define T_NEXT 1
#define INV_PREV 2
#define ACCEPTED 0
#define INIT 1
#define N_ACCEPTED 2
#define N_REJECTED 3
#define BLOCKS_DONE 4
#define FINISHED 5
#define CUR 6
#define HALO_LEFT 14  // 7 evaluations of f, 2 elements each on the left
#define HALO 21       // ... and 1 each on the right

// Rows 2..7 of the Butcher matrix (row 7 is the 5th-order weights), and the error weights.
__constant__ double A[8][6] = {
  {0}, {0}, {1.0 / 5},
  {3.0 / 40, 9.0 / 40},
  {44.0 / 45, -56.0 / 15, 32.0 / 9},
  {19372.0 / 6561, -25360.0 / 2187, 64448.0 / 6561, -212.0 / 729},
  {9017.0 / 3168, -355.0 / 33, 46732.0 / 5247, 49.0 / 176, -5103.0 / 18656},
  {35.0 / 384, 0.0, 500.0 / 1113, 125.0 / 192, -2187.0 / 6784, 11.0 / 84}};
__constant__ double E[7] = {35.0 / 384 - 1951.0 / 21600, 0.0, 500.0 / 1113 - 22642.0 / 50085,
                            125.0 / 192 - 451.0 / 720, -2187.0 / 6784 + 12231.0 / 42400,
                            11.0 / 84 - 649.0 / 6300, -1.0 / 60};

__device__ __forceinline__ int wrap(int j, int n) { return j < 0 ? j + n : (j >= n ? j - n : j); }

// Lorenz-96 at i: (x[i+1] - x[i-2]) x[i-1] - x[i] + F, periodic.
__device__ __forceinline__ double l96(const double* x, int i, int n, double F) {
  return (x[wrap(i + 1, n)] - x[wrap(i - 2, n)]) * x[wrap(i - 1, n)] - x[i] + F;
}

// Stage 2 at i (and the commit of the previous step). Reads y_new and k7 when the last step was
// accepted and writes y and k1 from them: no element reads what another writes then. On the
// first step (init) k1 = f(y) is computed here from y, which nothing writes.
__device__ __forceinline__ void stage_first_at(int i, double* y, double* K, double* Y3, const double* y_new,
                                               int accepted, int init, double h, double F, int n) {
  const double* ys = accepted ? y_new : y;
  const double* k1s = accepted ? K + 6 * n : K;
  const double c = h * 0.2;
  double y2[4];  // stage 2's input at i - 2, i - 1, i, i + 1
  for (int d = 0; d < 4; ++d) {
    int j = wrap(i + d - 2, n);
    y2[d] = ys[j] + c * (init ? l96(ys, j, n, F) : k1s[j]);
  }
  const double yi = ys[i], k1 = init ? l96(ys, i, n, F) : k1s[i];
  const double k2 = (y2[3] - y2[0]) * y2[1] - y2[2] + F;
  K[n + i] = k2;
  Y3[i] = yi + h * (A[3][0] * k1 + A[3][1] * k2);
  if (accepted) y[i] = yi;
  if (accepted || init) K[i] = k1;
}

// Stage s in 3..6 at i: k_s = f(Ys), and the input of stage s + 1 (for s = 6: the solution y_new).
__device__ __forceinline__ void stage_at(int i, double* K, double* Y_next, const double* Ys, const double* y,
                                         int s, double h, double F, int n) {
  const double ks = l96(Ys, i, n, F);
  K[(s - 1) * n + i] = ks;
  double acc = A[s + 1][s - 1] * ks;
  for (int j = 0; j < s - 1; ++j) acc += A[s + 1][j] * K[j * n + i];
  Y_next[i] = y[i] + h * acc;
}

// k7 = f(y_new) at i, and the square of the scaled error there.
__device__ __forceinline__ double error2_at(int i, double* K, const double* y, const double* y_new, double h,
                                            double rtol, double atol, double F, int n) {
  const double k7 = l96(y_new, i, n, F);
  K[6 * n + i] = k7;
  double e = E[6] * k7;
  for (int j = 0; j < 6; ++j) e += E[j] * K[j * n + i];
  const double scaled = h * e / (atol + rtol * fmax(fabs(y[i]), fabs(y_new[i])));
  return scaled * scaled;
}

// Sum part[0 .. blockDim.x) into part[0] (blockDim.x a power of two), in a fixed order.
__device__ __forceinline__ void block_sum(double* part) {
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
}

// One thread: diffrax's PIDController (variant 4, dcoeff = 0) on the squared-error sum, its clip
// to t_end, the step counts and the stop flag.
__device__ void control(double sum2, double* st, int* ist, int* done, int n, double t_end, double t_clip,
                        double coeff1, double coeff2, double safety, double factormin, double factormax) {
  const double err = sqrt(sum2 / n);
  const int keep = err < 1.0;
  double inv = 1.0 / err;
  // safety * inv^coeff1 * inv_prev^coeff2 as one exp of logs (two pow calls cost more, one thread);
  // err = 0 gives +inf, err = inf gives 0, as the powers do
  double factor = safety * exp(-coeff1 * log(err) + coeff2 * log(st[INV_PREV]));
  factor = isnan(factor) ? factormin : fmin(fmax(factor, keep ? 1.0 : factormin), keep ? factormax : safety);
  const double t0 = st[T_PREV], t1 = st[T_NEXT];
  const double dt = (t1 - t0) * factor;
  if (inv == 0.0 || isinf(inv)) inv = 1.0;
  const double next_t0 = keep ? t1 : t0;
  double next_t1 = next_t0 + dt;
  const double t_prev = fmin(next_t0, t_end);
  if (next_t1 > t_clip) next_t1 = keep ? t_end : t_prev + 0.5 * (t_end - t_prev);
  st[T_PREV] = t_prev;
  st[T_NEXT] = next_t1;
  if (keep) st[INV_PREV] = inv;
  ist[ACCEPTED] = keep;
  ist[INIT] = 0;
  if (keep) ist[CUR] ^= 1;  // the tiled path: y_new (the other buffer) is the state now
  ist[keep ? N_ACCEPTED : N_REJECTED] += 1;
  const int finished = t_prev >= t_end;
  ist[FINISHED] = finished;
  *done = finished;
}

extern "C" __global__ void stage_first(double* y, double* K, double* Y3, const double* y_new,
                                       const double* st, const int* ist, double F, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) stage_first_at(i, y, K, Y3, y_new, ist[ACCEPTED], ist[INIT], st[T_NEXT] - st[T_PREV], F, n);
}

extern "C" __global__ void stage(double* K, double* Y_next, const double* Ys, const double* y,
                                 const double* st, int s, double F, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) stage_at(i, K, Y_next, Ys, y, s, st[T_NEXT] - st[T_PREV], F, n);
}

// k7, the scaled error's squares summed per block (blockDim.x = 256); the last block to finish
// adds the blocks' sums in a fixed order and runs the controller.
extern "C" __global__ void error_control(double* K, double* partial, double* st, int* ist, int* done,
                                         const double* y, const double* y_new, double F, int n,
                                         double rtol, double atol, double t_end, double t_clip,
                                         double coeff1, double coeff2, double safety,
                                         double factormin, double factormax) {
  __shared__ double part[256];
  __shared__ int last;
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  part[threadIdx.x] = i < n ? error2_at(i, K, y, y_new, st[T_NEXT] - st[T_PREV], rtol, atol, F, n) : 0.0;
  block_sum(part);
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = part[0];
    __threadfence();  // the partial is visible before the count says so
    last = atomicAdd(&ist[BLOCKS_DONE], 1) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  double s = 0.0;  // L2 loads (__ldcg): other SMs wrote the partials
  for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x) s += __ldcg(&partial[b]);
  part[threadIdx.x] = s;
  block_sum(part);
  if (threadIdx.x != 0) return;
  ist[BLOCKS_DONE] = 0;
  control(part[0], st, ist, done, n, t_end, t_clip, coeff1, coeff2, safety, factormin, factormax);
}

// Lorenz-96 at e of a buffer of m elements held in shared memory: periodic (the whole ring is in
// the buffer) or clamped to the buffer (a tile with its halo: clamped values are wrong only in the
// part of the halo already spent).
__device__ __forceinline__ double l96_buf(const double* x, int e, int m, int ring, double F) {
  int ip1 = e + 1, im1 = e - 1, im2 = e - 2;
  if (ring) {
    ip1 = ip1 >= m ? ip1 - m : ip1;
    im1 = im1 < 0 ? im1 + m : im1;
    im2 = im2 < 0 ? im2 + m : im2;
  } else {
    ip1 = min(ip1, m - 1);
    im1 = max(im1, 0);
    im2 = max(im2, 0);
  }
  return (x[ip1] - x[im2]) * x[im1] - x[e] + F;
}

// The sum of v over the block into thread 0 (blockDim.x a multiple of 32), in a fixed order.
__device__ __forceinline__ double block_total(double v, double* warp_sums) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = 0.0;
  if (warp == 0) {
    v = lane < (int)(blockDim.x >> 5) ? warp_sums[lane] : 0.0;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  }
  return v;
}

// One attempted step in one kernel: blocks of blockDim.x threads (a multiple of 32), M elements a
// thread, dynamic shared memory 2 * blockDim.x * M doubles (two stage inputs, alternating). One
// block (gridDim.x == 1) holds the whole ring: n <= blockDim.x * M. Several blocks each own a tile
// of blockDim.x * M - HALO elements: n >= blockDim.x * M, gridDim.x = ceil(n / tile).
template <int M>
__global__ void tile_step(double* y0, double* y1, double* partial, double* st, int* ist, int* done, double F,
                          int n, double rtol, double atol, double t_end, double t_clip, double coeff1,
                          double coeff2, double safety, double factormin, double factormax) {
  extern __shared__ double buf[];
  __shared__ double warp_sums[32];
  __shared__ int last;
  const int width = blockDim.x * M;      // elements in the buffer: tile and halo
  const int ring = gridDim.x == 1;
  const int m = ring ? n : width;
  const int tile = width - HALO;
  const int first = blockIdx.x * tile;   // the tile's first element (several blocks)
  const int cur = ist[CUR];
  const double h = st[T_NEXT] - st[T_PREV];
  double* y_out = cur ? y0 : y1;
  double* b0 = buf;
  double* b1 = buf + width;
  double y[M], k[6][M];
  int g[M];
  bool act[M], mine[M];
#pragma unroll
  for (int j = 0; j < M; ++j) {
    const int e = threadIdx.x + j * blockDim.x;
    if (ring) {
      act[j] = e < n;
      g[j] = e;
      mine[j] = act[j];
    } else {
      const int x = first - HALO_LEFT + e;  // in [-HALO_LEFT, n + width): n >= width, one wrap
      g[j] = x < 0 ? x + n : (x >= n ? x - n : x);
      act[j] = true;
      mine[j] = e >= HALO_LEFT && e < HALO_LEFT + tile && x < n;
    }
    // Both buffers loaded at once, the one cur names kept: no load waits for cur's.
    const double a = act[j] ? y0[g[j]] : 0.0, b = act[j] ? y1[g[j]] : 0.0;
    y[j] = cur ? b : a;
    b0[e] = y[j];
  }
  __syncthreads();
  // k1 = f(y) and stage 2's input, then stages 2..6: k_s = f(Y_s) and Y_{s+1} (Y_7 = y_new, in b0).
#pragma unroll
  for (int j = 0; j < M; ++j) {
    const int e = threadIdx.x + j * blockDim.x;
    if (act[j]) {
      k[0][j] = l96_buf(b0, e, m, ring, F);
      b1[e] = y[j] + h * (A[2][0] * k[0][j]);
    }
  }
#pragma unroll
  for (int s = 2; s <= 6; ++s) {
    const double* in = (s & 1) ? b0 : b1;
    double* next = (s & 1) ? b1 : b0;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < M; ++j) {
      const int e = threadIdx.x + j * blockDim.x;
      if (act[j]) {
        const double ks = l96_buf(in, e, m, ring, F);
        k[s - 1][j] = ks;
        double acc = A[s + 1][s - 1] * ks;
#pragma unroll
        for (int i = 0; i < s - 1; ++i) acc += A[s + 1][i] * k[i][j];
        next[e] = y[j] + h * acc;
      }
    }
  }
  __syncthreads();
  double e2 = 0.0;
#pragma unroll
  for (int j = 0; j < M; ++j) {
    const int e = threadIdx.x + j * blockDim.x;
    if (mine[j]) {
      const double y_new = b0[e];
      const double k7 = l96_buf(b0, e, m, ring, F);
      double err = E[6] * k7;
#pragma unroll
      for (int i = 0; i < 6; ++i) err += E[i] * k[i][j];
      const double scaled = h * err / (atol + rtol * fmax(fabs(y[j]), fabs(y_new)));
      e2 += scaled * scaled;
      y_out[g[j]] = y_new;
    }
  }
  double total = block_total(e2, warp_sums);
  if (gridDim.x > 1) {
    if (threadIdx.x == 0) {
      partial[blockIdx.x] = total;
      __threadfence();  // the partial is visible before the count says so
      last = atomicAdd(&ist[BLOCKS_DONE], 1) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    double s = 0.0;  // L2 loads (__ldcg): other SMs wrote the partials
    for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x) s += __ldcg(&partial[b]);
    total = block_total(s, warp_sums);
    if (threadIdx.x == 0) ist[BLOCKS_DONE] = 0;
  }
  if (threadIdx.x == 0)
    control(total, st, ist, done, n, t_end, t_clip, coeff1, coeff2, safety, factormin, factormax);
}
