// Probe: which way of starting a huge captured graph costs the host least per call?
//
// The replay handler at 100k kernels spends ~14-17 us in cudaGraphLaunch of a
// device-launchable executable and ~10 us pointing its two copy nodes at the
// call's XLA buffers (benchmarks/scale.py). This times, in C++ (no Python in
// the way), on a stream with graphs in flight, for a chain of N `add_one`
// kernels on 1024 floats fed by two alternating input/output pairs (XLA's
// buffers in a feedback loop):
//
//   normal    cudaGraphLaunch of a plain executable
//   devexec   the executable instantiated for device launch (what the handler does now)
//   devcopy   devexec with memcpy nodes before and after, aimed per call (the handler now)
//   ifwrap    a graph of [memcpy in] -> IF node (always true) whose body is the chain
//             as a child graph -> [memcpy out], the memcpy nodes aimed per call
//   ifplain   the same IF wrapper with no copies, nothing aimed
//   tail      a one-node launcher graph whose kernel copies the input and tail-launches the
//             device-launchable chain and then a one-node copy-out graph (CUDA device
//             runtime): per call one kernel-node update of the launcher and its launch
//
// For each: host us per call (median), device us per kernel, and the output
// checked exactly after a run of alternating calls (input + calls * N) read by
// a copy queued on the same stream right after the last call (stream order).
//
//   nvcc -O2 -std=c++17 -arch=sm_90 -rdc=true benchmarks/probes/launch_wrapper_probe.cu \
//        -lcudadevrt -o /tmp/probe && /tmp/probe 100:401 1000:201 10000 100000
//   /tmp/probe bg=event 100000:41     (another thread polling an event meanwhile; see `background`)

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

constexpr int kSize = 1024;
constexpr size_t kBytes = kSize * sizeof(float);

__global__ void add_one(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}

struct Table {  // the copy-out's addresses, written by the launcher for the tail-launched copy
  const float* src;
  float* dst;
};

__global__ void copy_out(const Table* t) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < kSize; i += gridDim.x * blockDim.x) t->dst[i] = t->src[i];
}

__global__ void launcher(cudaGraphExec_t chain, cudaGraphExec_t out, Table* table, const float* in_src,
                         float* in_dst, const float* out_src, float* out_dst) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < kSize; i += gridDim.x * blockDim.x) in_dst[i] = in_src[i];
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    table->src = out_src;
    table->dst = out_dst;
    // Tail launches run in order, after this graph; the stream sees this graph complete only with them.
    if (cudaGraphLaunch(chain, cudaStreamGraphTailLaunch) != cudaSuccess) __trap();
    if (cudaGraphLaunch(out, cudaStreamGraphTailLaunch) != cudaSuccess) __trap();
  }
}

// What else the process does while the calls are timed (the first argument `bg=...`): nothing;
// another thread polling an event (`event`) or the stream (`stream`) in a loop, as PjRt's threads
// wait for XLA's work; or, before each call (untimed), the stream made to wait for an event recorded
// on another stream (`wait`), as XLA orders its streams before a computation; or, before each call
// (untimed), 64 MB of host memory written over (`trash`), so the call finds the CPU caches cold, as
// a handler does after XLA's and Python's work between two calls.
static std::string background = "none";
static cudaStream_t other_stream;
static cudaEvent_t other_event;

static double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static cudaGraph_t Chain(cudaStream_t s, float* x, int n) {
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < n; ++i) add_one<<<4, 256, 0, s>>>(x, kSize);
  CK(cudaStreamEndCapture(s, &g));
  return g;
}

static cudaGraphNode_t Memcpy(cudaGraph_t g, const cudaGraphNode_t* dep, size_t ndep, void* dst, const void* src) {
  cudaGraphNode_t n;
  CK(cudaGraphAddMemcpyNode1D(&n, g, dep, ndep, dst, src, kBytes, cudaMemcpyDeviceToDevice));
  return n;
}

struct Pair {  // XLA's two buffers: call c reads one and writes the other, swapped each call
  float* a;
  float* b;
};

