// One captured graph on one device, as the replay handler holds it: its clone
// of the template (or, for a graph with conditional nodes, which CUDA cannot
// clone, the template itself: conditional_graph.h), how each static buffer
// binds to XLA's, and the executables it keeps, one per set of XLA addresses.
// Also the replay paths, their counters, and the mechanics of rebinding:
// pointing the template's or an executable's kernel arguments at addresses,
// touching only the nodes whose arguments changed. Which executable a call
// takes is exec_cache.h; which buffers are better copied than bound,
// bind_policy.h. Included by exec_cache.h, conditional_graph.h and replay.cc.
//
// Seen on the H100 (driver 580): a kernel node updated in place in an
// executable (cuGraphExecKernelNodeSetParams or cuGraphExecUpdate) runs slower
// on every later launch than in a fresh executable (1.253 vs 1.020 us per
// kernel over 1000 kernels: benchmarks/probes/exec_update_cost.py, results in
// benchmarks/results/nvidia-h100-80gb-hbm3-exec_update.md), so the template's
// nodes are updated instead and instantiated (exec_cache.h weighs the two).

#ifndef JAXGRAPH_FFI_DEVICE_GRAPH_H_
#define JAXGRAPH_FFI_DEVICE_GRAPH_H_

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "copy_ring.h"
#include "graph_binding.h"
#include "graph_splice.h"

namespace jaxgraph {

// The ways one call of the handler replays a graph. The codes cross to
// Python (jaxgraph._jax_interop.replay_boundary.ReplayPath); each path has its own counter.
enum class ReplayPath : int {
  kLaunch = 0,            // cudaGraphLaunch on XLA's stream
  kSpliceNodes = 1,       // its nodes added one by one to XLA's command-buffer capture
  kSpliceWhole = 2,       // one child-graph node of the static template, every buffer copied
  kUncapturedLaunch = 3,  // launched by jaxgraph_replay_uncaptured, which XLA never records
};
// Their names, by code (codes() and counters() in replay.cc).
inline constexpr const char* kPathNames[] = {"launch", "splice_nodes", "splice_whole", "uncaptured_launch"};
inline constexpr int kPaths = static_cast<int>(std::size(kPathNames));

// How the handlers ran graphs, for tests and profiles.
struct ReplayCounters {
  std::atomic<int64_t> paths[kPaths] = {};  // calls per ReplayPath
  std::atomic<int64_t> rebind{0};        // kernel-node argument updates in executables
  std::atomic<int64_t> instantiate{0};   // executables made
  std::atomic<int64_t> copy{0};          // buffers copied in or out
  std::atomic<int64_t> to_copy{0};       // bound buffers switched to copying by their cost (bind_policy.h)
  std::atomic<int64_t> evict{0};         // calls that found no executable and no room: one was replaced
  std::atomic<int64_t> refresh{0};       // executables rewritten in place, made afresh when hit (exec_cache.h)
  std::atomic<int64_t> handler_calls{0};  // calls of the handlers, and their host time:
  std::atomic<int64_t> handler_ns{0};     // what benchmarks/probes/profile_call.py reports
  std::atomic<int64_t> launch_ns{0};      // the part of handler_ns inside cudaGraphLaunch (launch path)
  std::atomic<int64_t> copy_ns{0};        // the part of handler_ns inside cudaMemcpyAsync
  std::atomic<int64_t> prepare_ns{0};     // the part of handler_ns choosing the executable (PrepareExec)
  std::atomic<int64_t> node_copy{0};      // buffers copied by copy nodes of the executable (copy_nodes.h)
  std::atomic<int64_t> ring_wait{0};      // launches that waited for a free entry of the ring (copy_ring.h)

