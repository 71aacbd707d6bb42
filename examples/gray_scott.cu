// The kernels of examples/gray_scott.py (it prepends DU, DV, FEED, FEED_KILL, DT, TILE and HALO).
// One explicit Euler substep of Gray-Scott at one point, from its value and its four
// neighbours' (west, east, south, north; the Laplacian added in numpy's order).
__device__ __forceinline__ void gray_scott(float& u_out, float& v_out, float u, float v,
                                           float uw, float ue, float us, float un,
                                           float vw, float ve, float vs, float vn) {
  float lu = uw + ue + us + un - 4.0f * u, lv = vw + ve + vs + vn - 4.0f * v;
  float uvv = u * v * v;
  u_out = u + DT * (DU * lu - uvv + FEED * (1.0f - u));
  v_out = v + DT * (DV * lv + uvv - FEED_KILL * v);
}

// The sum of x over a 16 x 16 block in a fixed order (deterministic), returned to every thread.
__device__ float block_total(float x) {
  __shared__ float warp_sums[8];
  __shared__ float result;
  int t = threadIdx.y * blockDim.x + threadIdx.x, lane = t & 31, warp = t >> 5;
  for (int o = 16; o > 0; o /= 2) x += __shfl_down_sync(0xffffffffu, x, o);  // lane 0: its warp's sum
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    x = lane < 8 ? warp_sums[lane] : 0.0f;
    for (int o = 4; o > 0; o /= 2) x += __shfl_down_sync(0xffffffffu, x, o);
    if (lane == 0) result = x;
  }
  __syncthreads();
  return result;  // the next call writes `result` only after a barrier every thread passes after reading it
}

// The step's total of v, recorded by the last block to finish: each block stores its sum of v;
// the last one to arrive adds them in block order, stores masses[*count] (while count < steps),
// advances *count and leaves *arrived at 0 for the next launch. No float atomics: deterministic.
__device__ void record(float vsum, float* partial, unsigned int* arrived, float* masses, int* count, int steps) {
  __shared__ bool last;
  int t = threadIdx.y * blockDim.x + threadIdx.x, blocks = gridDim.x * gridDim.y;
  float mine = block_total(vsum);
  if (t == 0) {
    partial[blockIdx.y * gridDim.x + blockIdx.x] = mine;
    __threadfence();
    last = atomicAdd(arrived, 1u) == blocks - 1;
  }
  __syncthreads();
  if (!last) return;
  float s = 0.0f;
  for (int b = t; b < blocks; b += 256) s += __ldcg(partial + b);
  float total = block_total(s);
  if (t == 0) {
    int c = *count;
    if (c < steps) masses[c] = total;
    *count = c + 1;
    *arrived = 0;
  }
}

// One substep, Laplacian and reaction in one kernel (16 x 16 blocks). With `last`, the step's last
// substep: it also records the total of v (see record).
extern "C" __global__ void fused(float* u_out, float* v_out, float* partial, unsigned int* arrived, float* masses,
                                 int* count, const float* u, const float* v, int nx, int steps, int last) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  float vsum = 0.0f;
  if (x < nx && y < nx) {
    int i = y * nx + x;
    int w = y * nx + (x + nx - 1) % nx, e = y * nx + (x + 1) % nx;
    int s = ((y + nx - 1) % nx) * nx + x, n = ((y + 1) % nx) * nx + x;
    float uo, vo;
    gray_scott(uo, vo, u[i], v[i], u[w], u[e], u[s], u[n], v[w], v[e], v[s], v[n]);
    u_out[i] = uo;
    v_out[i] = vo;
    vsum = vo;
  }
  if (last) record(vsum, partial, arrived, masses, count, steps);
}

// `t` <= HALO substeps in one launch, temporally blocked (16 x 16 threads): a block loads its
// TILE x TILE tile and a halo HALO wide (periodic: wrapped indices) into shared memory, runs
// substep s on the tile grown by t - s on each side (the points substep s + 1 needs), and writes
// the tile once. With `last`, it ends the step: it also records the total of v (see record).
#define W (TILE + 2 * HALO)
__device__ __forceinline__ int wrap(int i, int nx) {
  while (i < 0) i += nx;
  while (i >= nx) i -= nx;
  return i;
}
extern "C" __global__ void blocked(float* u_out, float* v_out, float* partial, unsigned int* arrived, float* masses,
                                   int* count, const float* u, const float* v, int nx, int steps, int last, int t) {
  __shared__ float su[2][W * W], sv[2][W * W];
  int x0 = blockIdx.x * TILE - HALO, y0 = blockIdx.y * TILE - HALO;
  for (int ly = threadIdx.y; ly < W; ly += 16) {
    int row = wrap(y0 + ly, nx) * nx;
    for (int lx = threadIdx.x; lx < W; lx += 16) {
      int g = row + wrap(x0 + lx, nx);
      su[0][ly * W + lx] = u[g];
      sv[0][ly * W + lx] = v[g];
    }
  }
  __syncthreads();
  int cur = 0;
  for (int s = 1; s <= t; ++s) {
    int lo = HALO - t + s, hi = W - lo;  // substep s updates [lo, hi)^2
    const float *a = su[cur], *b = sv[cur];
    float *a_out = su[cur ^ 1], *b_out = sv[cur ^ 1];
    for (int ly = lo + threadIdx.y; ly < hi; ly += 16) {
      for (int lx = lo + threadIdx.x; lx < hi; lx += 16) {
        int i = ly * W + lx;
        gray_scott(a_out[i], b_out[i], a[i], b[i], a[i - 1], a[i + 1], a[i - W], a[i + W],
                   b[i - 1], b[i + 1], b[i - W], b[i + W]);
      }
    }
    __syncthreads();
    cur ^= 1;
  }
  float vsum = 0.0f;
  for (int ty = threadIdx.y; ty < TILE; ty += 16) {
    int y = blockIdx.y * TILE + ty;
    for (int tx = threadIdx.x; tx < TILE; tx += 16) {
      int x = blockIdx.x * TILE + tx;
      if (x < nx && y < nx) {
        int i = (HALO + ty) * W + HALO + tx;
        u_out[y * nx + x] = su[cur][i];
        v_out[y * nx + x] = sv[cur][i];
        vsum += sv[cur][i];
      }
    }
  }
  if (last) record(vsum, partial, arrived, masses, count, steps);
}