// Runs `calls` calls (call c gets src, dst = a, b for even c, b, a for odd c), timing each on
// the host; `init_at` starts with fresh integers, `poison` (if any) with NaN, and `result` must
// end as init + calls * N, read by a copy queued on the same stream right after the last call:
// a tail launch not ordered with the stream would show here.
static void Run(const char* name, int n, int calls, cudaStream_t s, Pair xla, float* init_at, float* poison,
                float* result, const std::function<void(const float*, float*)>& call) {
  std::vector<float> init(kSize), got(kSize);
  for (int i = 0; i < kSize; ++i) init[i] = float(rand() % 1000);
  CK(cudaMemcpy(init_at, init.data(), kBytes, cudaMemcpyHostToDevice));
  if (poison) CK(cudaMemset(poison, 0xff, kBytes));
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<double> host;
  CK(cudaEventRecord(e0, s));
  std::atomic<bool> stop{false};
  std::thread poller;
  if (background == "event" || background == "stream") {
    CK(cudaEventRecord(other_event, s));
    poller = std::thread([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        cudaError_t e = background == "event" ? cudaEventQuery(other_event) : cudaStreamQuery(s);
        if (e != cudaSuccess && e != cudaErrorNotReady) std::exit(2);
      }
    });
  }
  static std::vector<char> junk(64 << 20);
  for (int c = 0; c < calls; ++c) {
    if (background == "trash") {
      for (size_t i = 0; i < junk.size(); i += 64) junk[i] = char(c + i);
    }
    if (background == "wait") {
      CK(cudaEventRecord(other_event, other_stream));
      CK(cudaStreamWaitEvent(s, other_event, 0));
    }
    float* src = c % 2 ? xla.b : xla.a;
    float* dst = c % 2 ? xla.a : xla.b;
    auto t0 = std::chrono::steady_clock::now();
    call(src, dst);
    host.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  stop = true;
  if (poller.joinable()) poller.join();
  CK(cudaEventRecord(e1, s));
  CK(cudaMemcpyAsync(got.data(), result, kBytes, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  int bad = 0;
  for (int i = 0; i < kSize; ++i) bad += got[i] != init[i] + float(calls) * n;
  double first = host.front();
  host.erase(host.begin());
  std::printf("  %-8s host us/call median %7.2f (first %9.1f)  device us/kernel %.4f  %s\n", name, Median(host),
              first, ms * 1e3 / (double(calls) * n), bad ? "WRONG" : "exact");
  if (bad) std::printf("    %d of %d wrong, e.g. got %g want %g\n", bad, kSize, got[0], init[0] + float(calls) * n);
  std::fflush(stdout);
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}

static void Probe(int n, int calls) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *x, *a, *b;
  Table* table;
  CK(cudaMalloc(&x, kBytes));
  CK(cudaMalloc(&a, kBytes));
  CK(cudaMalloc(&b, kBytes));
  CK(cudaMalloc(&table, sizeof(Table)));
  Pair xla{a, b};
  float* last = calls % 2 ? b : a;  // where the last of `calls` alternating calls writes
  std::printf("N = %d, %d calls each\n", n, calls);
  auto t0 = std::chrono::steady_clock::now();
  cudaGraph_t chain = Chain(s, x, n);
  std::printf("  capture %.2f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  if (n <= 20000) {  // 1.2 ms of host per launch at 100k: known (benchmarks/probes/device_launch_probe.py)
    cudaGraphExec_t e;
    CK(cudaGraphInstantiate(&e, chain, 0));
    Run("normal", n, calls, s, xla, x, nullptr, x, [&](const float*, float*) { CK(cudaGraphLaunch(e, s)); });
    CK(cudaGraphExecDestroy(e));
  }

  cudaGraphExec_t dev;
  CK(cudaGraphInstantiate(&dev, chain, cudaGraphInstantiateFlagDeviceLaunch));
  CK(cudaGraphUpload(dev, s));
  Run("devexec", n, calls, s, xla, x, nullptr, x, [&](const float*, float*) { CK(cudaGraphLaunch(dev, s)); });

  {  // devcopy: the chain cloned with memcpy nodes around it, instantiated for device launch
    cudaGraph_t g;
    CK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t in = Memcpy(g, nullptr, 0, x, a), child, out;
    CK(cudaGraphAddChildGraphNode(&child, g, &in, 1, chain));
    out = Memcpy(g, &child, 1, b, x);
    cudaGraphExec_t e;
    cudaError_t err = cudaGraphInstantiate(&e, g, cudaGraphInstantiateFlagDeviceLaunch);
    if (err != cudaSuccess) {
      std::printf("  devcopy instantiate: %s\n", cudaGetErrorString(err));
      (void)cudaGetLastError();
    } else {
      CK(cudaGraphUpload(e, s));
      Run("devcopy", n, calls, s, xla, a, b, last, [&](const float* src, float* dst) {
        CK(cudaGraphExecMemcpyNodeSetParams1D(e, in, x, src, kBytes, cudaMemcpyDeviceToDevice));
        CK(cudaGraphExecMemcpyNodeSetParams1D(e, out, dst, x, kBytes, cudaMemcpyDeviceToDevice));
        CK(cudaGraphLaunch(e, s));
      });
      CK(cudaGraphExecDestroy(e));
    }
    CK(cudaGraphDestroy(g));
  }

  for (bool copies : {false, true}) {  // ifplain, ifwrap
    cudaGraph_t g;
    CK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle h;
    CK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
    cudaGraphNode_t in = nullptr, cond, out = nullptr;
    if (copies) in = Memcpy(g, nullptr, 0, x, a);
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = h;
    p.conditional.type = cudaGraphCondTypeIf;
    p.conditional.size = 1;
    CK(cudaGraphAddNode(&cond, g, copies ? &in : nullptr, nullptr, copies ? 1 : 0, &p));
    cudaGraph_t body = p.conditional.phGraph_out[0];
    cudaGraphNode_t child;
    cudaError_t err = cudaGraphAddChildGraphNode(&child, body, nullptr, 0, chain);
    if (err != cudaSuccess) {  // child graphs not allowed in a body here: capture the chain into it
      std::printf("  (child graph in an IF body: %s; capturing into the body)\n", cudaGetErrorString(err));
      (void)cudaGetLastError();
      CK(cudaStreamBeginCaptureToGraph(s, body, nullptr, nullptr, 0, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < n; ++i) add_one<<<4, 256, 0, s>>>(x, kSize);
      cudaGraph_t same;
      CK(cudaStreamEndCapture(s, &same));
    }
    if (copies) out = Memcpy(g, &cond, 1, b, x);
    cudaGraphExec_t e;
    t0 = std::chrono::steady_clock::now();
    CK(cudaGraphInstantiate(&e, g, 0));
    CK(cudaGraphUpload(e, s));
    std::printf("  %s instantiate + upload %.2f s\n", copies ? "ifwrap" : "ifplain",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    Run(copies ? "ifwrap" : "ifplain", n, calls, s, xla, copies ? a : x, copies ? b : nullptr, copies ? last : x, [&](const float* src, float* dst) {
      if (copies) {
        CK(cudaGraphExecMemcpyNodeSetParams1D(e, in, x, src, kBytes, cudaMemcpyDeviceToDevice));
        CK(cudaGraphExecMemcpyNodeSetParams1D(e, out, dst, x, kBytes, cudaMemcpyDeviceToDevice));
      }
      CK(cudaGraphLaunch(e, s));
    });
    CK(cudaGraphExecDestroy(e));
    CK(cudaGraphDestroy(g));
  }

  {  // tail: launcher graph -> device-launched chain, then the copy-out graph
    cudaGraph_t og;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    copy_out<<<4, 256, 0, s>>>(table);
    CK(cudaStreamEndCapture(s, &og));
    cudaGraphExec_t oexec;
    CK(cudaGraphInstantiate(&oexec, og, cudaGraphInstantiateFlagDeviceLaunch));
    CK(cudaGraphUpload(oexec, s));
    cudaGraph_t lg;
    CK(cudaGraphCreate(&lg, 0));
    const float* in_src = a;
    float* in_dst = x;
    const float* out_src = x;
    float* out_dst = b;
    void* args[] = {&dev, &oexec, &table, &in_src, &in_dst, &out_src, &out_dst};
    cudaKernelNodeParams kp = {};
    kp.func = (void*)launcher;
    kp.gridDim = dim3(4);
    kp.blockDim = dim3(256);
    kp.kernelParams = args;
    cudaGraphNode_t kn;
    CK(cudaGraphAddKernelNode(&kn, lg, nullptr, 0, &kp));
    cudaGraphExec_t le;
    CK(cudaGraphInstantiate(&le, lg, 0));
    CK(cudaGraphUpload(le, s));
    Run("tail", n, calls, s, xla, a, b, last, [&](const float* src, float* dst) {
      in_src = src;
      out_dst = dst;
      CK(cudaGraphExecKernelNodeSetParams(le, kn, &kp));
      CK(cudaGraphLaunch(le, s));
    });
    in_src = a;  // fixed: a -> x, the chain, x -> a
    out_dst = a;
    CK(cudaGraphExecKernelNodeSetParams(le, kn, &kp));
    Run("tailfix", n, calls, s, xla, a, nullptr, a, [&](const float*, float*) { CK(cudaGraphLaunch(le, s)); });
    CK(cudaGraphExecDestroy(le));
    CK(cudaGraphDestroy(lg));
    CK(cudaGraphExecDestroy(oexec));
    CK(cudaGraphDestroy(og));
  }
  CK(cudaGraphExecDestroy(dev));
  CK(cudaGraphDestroy(chain));
  CK(cudaFree(x));
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(table));
  CK(cudaStreamDestroy(s));
}

// Arguments: [bg=none|event|stream|wait|trash] sizes, each N or N:calls (calls odd; default 21),
// e.g. bg=event 100:401 1000:201 100000.
int main(int argc, char** argv) {
  CK(cudaStreamCreateWithFlags(&other_stream, cudaStreamNonBlocking));
  CK(cudaEventCreateWithFlags(&other_event, cudaEventDisableTiming));
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("bg=", 0) == 0) {
      background = arg.substr(3);
      std::printf("background: %s\n", background.c_str());
      continue;
    }
    size_t colon = arg.find(':');
    int calls = colon == std::string::npos ? 21 : std::atoi(arg.c_str() + colon + 1);
    Probe(std::atoi(arg.c_str()), calls | 1);
  }
  return 0;
}
