// The kernels of examples/gray_scott.py (it prepends DU, DV, FEED, FEED_KILL, DT, TILE, HALO, TS and WARPS).
// TS: the side of `blocked`'s square thread block (8, 16 or 32); `fused` always runs 16 x 16.
// WARPS: the warps of `columns`' block (32 x WARPS threads).
#ifndef TS
#define TS 16
#endif
#ifndef WARPS
#define WARPS 8
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
// The row pitch of the shared tile: W rounded up to TS more than a multiple of 2 TS, so that the rows
// one warp reads (2 of a 16-wide block, 4 of an 8-wide one) fall on disjoint banks: no bank conflicts.
// A 32-wide block reads one row a warp.
#define P (TS >= 32 ? W : W + ((TS - W % (2 * TS)) + 2 * TS) % (2 * TS))
#define LOAD_SLOTS ((W * W + NT - 1) / NT)  // tile + halo points each thread loads
#define SIDE_SLOTS ((W + TS - 1) / TS)        // rows (and columns) each thread updates per substep

// i mod nx for any int; `near` when -nx <= i < 2 nx (a tile and its halo no wider than the grid),
// which needs no division.
__device__ __forceinline__ int wrap(int i, int nx, bool near) {
  if (near) return i < 0 ? i + nx : (i >= nx ? i - nx : i);
  return ((i % nx) + nx) % nx;
}

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
        int i = ly * P + lx;
        gray_scott(ru[j][k], rv[j][k], a[i], b[i], a[i - 1], a[i + 1], a[i - P], a[i + P],
                   b[i - 1], b[i + 1], b[i - P], b[i + P]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < SIDE_SLOTS; ++j) {
#pragma unroll
    for (int k = 0; k < SIDE_SLOTS; ++k) {
      int ly = lo + threadIdx.y + TS * j, lx = lo + threadIdx.x + TS * k;
      if (ly < hi && lx < hi) {
        a_out[ly * P + lx] = ru[j][k];
        b_out[ly * P + lx] = rv[j][k];
      }
    }
  }
}

extern "C" __global__ void blocked(float* __restrict__ u_out, float* __restrict__ v_out, float* partial,
                                   unsigned int* arrived, float* masses, int* count, const float* __restrict__ u,
                                   const float* __restrict__ v, int nx, int steps, int last, int t) {
  __shared__ float ua[W * P], va[W * P], ub[W * P], vb[W * P];
  const int tid = threadIdx.y * TS + threadIdx.x;
  const bool near = W <= nx;
  const int x0 = blockIdx.x * TILE - HALO, y0 = blockIdx.y * TILE - HALO;
  float lu[LOAD_SLOTS], lv[LOAD_SLOTS];
#pragma unroll
  for (int k = 0; k < LOAD_SLOTS; ++k) {
    int p = tid + NT * k;
    if (p < W * W) {
      int g = wrap(y0 + p / W, nx, near) * nx + wrap(x0 + p % W, nx, near);
      lu[k] = __ldg(u + g);
      lv[k] = __ldg(v + g);
    }
  }
#pragma unroll
  for (int k = 0; k < LOAD_SLOTS; ++k) {
    int p = tid + NT * k;
    if (p < W * W) {
      ua[p / W * P + p % W] = lu[k];
      va[p / W * P + p % W] = lv[k];
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
        int i = (HALO + ty) * P + HALO + tx;
        u_out[y * nx + x] = fu[i];
        v_out[y * nx + x] = fv[i];
        vsum += fv[i];
      }
    }
  }
  if (last) record(vsum, partial, arrived, masses, count, steps);
}

// The blocked kernel for a region W = TILE + 2 HALO <= 32 wide, laid out so that substeps need almost no shared
// memory: a block of 32 x WARPS threads, a lane per column and a warp per strip of SH consecutive rows. Each
// thread keeps its strip of u and v in registers for all `t` substeps; its west and east neighbours come from
// the adjacent lanes (warp shuffles) and only the rows above and below its strip through shared memory (each
// strip's first and last row, double-buffered: one barrier a substep). Every point of the region is updated
// each substep; the region's outermost ring, whose neighbours lie outside it, goes wrong by one point a substep
// and never reaches the tile, which is HALO >= t points inside.
#define SH ((W + WARPS - 1) / WARPS)  // rows of a strip

extern "C" __global__ void __launch_bounds__(32 * WARPS) columns(
    float* __restrict__ u_out, float* __restrict__ v_out, float* partial, unsigned int* arrived, float* masses,
    int* count, const float* __restrict__ u, const float* __restrict__ v, int nx, int steps, int last, int t) {
  __shared__ float ends[2][4][WARPS][32];  // [buffer][u first, u last, v first, v last][strip][lane]
  const int lane = threadIdx.x, strip = threadIdx.y, row0 = strip * SH;
  const bool near = W <= nx;
  const int gx = wrap(blockIdx.x * TILE - HALO + lane, nx, near);
  float su[SH], sv[SH];
#pragma unroll
  for (int r = 0; r < SH; ++r) {
    su[r] = 0.0f;
    sv[r] = 0.0f;
    if (lane < W && row0 + r < W) {
      int g = wrap(blockIdx.y * TILE - HALO + row0 + r, nx, near) * nx + gx;
      su[r] = __ldg(u + g);
      sv[r] = __ldg(v + g);
    }
  }
  for (int s = 0; s < t; ++s) {
    float(*e)[WARPS][32] = ends[s & 1];
    e[0][strip][lane] = su[0];
    e[1][strip][lane] = su[SH - 1];
    e[2][strip][lane] = sv[0];
    e[3][strip][lane] = sv[SH - 1];
    __syncthreads();
    const int above = strip > 0 ? strip - 1 : strip, below = strip < WARPS - 1 ? strip + 1 : strip;
    float us_ = e[1][above][lane], vs_ = e[3][above][lane];  // the row before the strip (south, y - 1)
    float un_ = e[0][below][lane], vn_ = e[2][below][lane];  // the row after it (north, y + 1)
    float nu[SH], nv[SH];
#pragma unroll
    for (int r = 0; r < SH; ++r) {
      float uw = __shfl_up_sync(0xffffffffu, su[r], 1), ue = __shfl_down_sync(0xffffffffu, su[r], 1);
      float vw = __shfl_up_sync(0xffffffffu, sv[r], 1), ve = __shfl_down_sync(0xffffffffu, sv[r], 1);
      float us = r > 0 ? su[r - 1] : us_, un = r < SH - 1 ? su[r + 1] : un_;
      float vs = r > 0 ? sv[r - 1] : vs_, vn = r < SH - 1 ? sv[r + 1] : vn_;
      gray_scott(nu[r], nv[r], su[r], sv[r], uw, ue, us, un, vw, ve, vs, vn);
    }
#pragma unroll
    for (int r = 0; r < SH; ++r) {
      su[r] = nu[r];
      sv[r] = nv[r];
    }
  }
  float vsum = 0.0f;
  const int x = blockIdx.x * TILE - HALO + lane;
  if (lane >= HALO && lane < HALO + TILE && x < nx) {
#pragma unroll
    for (int r = 0; r < SH; ++r) {
      int ty = row0 + r - HALO, y = blockIdx.y * TILE + ty;
      if (ty >= 0 && ty < TILE && y < nx) {
        u_out[y * nx + x] = su[r];
        v_out[y * nx + x] = sv[r];
        vsum += sv[r];
      }
    }
  }
  if (last) record(vsum, partial, arrived, masses, count, steps);
}
