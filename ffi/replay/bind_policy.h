// Bind or copy: what each way of meeting XLA's buffers costs, for the launch
// path of the replay handler. Included by graph_table.h and replay.cc.
//
// A bound buffer costs nothing while XLA's address for it is one an
// executable already holds; a new address costs a new executable, or a
// rewrite of every kernel argument that points at it (its "sites"): which
// executable a call takes is exec_cache.h. A copied buffer costs a
// device-to-device copy on every call (in, and out when it is also an
// output), whatever XLA's addresses do. So:
//
// - At registration, a graph with room for one executable copies the buffers
//   with so many sites that rewriting them once costs more than many copies
//   (state updated in place by every kernel).
// - At run time, a bound buffer whose address keeps missing (new, with no room
//   for another executable, so one was replaced, on a large share of the
//   recent calls) switches to copying once what a miss costs (a rewrite of
//   its sites at the measured cost per site, or a fresh executable, whichever
//   is less) per call exceeds the copy's. Misses are counted over recent calls
//   only (halved every kMissWindow calls), and filling a free slot is no miss,
//   so a buffer whose misses stop once the cache is warm is not switched.
// - The switch is for good: the buffer's sites go back to its static array, in
//   place in the executables for a few sites, else by dropping them. A switch
//   back when its addresses settle is not made: once copied, XLA's addresses
//   for it are no longer seen by the cache, and going back would make every
//   executable kept stale at once (each rewritten or made afresh), so it
//   would need its own record of addresses and its own cost rule.
//
// On the H100 (benchmarks/scale.py, results/nvidia-h100-80gb-hbm3-scale.json,
// commit 3949ec3): rewriting one site in place, the launch after it included,
// cost 2.9-4.0 us per call at 100k kernels and 5.9-35 us at 10k;
// cudaGraphLaunch itself took 25-173 us of host time at 10k kernels and
// 733-802 us at 100k (7-8 ns per node), hits or not. A copy's host time is
// measured (the process's copies so far, counters.copy_ns): inside JAX it was
// 3.5-13 us per cudaMemcpyAsync of 4 KB (results/nvidia-h100-80gb-hbm3-run*.json
// and -scale.json at ef0ef12), where the model had assumed 1.5 us. At those
// prices a buffer with one site is cheaper to follow by a rewrite (one
// kernel argument, ~4 us, and nothing added on the device) than to copy. Not
// in a graph that copies by nodes of its executable (copy_nodes.h): there a
// copy costs the host one stored address, so a buffer whose address keeps
// missing switches to copying even with one site.
//
// Each decision leaves its reason, with the figures, in the buffer's binding
// (BindMode::kCopiedByCost), which Replayable.bindings shows.

#ifndef JAXGRAPH_FFI_BIND_POLICY_H_
#define JAXGRAPH_FFI_BIND_POLICY_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.h"
#include "device_graph.h"
#include "exec_cache.h"
#include "graph_binding.h"

