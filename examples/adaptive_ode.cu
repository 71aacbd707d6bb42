// The kernels of examples/adaptive_ode.py (read there into jaxgraph.Kernel): one attempted step is
//   stage_first   commits the previous step if it was accepted (y <- y_new, k1 <- k7: first same
//                 as last), evaluates stage 2 (its input y + h a21 k1 formed on the fly) and forms
//                 stage 3's input; on the first step it also evaluates k1 = f(y);
//   stage (x4)    stages 3 to 6: k_s = f(Y_s) and the next stage's input, the last being y_new;
//   error_control k7 = f(y_new), the embedded error h sum_j e_j k_j scaled by atol + rtol
//                 max(|y|, |y_new|), squared and summed per block; the last block to finish (an
//                 atomic counter) adds the blocks' sums in a fixed order (so every run takes the
//                 same steps), takes the RMS norm, and one thread runs the controller;
//   fused_step    all of the above in ONE kernel of one block (__syncthreads between the stages),
//                 for sizes one block can hold: one kernel node per step instead of six.
// The kernels share the per-element bodies below, so both paths compute the same thing.
// Dormand-Prince 5(4) for Lorenz-96 in float64. K holds k1..k7, each n long.
// st (float64): [t_prev, t_next, inv_prev]; ist (int32): [accepted, init, accepted steps,
// rejected steps, blocks done, done]. The step attempted is [t_prev, t_next].
#define T_PREV 0
#define T_NEXT 1
#define INV_PREV 2
#define ACCEPTED 0
#define INIT 1
#define N_ACCEPTED 2
#define N_REJECTED 3
#define BLOCKS_DONE 4
#define FINISHED 5

// Rows 3..7 of the Butcher matrix (row 7 is the 5th-order weights), and the error weights.
__constant__ double A[8][6] = {
  {0}, {0}, {0},
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
  double factor = safety * pow(inv, coeff1) * pow(st[INV_PREV], coeff2);
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

// The whole step in one block of blockDim.x threads (a power of two, <= 1024), each taking the
// elements i = threadIdx.x + k * blockDim.x: __syncthreads orders the stages.
extern "C" __global__ void fused_step(double* y, double* K, double* Ya, double* Yb, double* y_new, double* st,
                                      int* ist, int* done, double F, int n, double rtol, double atol,
                                      double t_end, double t_clip, double coeff1, double coeff2,
                                      double safety, double factormin, double factormax) {
  __shared__ double part[1024];
  const int accepted = ist[ACCEPTED], init = ist[INIT];
  const double h = st[T_NEXT] - st[T_PREV];
  for (int i = threadIdx.x; i < n; i += blockDim.x) stage_first_at(i, y, K, Ya, y_new, accepted, init, h, F, n);
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) stage_at(i, K, Yb, Ya, y, 3, h, F, n);
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) stage_at(i, K, Ya, Yb, y, 4, h, F, n);
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) stage_at(i, K, Yb, Ya, y, 5, h, F, n);
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) stage_at(i, K, y_new, Yb, y, 6, h, F, n);
  __syncthreads();
  double e2 = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) e2 += error2_at(i, K, y, y_new, h, rtol, atol, F, n);
  part[threadIdx.x] = e2;
  block_sum(part);  // also: every thread has read st and ist before thread 0 writes them
  if (threadIdx.x == 0)
    control(part[0], st, ist, done, n, t_end, t_clip, coeff1, coeff2, safety, factormin, factormax);
}