  void Count(ReplayPath path) { paths[static_cast<int>(path)].fetch_add(1, std::memory_order_relaxed); }
};
inline ReplayCounters counters;

// An executable of the graph whose bound sites hold `addr` (per static buffer).
struct ExecSlot {
  cudaGraphExec_t exec = nullptr;
  std::vector<uint64_t> addr;
  uint64_t key = 0;       // BoundKey(addr): finds the slot (DeviceGraph::slot_of)
  uint64_t last_use = 0;  // 0: never launched
  uint64_t launches = 0;  // since it took these addresses
  size_t updated = 0;     // kernels updated in place since it was instantiated (each runs slower)
};

// Executables kept per graph and device, at most (exec_cache.h: fewer when
// large). Lookups are by hash, so the cap bounds memory, not time: 256 of a
// 100-kernel graph take ~60 MB of device memory. 64 was too few for one
// program's address sets: under command buffers off the harness's one
// replayable, met by all its jit modes and call sites, kept evicting at 64 and
// a buffer switched to copying (results at 6c3190c); at 256 nothing is copied
// there (results at ef0ef12).
constexpr size_t kMaxExecs = 256;

// What one registered graph's copies take, measured at registration (-1:
// not measured). Host figures are the process's resident memory before and
// after each step, so they are approximate (another thread's allocations
// count too, memory the allocator reuses does not).
struct GraphMemory {
  int64_t exec_device = -1;  // one executable, uploaded
  int64_t exec_host = -1;    // the same executable's host side
  int64_t clone_host = -1;   // our clone of the template
  int64_t binding_host = -1; // the kernel nodes' argument copies and sites read for binding
};

// The process's resident host memory in bytes (Linux), -1 where it cannot be read.
inline int64_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long pages = 0, resident = 0;
  int read = std::fscanf(f, "%ld %ld", &pages, &resident);
  std::fclose(f);
  return read == 2 ? static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE) : -1;
}

// `after - before` of two ResidentBytes, -1 when either is unknown.
inline int64_t Grown(int64_t before, int64_t after) { return before < 0 || after < 0 ? -1 : after - before; }

// One graph on one device: our clone, its executables, and how each static
// buffer (inputs first, then outputs) is bound.
struct DeviceGraph {
  int device = -1;
  CUgraph graph = nullptr;         // our clone of the template, or the template itself (conditional)
  bool owns_graph = true;          // false: the template, kept alive by the replayable (Python)
  size_t conditionals = 0;         // conditional nodes (any depth): launched, never spliced
  bool detached = false;           // the template's owner reset it: nothing may use it
  bool borrowed_exec = false;      // slots[0] is the CUDAGraph's own executable (conditional_graph.h)
  bool exec_update_whole = false;  // per-node updates refused: update the executable from the template
  size_t num_inputs = 0;
  std::vector<Binding> buffers;    // inputs, then outputs
  std::vector<int> alias;          // per input: the output it shares a buffer with, or -1
  std::vector<size_t> bound;       // indices of bound buffers that have sites
  std::vector<KernelNode> nodes;   // the kernel nodes, with argument copies rebound per call
  std::vector<char> dirty;         // scratch: nodes whose arguments changed this call (Mark)...
  std::vector<size_t> marked;      // ...and their indices, so writing them costs what changed
  std::vector<OrderedNode> order;  // the nodes in dependency order, for splicing
  std::string unflattenable;       // why the nodes cannot be spliced one by one ("" if they can)
  std::vector<uint64_t> static_addr;    // per buffer: its static array
  std::vector<uint64_t> template_addr;  // per buffer: where the clone's nodes point now
  std::vector<uint64_t> nodes_addr;     // per bound buffer: where the argument copies in `nodes` point
  std::vector<cudaGraphNode_t> copy_nodes;  // per buffer: its copy node in the clone, or null (copy_nodes.h)
  cudaGraphNode_t ring_advance = nullptr;   // the node after all others that frees the call's ring entry
  CopyRing ring;                            // the addresses copy nodes read, one entry per call in flight
  std::vector<ExecSlot> slots;     // reserved for kMaxExecs: a slot never moves while others are added
  std::unordered_map<uint64_t, size_t> slot_of;  // BoundKey -> index in slots (IndexSlots)
  uint64_t calls = 0;
  // What the executables cost and what binding costs (bind_policy.h).
  size_t max_execs = kMaxExecs;    // executables kept: fewer when each is large
  GraphMemory memory;              // what its copies of the graph take, measured at registration
  std::vector<uint32_t> misses;    // per buffer: recent calls that found its address in no executable
  uint64_t recent_calls = 0;       // the calls `misses` counts over (both halved now and then: bind_policy.h)
  double site_ns = -1;             // host ns per kernel argument rewritten in place, measured (-1: not yet)
  double fresh_ns = -1;            // host ns to instantiate and upload one executable, measured (-1: not yet)
  double slot_life = -1;           // launches an executable served before it was replaced (average; -1: none yet)
  double hit_launch_ns = -1;       // host ns of cudaGraphLaunch when nothing was rewritten (-1: not yet)
  int capture_policy = -1;         // set by its first recording (capture_policy.h), then kept
  std::vector<uint64_t> streams;   // the streams its calls launched on (not recordings): a free waits for them
  bool device_launchable = false;  // executables instantiated launchable from the device (see Instantiate)
  std::string launch_note;         // why they are not, when the graph is large enough to want it
  std::mutex mutex;                // one call at a time rebinds and launches

