// Bind or copy, and which executable: what each way of meeting XLA's buffers
// costs, for the launch path of the replay handler. Included by graph_table.h
// and replay.cc.
//
// A bound buffer costs nothing while XLA's address for it is one an
// executable already holds; a new address costs a rewrite of every kernel
// argument that points at it (its "sites"), or a new executable. A copied
// buffer costs a device-to-device copy on every call (in, and out when it is
// also an output), whatever XLA's addresses do. So:
//
// - Executables are kept per set of XLA addresses, up to max_execs per graph:
//   four, fewer when one executable is large (its device memory is measured
//   at registration), so a huge graph keeps one. A call whose addresses some
//   executable holds launches it as it is (found by a hash of the bound
//   addresses, then compared): XLA alternating between buffers (A/B) costs
//   nothing once each set has its executable. Otherwise a new executable is
//   made while there is room, else the closest one is rewritten in place.
// - At registration, a graph with room for one executable copies the buffers
//   with so many sites that rewriting them once costs more than many copies
//   (state updated in place by every kernel).
// - At run time, a bound buffer whose address keeps missing (new, with no room
//   for another executable, on a large share of the calls) switches to copying
//   once its measured rewrite cost per call exceeds the copy's. The switch is
//   for good: the buffer's sites go back to its static array, in place in the
//   executables for a few sites, else by dropping them.
//
// On the H100 (benchmarks/scale.py, results/nvidia-h100-80gb-hbm3-scale.json,
// commit 3949ec3): one executable of 100k add_one kernels takes 220 MB of
// device memory (and ~560 MB of host memory), so such a graph keeps one;
// rewriting one site in place, the launch after it included, cost 2.9-4.0 us
// per call at 100k kernels and 5.9-35 us at 10k; cudaGraphLaunch itself took
// 25-173 us of host time at 10k kernels and 733-802 us at 100k (7-8 ns per
// node), hits or not.
//
// Each decision leaves its reason, with the figures, in the buffer's binding
// (BindMode::kCopiedByCost), which Replayable.bindings shows.

#ifndef JAXGRAPH_FFI_BIND_POLICY_H_
#define JAXGRAPH_FFI_BIND_POLICY_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.h"
#include "device_graph.h"
#include "graph_binding.h"

