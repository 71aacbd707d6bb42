// The kernels of examples/gray_scott.py (it prepends DU, DV, FEED, FEED_KILL, DT, TILE, HALO and TS).
// TS: the side of a square thread block (8, 16 or 32); `fused` always runs 16 x 16.
#ifndef TS
#define TS 16
#endif
#define NT (TS * TS)
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

// The sum of x over the block (a multiple of 32 threads) in a fixed order (deterministic),
// returned to every thread.
__device__ float block_total(float x) {
  __shared__ float warp_sums[32];
  __shared__ float result;
  int t = threadIdx.y * blockDim.x + threadIdx.x, lane = t & 31, warp = t >> 5;
  int warps = blockDim.x * blockDim.y / 32;
  for (int o = 16; o > 0; o /= 2) x += __shfl_down_sync(0xffffffffu, x, o);  // lane 0: its warp's sum
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    x = lane < warps ? warp_sums[lane] : 0.0f;
    for (int o = 16; o > 0; o /= 2) x += __shfl_down_sync(0xffffffffu, x, o);
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
  for (int b = t; b < blocks; b += blockDim.x * blockDim.y) s += __ldcg(partial + b);
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

// `t` <= HALO substeps in one launch, temporally blocked (TS x TS threads): a block loads its
// TILE x TILE tile and a halo HALO wide (periodic: wrapped indices) into shared memory, runs
// substep s on the tile grown by t - s on each side (the points substep s + 1 needs), and writes
// the tile once. With `last`, it ends the step: it also records the total of v (see record).
//
// Written for latency, since a block's work is small: every global load of the tile is issued
// before any shared store; the two ping-pong buffers are separate arrays, and a substep reads all
// its points into registers before it stores any, so no load waits on a store it cannot alias.
#define W (TILE + 2 * HALO)
#define LOAD_SLOTS ((W * W + NT - 1) / NT)  // tile + halo points each thread loads
#define SIDE_SLOTS ((W + TS - 1) / TS)        // rows (and columns) each thread updates per substep

__device__ __forceinline__ int wrap(int i, int nx) { return ((i % nx) + nx) % nx; }

// One substep on the square [lo, hi)^2 of the shared tile: (a, b) -> (a_out, b_out).
__device__ __forceinline__ void substep(const float* __restrict__ a, const float* __restrict__ b,
                                        float* __restrict__ a_out, float* __restrict__ b_out, int lo, int hi) {
  float ru[SIDE_SLOTS][SIDE_SLOTS], rv[SIDE_SLOTS][SIDE_SLOTS];
#pragma unroll
  for (int j = 0; j < SIDE_SLOTS; ++j) {
#pragma unroll
    for (int k = 0; k < SIDE_SLOTS; ++k) {
      int ly = lo + threadIdx.y + TS * j, lx = lo + threadIdx.x + TS * k;
      if (ly < hi && lx < hi) {
        int i = ly * W + lx;
        gray_scott(ru[j][k], rv[j][k], a[i], b[i], a[i - 1], a[i + 1], a[i - W], a[i + W],
                   b[i - 1], b[i + 1], b[i - W], b[i + W]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < SIDE_SLOTS; ++j) {
#pragma unroll
    for (int k = 0; k < SIDE_SLOTS; ++k) {
      int ly = lo + threadIdx.y + TS * j, lx = lo + threadIdx.x + TS * k;
      if (ly < hi && lx < hi) {
        a_out[ly * W + lx] = ru[j][k];
        b_out[ly * W + lx] = rv[j][k];
      }
    }
  }
}

extern "C" __global__ void blocked(float* __restrict__ u_out, float* __restrict__ v_out, float* partial,
                                   unsigned int* arrived, float* masses, int* count, const float* __restrict__ u,
                                   const float* __restrict__ v, int nx, int steps, int last, int t) {
  __shared__ float ua[W * W], va[W * W], ub[W * W], vb[W * W];
  const int tid = threadIdx.y * TS + threadIdx.x;
  const int x0 = blockIdx.x * TILE - HALO, y0 = blockIdx.y * TILE - HALO;
  float lu[LOAD_SLOTS], lv[LOAD_SLOTS];
#pragma unroll
  for (int k = 0; k < LOAD_SLOTS; ++k) {
    int p = tid + NT * k;
    if (p < W * W) {
      int g = wrap(y0 + p / W, nx) * nx + wrap(x0 + p % W, nx);
      lu[k] = __ldg(u + g);
      lv[k] = __ldg(v + g);
    }
  }
#pragma unroll
  for (int k = 0; k < LOAD_SLOTS; ++k) {
    int p = tid + NT * k;
    if (p < W * W) {
      ua[p] = lu[k];
      va[p] = lv[k];
    }
  }
  __syncthreads();
  for (int s = 1; s <= t; ++s) {
    int lo = HALO - t + s, hi = W - lo;  // substep s updates [lo, hi)^2
    if (s & 1) substep(ua, va, ub, vb, lo, hi);
    else substep(ub, vb, ua, va, lo, hi);
    __syncthreads();
  }
  const float* fu = (t & 1) ? ub : ua;
  const float* fv = (t & 1) ? vb : va;
  float vsum = 0.0f;
  for (int ty = threadIdx.y; ty < TILE; ty += TS) {
    int y = blockIdx.y * TILE + ty;
    for (int tx = threadIdx.x; tx < TILE; tx += TS) {
      int x = blockIdx.x * TILE + tx;
      if (x < nx && y < nx) {
        int i = (HALO + ty) * W + HALO + tx;
        u_out[y * nx + x] = fu[i];
        v_out[y * nx + x] = fv[i];
        vsum += fv[i];
      }
    }
  }
  if (last) record(vsum, partial, arrived, masses, count, steps);
}