namespace jaxgraph {

// Host ns a call spends on one buffer copied by a copy node (copy_nodes.h): one
// address stored in the ring (a store to pinned memory; not measured, the model's price).
constexpr double kRingCopyHostNs = 100.0;

// ---------------------------------------------------------------------------
// The cost model
// ---------------------------------------------------------------------------

// Registration copies a buffer when rewriting its sites once costs this many copies.
constexpr double kCopiesPerRewrite = 16.0;
// A run-time switch needs this many recent calls of the graph and misses of the buffer.
constexpr uint64_t kWarmCalls = 8;
constexpr uint32_t kMinMisses = 4;
// One device-to-device copy of `bytes` on XLA's stream, in ns: the host's
// cudaMemcpyAsync (`host_ns`), the copy's start on the device and the bytes at
// 1 TB/s (assumed, not measured).
// Until the process has copied: inside JAX a cudaMemcpyAsync took 3.5-13 us (above), alone
// ~4 us (benchmarks/probes/handler_parts_probe.py, tests/GPU_RESULTS.md).
constexpr double kCopyHostNsGuess = 4000.0;
constexpr double kCopyDeviceNs = 1000.0;
inline double CopyNs(uint64_t bytes, double host_ns = kCopyHostNsGuess) {
  return host_ns + kCopyDeviceNs + static_cast<double>(bytes) / 1000.0;
}
// The host time of one cudaMemcpyAsync, from this process's copies so far.
inline double CopyHostNs() {
  int64_t copies = counters.copy.load(std::memory_order_relaxed);
  if (copies < 8) return kCopyHostNsGuess;
  return static_cast<double>(counters.copy_ns.load(std::memory_order_relaxed)) / static_cast<double>(copies);
}

// Registration: copy a buffer with `sites` when the graph keeps one executable
// and rewriting them once costs more than kCopiesPerRewrite copies (`copy_ns`).
inline bool CopyAtRegistration(size_t sites, double copy_ns, size_t max_execs) {
  return max_execs <= 1 && kSiteNsGuess * static_cast<double>(sites) > kCopiesPerRewrite * copy_ns;
}

// What following a new address of a buffer with `sites` costs: a rewrite of
// its sites (`site_ns` per site measured, -1 unknown) or a fresh executable
// (`fresh_ns`, -1 unknown), whichever is less.
inline double MissNs(size_t sites, double site_ns, double fresh_ns) {
  double rewrite = (site_ns >= 0 ? site_ns : kSiteNsGuess) * static_cast<double>(sites);
  return fresh_ns >= 0 ? std::min(rewrite, fresh_ns) : rewrite;
}

// After `calls` recent calls of the graph, `misses` of which found the
// buffer's address in no executable and no room for another (so one was
// replaced): copy when the misses cost more per call than the copy, by enough
// that kMissWindow calls of the difference pay for the switch itself
// (`switch_ns`: what the switch itself costs. Adapt passes nothing: a large
// graph's copy nodes are in its executables from registration, copy_nodes.h,
// where adding them later made the executable afresh, 0.8-1.8 s at 100k).
inline bool CopyAfterMisses(uint32_t misses, uint64_t calls, size_t sites, double site_ns, double copy_ns,
                            double fresh_ns = -1, double switch_ns = 0) {
  if (calls < kWarmCalls || misses < kMinMisses) return false;
  double share = static_cast<double>(misses) / static_cast<double>(calls);
  return share * MissNs(sites, site_ns, fresh_ns) - copy_ns > switch_ns / static_cast<double>(kMissWindow);
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
  for (size_t j : SameArray(g, i)) {
    // A copy node runs on every call, copying or not: copying adds its address and the bytes.
    ns += HasCopyNodes(g) ? CopyNs(g.buffers[j].bytes, kRingCopyHostNs) - kCopyDeviceNs
                          : CopyNs(g.buffers[j].bytes, CopyHostNs());
  }
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
  counters.to_copy.fetch_add(1, std::memory_order_relaxed);
  // (A large graph's copy nodes are in its executables already: copy_nodes.h.)
  // Executables pointing the array elsewhere: a few sites are rewritten in
  // place, else they are dropped (instantiating one afresh costs less than
  // rewriting many). Executables that differed only there now hold the same
  // addresses: one is kept.
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
      size_t kernels = g->marked.size();
      at_static = !WriteMarked(g, slot.exec).failure();
      slot.updated = std::min(g->nodes.size(), slot.updated + kernels);
      for (size_t j : group) slot.addr[j] = g->buffers[j].base;
    }
    slot.key = BoundKey(*g, slot.addr);
    bool twin = false;
    for (const ExecSlot& other : kept) twin |= other.key == slot.key && Cost(*g, other, slot.addr) == 0;
    if (at_static && !twin) {
      kept.push_back(std::move(slot));
    } else if (!g->borrowed_exec) {
      cudaGraphExecDestroy(slot.exec);
    }
  }
  g->slots = std::move(kept);
  IndexSlots(g);
  return e;
}

// ---------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------

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
// Adapting
// ---------------------------------------------------------------------------

// After a call (its copies out enqueued): switches to copying each bound
// buffer whose misses cost more per call than copying it would.
inline ffi::Error Adapt(DeviceGraph* g) {
  for (size_t i : std::vector<size_t>(g->bound)) {
    const Binding& b = g->buffers[i];
    if (b.mode != BindMode::kBound || g->misses[i] < kMinMisses) continue;  // switched already, or no cause
    double copy = CopyCost(*g, i);
    if (!CopyAfterMisses(g->misses[i], g->recent_calls, b.sites.size(), g->site_ns, copy, g->fresh_ns)) {
      continue;
    }
    double rewrite = SiteNs(*g) * static_cast<double>(b.sites.size());
    std::string why = "its address was new on " + std::to_string(g->misses[i]) + " of the last " +
                      std::to_string(g->recent_calls) + " calls, with no room for another executable, and " +
                      std::to_string(b.sites.size()) + " kernel arguments point at it: rewriting them costs ~" +
                      Nanoseconds(rewrite) + ", a fresh executable ~" + Nanoseconds(FreshNs(*g)) +
                      ", copying it ~" + Nanoseconds(copy) + " per call: copied";
    if (auto e = SwitchToCopy(g, i, why); e.failure()) return e;
  }
  return ffi::Error::Success();
}

}  // namespace jaxgraph

#endif  // JAXGRAPH_FFI_BIND_POLICY_H_