namespace jaxgraph {

// ---------------------------------------------------------------------------
// The cost model
// ---------------------------------------------------------------------------

// Host ns to rewrite one kernel argument in an executable, until measured (a
// middle ground: see the figures above).
constexpr double kSiteNsGuess = 1000.0;
// One executable's device memory per kernel node, where registration could not measure it.
constexpr double kExecBytesPerNodeGuess = 2048.0;
// Device memory a graph's executables may take together before it keeps fewer than kMaxExecs.
constexpr double kExecBudgetBytes = 128.0 * (1 << 20);
// Registration copies a buffer when rewriting its sites once costs this many copies.
constexpr double kCopiesPerRewrite = 16.0;
// A run-time switch needs this many calls of the graph and of misses of the buffer.
constexpr uint64_t kWarmCalls = 8;
constexpr uint32_t kMinMisses = 4;
// A never-launched executable (the first call) is instantiated afresh when this
// many sites differ, else rewritten in place (see device_graph.h: an updated
// kernel runs slower on every later launch).
constexpr size_t kRebindWorthAnExec = 8;

// One device-to-device copy of `bytes` on XLA's stream, in ns, as the model
// assumes it: the call and the copy's launch (host and device time) plus the
// bytes at 1 TB/s.
inline double CopyNs(uint64_t bytes) { return 2500.0 + static_cast<double>(bytes) / 1000.0; }

// How many executables a graph keeps, from one executable's device memory
// (`exec_bytes`, -1 unknown: estimated from its `nodes`).
inline size_t ExecBudget(int64_t exec_bytes, size_t nodes) {
  double bytes = exec_bytes >= 0 ? static_cast<double>(exec_bytes)
                                 : kExecBytesPerNodeGuess * static_cast<double>(nodes);
  double room = bytes > 0 ? kExecBudgetBytes / bytes : static_cast<double>(kMaxExecs);
  return std::clamp<size_t>(static_cast<size_t>(std::min(room, 1e6)), 1, kMaxExecs);
}

// Registration: copy a buffer with `sites` when the graph keeps one executable
// and rewriting them once costs more than kCopiesPerRewrite copies (`copy_ns`).
inline bool CopyAtRegistration(size_t sites, double copy_ns, size_t max_execs) {
  return max_execs <= 1 && kSiteNsGuess * static_cast<double>(sites) > kCopiesPerRewrite * copy_ns;
}

// After `calls` calls of the graph, `misses` of which found the buffer's
// address in no executable and no room for another (so its sites were
// rewritten in place): copy when the rewrites cost more per call than
// the copy (`site_ns`: measured host ns per site rewritten, -1 unknown).
inline bool CopyAfterMisses(uint32_t misses, uint64_t calls, size_t sites, double site_ns, double copy_ns) {
  if (calls < kWarmCalls || misses < kMinMisses) return false;
  double share = static_cast<double>(misses) / static_cast<double>(calls);
  return share * (site_ns >= 0 ? site_ns : kSiteNsGuess) * static_cast<double>(sites) > copy_ns;
}

// Buffers that are one static array with buffer `i`: itself, and the inputs
// paired with an output (XLA gives them one buffer).
inline std::vector<size_t> SameArray(const DeviceGraph& g, size_t i) {
  size_t out = i;
  if (i < g.num_inputs) {
    if (g.alias[i] < 0) return {i};
    out = g.num_inputs + static_cast<size_t>(g.alias[i]);
  }
  std::vector<size_t> group{out};
  for (size_t j = 0; j < g.num_inputs; ++j) {
    if (g.alias[j] >= 0 && g.num_inputs + static_cast<size_t>(g.alias[j]) == out) group.push_back(j);
  }
  return group;
}

// Copies per call if the array of buffer `i` were copied: in for inputs, out for outputs.
inline double CopyCost(const DeviceGraph& g, size_t i) {
  double ns = 0;
  for (size_t j : SameArray(g, i)) ns += CopyNs(g.buffers[j].bytes);
  return ns;
}

// "1.5 ms" / "12 us" / "3.2 MB", for reasons people read.
inline std::string Figure(double value, const char* const units[], double step) {
  int u = 0;
  while (value >= step && units[u + 1] != nullptr) value /= step, ++u;
  char text[32];
  std::snprintf(text, sizeof(text), value < 10 ? "%.1f %s" : "%.0f %s", value, units[u]);
  return text;
}
inline std::string Nanoseconds(double ns) {
  static const char* const units[] = {"ns", "us", "ms", "s", nullptr};
  return Figure(ns, units, 1000.0);
}
inline std::string Bytes(double bytes) {
  static const char* const units[] = {"bytes", "KB", "MB", "GB", nullptr};
  return Figure(bytes, units, 1024.0);
}

// While alive, this thread may make, destroy and upload executables even while
// another thread captures in global mode (as PyTorch lets its allocator do):
// XLA calls the handler on its own thread at any time.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() : exchanged_(cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess) {}
  ~RelaxedCaptureMode() {
    if (exchanged_) cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool exchanged_;
};

// ---------------------------------------------------------------------------
// Switching a buffer to copying
// ---------------------------------------------------------------------------

// Copies buffer `i` (and the buffers of its static array) from now on: their
// sites point at the static array again, in the template and the executables
// kept (those pointing elsewhere are dropped; one in flight is freed by the
// driver when it completes). Call between calls, never between a launch and
// its copies out.
inline ffi::Error SwitchToCopy(DeviceGraph* g, size_t i, const std::string& why) {
  RelaxedCaptureMode relaxed;  // executables may be destroyed below
  std::vector<size_t> group = SameArray(*g, i);
  RetargetAll(g, g->template_addr);  // the node copies as the template has them, but for the group
  std::vector<uint64_t> want = g->template_addr;
  std::vector<std::pair<BindMode, std::string>> before;  // restored if the template cannot be written
  for (size_t j : group) {
    Binding& b = g->buffers[j];
    before.emplace_back(b.mode, b.reason);
    b.mode = BindMode::kCopiedByCost;
    b.reason = why;
    Retarget(b, b.base, &g->nodes);
    g->nodes_addr[j] = b.base;
    want[j] = b.base;
  }
  // The template first, while the buffers are still in `bound` (MarkChanged walks it).
  MarkChanged(g, &g->template_addr, want);
  ffi::Error e = WriteMarked(g, nullptr);
  if (e.failure()) {
    // Some template nodes may still hold an old XLA address: the buffers stay
    // bound, and the forgotten record makes the next call rewrite every site.
    ForgetAddresses(&g->template_addr);
    for (size_t k = 0; k < group.size(); ++k) {
      std::tie(g->buffers[group[k]].mode, g->buffers[group[k]].reason) = before[k];
    }
    return e;
  }
  g->bound.erase(std::remove_if(g->bound.begin(), g->bound.end(),
                                [&](size_t j) { return std::find(group.begin(), group.end(), j) != group.end(); }),
                 g->bound.end());
  // Executables pointing the array elsewhere: a few sites are rewritten in
  // place, else they are dropped (instantiating one afresh costs less than
  // rewriting many).
  size_t sites = 0;
  for (size_t j : group) sites += g->buffers[j].sites.size();
  std::vector<ExecSlot> kept;
  kept.reserve(kMaxExecs);  // PrepareExec adds to it without moving the others
  for (ExecSlot& slot : g->slots) {
    bool at_static = true;
    for (size_t j : group) at_static &= slot.addr[j] == g->buffers[j].base;
    if (!at_static && !g->borrowed_exec && sites <= kRebindWorthAnExec) {
      RetargetAll(g, slot.addr);  // the other buffers' arguments as this executable has them
      for (size_t j : group) {
        for (const Site& site : g->buffers[j].sites) Mark(g, site.node);
      }
      at_static = !WriteMarked(g, slot.exec).failure();
      for (size_t j : group) slot.addr[j] = g->buffers[j].base;
    }
    if (at_static) {
      kept.push_back(std::move(slot));
    } else if (!g->borrowed_exec) {
      cudaGraphExecDestroy(slot.exec);
    }
  }
  g->slots = std::move(kept);
  for (ExecSlot& slot : g->slots) slot.key = BoundKey(*g, slot.addr);
  counters.to_copy.fetch_add(1, std::memory_order_relaxed);
  return e;
}

// ---------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------

// The first executable, at the static addresses, uploaded now (so the first
// call only launches) and weighed: its device memory sets how many
// executables the graph keeps. Throws on CUDA errors making it.
inline void AddFirstSlot(DeviceGraph* g) {
  RelaxedCaptureMode relaxed;  // it also queries and synchronizes its own stream
  cudaStream_t stream = nullptr;  // made before the first measurement: its resources are not the graph's
  bool measured = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess;
  size_t free_before = 0, free_after = 0, total = 0;
  measured &= measured && cudaMemGetInfo(&free_before, &total) == cudaSuccess;
  int64_t host_before = ResidentBytes();
  try {
    ExecSlot& slot = AddSlot(g);
    measured &= measured && cudaGraphUpload(slot.exec, stream) == cudaSuccess &&
                cudaStreamSynchronize(stream) == cudaSuccess && cudaMemGetInfo(&free_after, &total) == cudaSuccess;
    g->memory.exec_host = Grown(host_before, ResidentBytes());
  } catch (...) {
    if (stream != nullptr) cudaStreamDestroy(stream);
    throw;
  }
  if (stream != nullptr) cudaStreamDestroy(stream);
  cudaGetLastError();  // an upload that failed is only a measurement lost
  g->memory.exec_device = measured ? static_cast<int64_t>(free_before > free_after ? free_before - free_after : 0)
                                    : -1;
  g->max_execs = ExecBudget(g->memory.exec_device, g->nodes.size());
}

// With room for one executable, copies the buffers whose sites cost more to
// rewrite once than kCopiesPerRewrite copies: every new XLA address would
// rewrite them all. The template and the executable are at the static arrays.
inline void ChooseAtRegistration(DeviceGraph* g) {
  for (size_t i : std::vector<size_t>(g->bound)) {
    if (g->buffers[i].mode != BindMode::kBound) continue;  // switched with its array already
    double rewrite = kSiteNsGuess * static_cast<double>(g->buffers[i].sites.size());
    double copy = CopyCost(*g, i);
    if (!CopyAtRegistration(g->buffers[i].sites.size(), copy, g->max_execs)) continue;
    int64_t bytes = g->memory.exec_device;
    std::string exec = bytes >= 0 ? Bytes(static_cast<double>(bytes)) : "an estimated " +
                       Bytes(kExecBytesPerNodeGuess * static_cast<double>(g->nodes.size()));
    (void)SwitchToCopy(g, i, std::to_string(g->buffers[i].sites.size()) + " kernel arguments point at it and the "
                       "graph keeps one executable (" + exec + " of device memory), so every new XLA address "
                       "would rewrite them all (~" + Nanoseconds(rewrite) + "), where copying it costs ~" +
                       Nanoseconds(copy) + " per call: copied");
  }
}

// ---------------------------------------------------------------------------
// Choosing the executable, and adapting
// ---------------------------------------------------------------------------

// What PrepareExec did: launched as it was, rewrote sites in place, or made an executable.
struct Prepared {
  ExecSlot* slot = nullptr;
  size_t rewritten = 0;  // sites rewritten in place
  bool instantiated = false;
};

// The executable to launch for `addresses` (see the top of this file).
inline ffi::Error PrepareExec(DeviceGraph* g, const std::vector<uint64_t>& addresses, Prepared* out) {
  uint64_t key = BoundKey(*g, addresses);
  ExecSlot* pick = nullptr;
  for (ExecSlot& slot : g->slots) {
    if (slot.key == key && Cost(*g, slot, addresses) == 0) {
      pick = &slot;
      break;
    }
  }
  if (pick == nullptr) {
    size_t best = SIZE_MAX;
    for (ExecSlot& slot : g->slots) {
      size_t cost = Cost(*g, slot, addresses);
      if (cost < best || (cost == best && slot.last_use < pick->last_use)) {
        pick = &slot;
        best = cost;
      }
    }
    if (pick == nullptr || (pick->last_use == 0 && best >= kRebindWorthAnExec) ||
        (pick->last_use != 0 && g->slots.size() < g->max_execs)) {
      if (pick != nullptr && pick->last_use != 0) pick = nullptr;  // a new slot; the never-launched one is replaced
      RelaxedCaptureMode relaxed;
      if (auto e = InstantiateAt(g, addresses, &pick); e.failure()) return e;
      out->instantiated = true;
    } else {
      // No room for another executable: the buffers that moved are misses (Adapt).
      for (size_t i : g->bound) g->misses[i] += pick->addr[i] != addresses[i] ? 1 : 0;
      RetargetAll(g, addresses);
      MarkChanged(g, &pick->addr, addresses);
      if (auto e = WriteMarked(g, pick->exec); e.failure()) {
        ForgetAddresses(&pick->addr);
        return e;
      }
      pick->key = key;
      out->rewritten = best;
    }
  }
  pick->last_use = ++g->calls;
  out->slot = pick;
  return ffi::Error::Success();
}

// Learns what a rewrite in place costs, per site: the host time of the
// rewrite (`prepare_ns`), plus what the launch after it took over a launch
// after none (`launch_ns`; the driver may upload the changed nodes then).
inline void NoteLaunch(DeviceGraph* g, const Prepared& p, double prepare_ns, double launch_ns) {
  if (p.instantiated) return;
  if (p.rewritten == 0) {
    g->hit_launch_ns = g->hit_launch_ns < 0 ? launch_ns : 0.9 * g->hit_launch_ns + 0.1 * launch_ns;
    return;
  }
  double slower = g->hit_launch_ns >= 0 ? std::max(0.0, launch_ns - g->hit_launch_ns) : 0.0;
  double per_site = (prepare_ns + slower) / static_cast<double>(p.rewritten);
  g->site_ns = g->site_ns < 0 ? per_site : 0.75 * g->site_ns + 0.25 * per_site;
}

// After a call (its copies out enqueued): switches to copying each bound
// buffer whose misses cost more per call than copying it would.
inline ffi::Error Adapt(DeviceGraph* g) {
  for (size_t i : std::vector<size_t>(g->bound)) {
    const Binding& b = g->buffers[i];
    if (b.mode != BindMode::kBound || g->misses[i] < kMinMisses) continue;  // switched already, or no cause
    double copy = CopyCost(*g, i);
    if (!CopyAfterMisses(g->misses[i], g->calls, b.sites.size(), g->site_ns, copy)) continue;
    double rewrite = (g->site_ns >= 0 ? g->site_ns : kSiteNsGuess) * static_cast<double>(b.sites.size());
    std::string why = "its address was new on " + std::to_string(g->misses[i]) + " of " +
                      std::to_string(g->calls) + " calls and " + std::to_string(b.sites.size()) +
                      " kernel arguments point at it: rewriting them costs ~" + Nanoseconds(rewrite) +
                      ", copying it ~" + Nanoseconds(copy) + " per call: copied";
    if (auto e = SwitchToCopy(g, i, why); e.failure()) return e;
  }
  return ffi::Error::Success();
}

}  // namespace jaxgraph

#endif  // JAXGRAPH_FFI_BIND_POLICY_H_