  ~DeviceGraph() {
    // An executable still in flight is freed by the driver when it completes.
    for (ExecSlot& slot : slots) {
      if (!borrowed_exec) cudaGraphExecDestroy(slot.exec);
    }
    if (graph != nullptr && owns_graph) cudaGraphDestroy(reinterpret_cast<cudaGraph_t>(graph));
    ring.Release(device);
  }
};

// Whether `g`'s buffers are copied by nodes of its executables (from registration on; copy_nodes.h adds them).
inline bool HasCopyNodes(const DeviceGraph& g) { return g.ring_advance != nullptr; }

// What the top level of a graph holds that decides how it can be replayed.
struct Survey {
  bool memory = false;      // allocates or frees memory in its own nodes
  size_t conditionals = 0;  // conditional nodes (only the top level and bodies may hold them)
};

inline Survey SurveyGraph(CUgraph graph) {
  const DriverApi& d = DriverApi::Get();
  Survey out;
  size_t count = 0;
  std::vector<CUgraphNode> nodes;
  if (!d.get_nodes || !d.node_type) return Survey{true, 0};  // a driver without them: the safe answer
  if (d.get_nodes(graph, nullptr, &count) == CUDA_SUCCESS) {
    nodes.resize(count);
    if (count == 0 || d.get_nodes(graph, nodes.data(), &count) == CUDA_SUCCESS) {
      for (CUgraphNode node : nodes) {
        CUgraphNodeType type;
        if (d.node_type(node, &type) != CUDA_SUCCESS) return Survey{true, 0};
        out.memory |= type == CU_GRAPH_NODE_TYPE_MEM_ALLOC || type == CU_GRAPH_NODE_TYPE_MEM_FREE;
        out.conditionals += type == CU_GRAPH_NODE_TYPE_CONDITIONAL ? 1 : 0;
      }
      return out;
    }
  }
  return Survey{true, 0};  // unknown: the safe answer
}

// Graphs with at least this many kernel nodes get executables instantiated
// launchable from the device (cudaGraphInstantiateFlagDeviceLaunch), which the
// handler still launches from the host: on the H100 such an executable's
// cudaGraphLaunch took 26 us of host time at 100k kernels against 1240 us for
// a normal one, at the same device time per kernel (0.985 vs 0.991 us;
// benchmarks/probes/device_launch_probe.py, its output in tests/GPU_RESULTS.md).
// Process-wide, read at registration; < 0: never (set_device_launch_nodes).
constexpr int64_t kDeviceLaunchNodes = 4096;
inline std::atomic<int64_t> device_launch_nodes{kDeviceLaunchNodes};

