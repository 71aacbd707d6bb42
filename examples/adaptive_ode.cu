// The kernels of examples/adaptive_ode.py (read there into jaxgraph.Kernel): one attempted step is
//   stage_first   commits the previous step if it was accepted (y <- y_new, k1 <- k7: first same
//                 as last), evaluates stage 2 (its input y + h a21 k1 formed on the fly) and forms
//                 stage 3's input; on the first step it also evaluates k1 = f(y);
//   stage (x4)    stages 3 to 6: k_s = f(Y_s) and the next stage's input, the last being y_new;
//   error_control k7 = f(y_new), the embedded error h sum_j e_j k_j scaled by atol + rtol
//                 max(|y|, |y_new|), squared and summed per block; the last block to finish (an
//                 atomic counter) adds the blocks' sums in a fixed order (so every run takes the
//                 same steps), takes the RMS norm, and one thread runs the controller.
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

// Stage 2 (and the commit of the previous step). Reads y_new and k7 when the last step was
// accepted and writes y and k1 from them: other threads read only y_new and k7 then, so
// no thread reads what another writes. On the first step (init) k1 = f(y) is computed here.
extern "C" __global__ void stage_first(double* y, double* K, double* Y3, const double* y_new,
                                       const double* st, const int* ist, double F, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int accepted = ist[ACCEPTED], init = ist[INIT];
  const double* ys = accepted ? y_new : y;
  const double* k1s = accepted ? K + 6 * n : K;
  const double h = st[T_NEXT] - st[T_PREV], c = h * 0.2;
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

// Stage s in 3..6: k_s = f(Ys), and the input of stage s + 1 (for s = 6: the solution y_new).
extern "C" __global__ void stage(double* K, double* Y_next, const double* Ys, const double* y,
                                 const double* st, int s, double F, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const double h = st[T_NEXT] - st[T_PREV];
  const double ks = l96(Ys, i, n, F);
  K[(s - 1) * n + i] = ks;
  double acc = A[s + 1][s - 1] * ks;
  for (int j = 0; j < s - 1; ++j) acc += A[s + 1][j] * K[j * n + i];
  Y_next[i] = y[i] + h * acc;
}

// k7 = f(y_new), the scaled error, its RMS norm over all blocks, and the controller.
extern "C" __global__ void error_control(double* K, double* partial, double* st, int* ist, int* done,
                                         const double* y, const double* y_new, double F, int n,
                                         double rtol, double atol, double t_end, double t_clip,
                                         double coeff1, double coeff2, double safety,
                                         double factormin, double factormax) {
  __shared__ double part[256];
  __shared__ int last;
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  const double h = st[T_NEXT] - st[T_PREV];
  double e2 = 0.0;
  if (i < n) {
    const double k7 = l96(y_new, i, n, F);
    K[6 * n + i] = k7;
    double e = E[6] * k7;
    for (int j = 0; j < 6; ++j) e += E[j] * K[j * n + i];
    const double scaled = h * e / (atol + rtol * fmax(fabs(y[i]), fabs(y_new[i])));
    e2 = scaled * scaled;
  }
  part[threadIdx.x] = e2;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = part[0];
    __threadfence();  // the partial is visible before the count says so
    last = atomicAdd(&ist[BLOCKS_DONE], 1) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  // The last block: add the blocks' sums in a fixed order (L2 loads: other SMs wrote them).
  double s = 0.0;
  for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x) s += __ldcg(&partial[b]);
  part[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  ist[BLOCKS_DONE] = 0;
  // diffrax's PIDController (variant 4, dcoeff = 0) and its clip to t_end.
  const double err = sqrt(part[0] / n);
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