// A new executable of the clone, at the template's current addresses. A
// device-launchable one where the graph wants it; if CUDA refuses that (a node
// type it does not allow), a normal one from then on, the reason kept.
inline cudaGraphExec_t Instantiate(DeviceGraph* g) {
  cudaGraphExec_t exec = nullptr;
  cudaError_t err = cudaErrorInvalidValue;
  if (g->device_launchable) {
    err = cudaGraphInstantiate(&exec, reinterpret_cast<cudaGraph_t>(g->graph), cudaGraphInstantiateFlagDeviceLaunch);
    if (err != cudaSuccess) {
      cudaGetLastError();
      g->device_launchable = false;
      g->launch_note = "CUDA refused to instantiate it launchable from the device (" +
                       RuntimeError("cudaGraphInstantiate", err) + "): normal executables";
    }
  }
  if (!g->device_launchable) err = cudaGraphInstantiate(&exec, reinterpret_cast<cudaGraph_t>(g->graph), 0);
  if (err != cudaSuccess) throw std::runtime_error(RuntimeError("cudaGraphInstantiate", err));
  counters.instantiate.fetch_add(1, std::memory_order_relaxed);
  return exec;
}

// A hash of the bound buffers' addresses: equal address sets have equal keys.
inline uint64_t BoundKey(const DeviceGraph& g, const std::vector<uint64_t>& addresses) {
  uint64_t key = 0xcbf29ce484222325ull;
  for (size_t i : g.bound) key = (key ^ addresses[i]) * 0x100000001b3ull;
  return key;
}

// Rebuilds the index from each slot's key (after slots or keys changed: never on a hit).
inline void IndexSlots(DeviceGraph* g) {
  g->slot_of.clear();
  for (size_t s = 0; s < g->slots.size(); ++s) g->slot_of[g->slots[s].key] = s;
}

// The slot whose executable holds `addresses` (`key` their BoundKey), or nullptr:
// one lookup and one comparison, whatever the number of slots.
inline ExecSlot* FindSlot(DeviceGraph* g, uint64_t key, const std::vector<uint64_t>& addresses) {
  auto it = g->slot_of.find(key);
  if (it == g->slot_of.end()) return nullptr;
  ExecSlot& slot = g->slots[it->second];
  for (size_t i : g->bound) {
    if (slot.addr[i] != addresses[i]) return nullptr;
  }
  return &slot;
}

// One more executable slot, at the template's addresses (the static ones when registered).
inline ExecSlot& AddSlot(DeviceGraph* g) {
  ExecSlot slot;
  slot.exec = Instantiate(g);
  slot.addr = g->template_addr;
  slot.key = BoundKey(*g, slot.addr);
  g->slots.push_back(std::move(slot));
  g->slot_of[g->slots.back().key] = g->slots.size() - 1;
  return g->slots.back();
}

// Points every bound buffer's sites at this call's addresses in the nodes'
// argument copies; a buffer whose sites already hold its address is skipped.
inline void RetargetAll(DeviceGraph* g, const std::vector<uint64_t>& addresses) {
  for (size_t i : g->bound) {
    if (g->nodes_addr[i] == addresses[i]) continue;
    Retarget(g->buffers[i], addresses[i], &g->nodes);
    g->nodes_addr[i] = addresses[i];
  }
}

// Marks kernel node `n` as changed (once).
inline void Mark(DeviceGraph* g, size_t n) {
  if (g->dirty[n]) return;
  g->dirty[n] = 1;
  g->marked.push_back(n);
}

inline void ClearMarks(DeviceGraph* g) {
  for (size_t n : g->marked) g->dirty[n] = 0;
  g->marked.clear();
}

// Marks the nodes with a site of a bound buffer whose address in `have`
// differs from `want`, and records `want` there.
inline void MarkChanged(DeviceGraph* g, std::vector<uint64_t>* have, const std::vector<uint64_t>& want) {
  for (size_t i : g->bound) {
    if ((*have)[i] == want[i]) continue;
    for (const Site& site : g->buffers[i].sites) Mark(g, site.node);
    (*have)[i] = want[i];
  }
}

// Writes the marked nodes' argument copies into the template (exec == nullptr)
// or into an executable, clearing the marks; visits only the marked nodes.
inline ffi::Error WriteMarked(DeviceGraph* g, cudaGraphExec_t exec) {
  const DriverApi& d = DriverApi::Get();
  std::vector<size_t> marked;
  marked.swap(g->marked);
  for (size_t i = 0; i < marked.size(); ++i) {
    size_t n = marked[i];
    g->dirty[n] = 0;
    KernelNode& k = g->nodes[n];
    CUresult r = exec == nullptr
                     ? d.set_kernel_params(k.node, &k.params)
                     : d.exec_set_kernel_params(reinterpret_cast<CUgraphExec>(exec), k.node, &k.params);
    if (r != CUDA_SUCCESS) {
      for (size_t j = i + 1; j < marked.size(); ++j) g->dirty[marked[j]] = 0;
      const char* call = exec == nullptr ? "cuGraphKernelNodeSetParams" : "cuGraphExecKernelNodeSetParams";
      return ffi::Error::Internal("jaxgraph_replay: rebinding kernel " + k.name + ": " + DriverError(call, r));
    }
    if (exec != nullptr) counters.rebind.fetch_add(1, std::memory_order_relaxed);
  }
  return ffi::Error::Success();
}

// Addresses no call can have: a record reset to this after a failed rewrite
// (some sites written, some not) makes the next call rewrite every site.
inline void ForgetAddresses(std::vector<uint64_t>* recorded) {
  std::fill(recorded->begin(), recorded->end(), ~uint64_t{0});
}

// Points the template's kernel nodes at `addresses`.
inline ffi::Error PointTemplateAt(DeviceGraph* g, const std::vector<uint64_t>& addresses) {
  RetargetAll(g, addresses);
  MarkChanged(g, &g->template_addr, addresses);
  ffi::Error e = WriteMarked(g, nullptr);
  if (e.failure()) ForgetAddresses(&g->template_addr);
  return e;
}

// A fresh executable at `addresses` in `slot` (nullptr: a new slot; else its
// executable is replaced): the template is pointed at them first, then
// instantiated. An executable updated in place runs each updated kernel
// slower on every later launch (see the top of this file), so a new address
// set that will be seen again gets its own fresh executable rather than an
// updated one (exec_cache.h weighs the two).
inline ffi::Error InstantiateAt(DeviceGraph* g, const std::vector<uint64_t>& addresses, ExecSlot** slot) {
  if (auto e = PointTemplateAt(g, addresses); e.failure()) return e;
  try {
    if (*slot == nullptr) {
      *slot = &AddSlot(g);
      return ffi::Error::Success();
    }
    // Made before the old one goes, which stays usable if this throws. A
    // launch of the old one still in flight completes: the driver frees an
    // executable destroyed in flight when it is done.
    cudaGraphExec_t fresh = Instantiate(g);
    cudaGraphExecDestroy((*slot)->exec);
    (*slot)->exec = fresh;
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jaxgraph_replay: ") + e.what());
  }
  (*slot)->addr = addresses;
  (*slot)->key = BoundKey(*g, addresses);
  (*slot)->last_use = 0;
  (*slot)->launches = 0;
  (*slot)->updated = 0;
  IndexSlots(g);
  return ffi::Error::Success();
}

// Kernel arguments of bound buffers that differ between `slot` and `addresses`.
inline size_t Cost(const DeviceGraph& g, const ExecSlot& slot, const std::vector<uint64_t>& addresses) {
  size_t sites = 0;
  for (size_t i : g.bound) sites += slot.addr[i] == addresses[i] ? 0 : g.buffers[i].sites.size();
  return sites;
}

}  // namespace jaxgraph

#endif  // JAXGRAPH_FFI_DEVICE_GRAPH_H_
