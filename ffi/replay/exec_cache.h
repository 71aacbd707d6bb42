// Which executable a launch takes: the cache of a graph's executables, one
// per set of XLA addresses, and what making, rewriting and evicting them
// costs. Included by bind_policy.h (which decides bind or copy per buffer).
//
// - A graph keeps up to max_execs executables: kMaxExecs (256), fewer when one
//   is large (its device memory is measured at registration, and they share
//   kExecBudgetBytes); a graph of kOneExecNodes kernels or more keeps one.
//   One program commonly meets a graph with dozens of address sets (XLA
//   alternating its buffers, several call sites in one jit, rotating inputs),
//   each recurring.
// - A call whose addresses an executable holds launches it as it is: one hash
//   lookup (BoundKey -> slot) and one comparison of the bound addresses.
// - A new address set fills a free slot with a fresh executable. With no room,
//   it replaces one: the least recently used, by a fresh executable at the new
//   addresses, when instantiating costs less than rewriting the closest
//   executable in place plus the lasting cost of that rewrite: each kernel
//   updated in place runs slower on every later launch of the executable
//   (kUpdatedKernelNs), for as many launches as an executable lives here
//   before it is replaced (slot_life, learnt from the ones replaced). Else the
//   closest executable (fewest kernel arguments to rewrite) is rewritten.
// - An executable rewritten in place whose addresses recur is made afresh once
//   the slowdown it costs over its expected launches (the larger of slot_life
//   and the launches it served so far) reaches the cost of a fresh one: at once
//   when executables live long, else after it has cost that much (a rent-or-buy
//   rule, never more than twice the better of the two choices).
// - Only replacements are misses (bind_policy.h's Adapt weighs them): filling a
//   free slot is paid once per address set, while a graph whose addresses keep
//   replacing executables pays on every call.
//
// Figures. Measured on the H100 (driver 580; benchmarks/probes/exec_update_cost.py,
// results/nvidia-h100-80gb-hbm3-exec_update.md, commit 0484762), a chain of
// 1000 add_one kernels: with every kernel node rewritten in place by
// cuGraphExecKernelNodeSetParams (as the cache does) each runs 0.233 us
// slower on every later launch (1.253 vs 1.020 us per kernel), whether the
// values changed or not, as after cuGraphExecUpdate (+0.232 us); with one node
// of the 1000 rewritten, +3.3 us per launch (+0.003 us per kernel), so the
// slowdown follows the kernels rewritten. (Fresh executables other than the
// first measured ran +1.4-1.6 us per launch, so a fixed part of a few us per
// launch of a rewritten executable is within the noise; the model counts
// kUpdatedKernelNs per rewritten kernel only.) One executable takes 2.3 KB of
// device memory per kernel node: 220 MB at 100k add_one kernels, 22 MB at
// 10k (results/nvidia-h100-80gb-hbm3-scale.json, commit 3949ec3). Each
// graph's instantiation time and rewrite time per argument are measured at
// run time (fresh_ns at registration, site_ns at the first rewrite), not
// taken from a results file; the guesses below serve only until then and are
// not measured.

#ifndef JAXGRAPH_FFI_EXEC_CACHE_H_
#define JAXGRAPH_FFI_EXEC_CACHE_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "common.h"
#include "device_graph.h"

namespace jaxgraph {

// ---------------------------------------------------------------------------
// The cost model
// ---------------------------------------------------------------------------

// Host ns to rewrite one kernel argument in an executable, until measured (a
// middle ground of the scale run's 0.3-35 us per site: not a measurement).
constexpr double kSiteNsGuess = 1000.0;
// Host ns per kernel node to instantiate and upload an executable, until measured (a guess).
constexpr double kFreshNsPerNodeGuess = 2000.0;
// What a kernel updated in place costs on every later launch (measured: see above).
constexpr double kUpdatedKernelNs = 233.0;
// One executable's device memory per kernel node, at least (measured 2.3 KB: see above). The
// budget takes it where registration measured less: the driver reuses device memory that
// destroyed executables left, so a measurement can read 0 bytes for a graph of thousands of kernels.
constexpr double kExecBytesPerNodeGuess = 2048.0;
// Device memory a graph's executables may take together before it keeps fewer than kMaxExecs.
constexpr double kExecBudgetBytes = 128.0 * (1 << 20);
// A graph of this many kernel nodes keeps one executable. A second would cost
// >= 9 MB of device memory (2.3 KB a node) and tens of ms to make (58 ms at
// 10k kernels, results/nvidia-h100-80gb-hbm3-scale.md at 22db3d8), while
// copying a buffer whose address moves costs a few us per call: < 0.1% of
// such a graph's device time (~1 us a kernel). So it binds the buffers that
// stay put and copies the ones that move (bind_policy.h), and its memory stays
// at one executable of ours next to the CUDAGraph's own.
constexpr size_t kOneExecNodes = 4096;
// The never-launched executable of registration (at the static arrays, which
// XLA never uses) is rewritten in place for the first call when fewer sites
// differ, else made afresh.
constexpr size_t kRebindWorthAnExec = 8;
// Misses (per buffer) and the calls they are counted over are halved every
// this many calls, so that misses long past stop counting (bind_policy.h).
constexpr uint64_t kMissWindow = 256;

// How many executables a graph keeps, from one executable's device memory
// (`exec_bytes`, -1 unknown), at least the estimate from its `nodes`.
inline size_t ExecBudget(int64_t exec_bytes, size_t nodes) {
  if (nodes >= kOneExecNodes) return 1;
  double bytes = std::max(static_cast<double>(exec_bytes), kExecBytesPerNodeGuess * static_cast<double>(nodes));
  double room = bytes > 0 ? kExecBudgetBytes / bytes : static_cast<double>(kMaxExecs);
  return std::clamp<size_t>(static_cast<size_t>(std::min(room, 1e6)), 1, kMaxExecs);
}

// Whether a fresh executable (`fresh_ns` to make) costs no more than a rewrite
// in place (`rewrite_ns` now) that leaves `kernels` updated kernels for
// `launches` later launches.
inline bool FreshPays(double fresh_ns, double rewrite_ns, size_t kernels, double launches) {
  return fresh_ns <= rewrite_ns + static_cast<double>(kernels) * kUpdatedKernelNs * launches;
}

inline double FreshNs(const DeviceGraph& g) {
  return g.fresh_ns >= 0 ? g.fresh_ns : kFreshNsPerNodeGuess * static_cast<double>(g.nodes.size());
}
inline double SiteNs(const DeviceGraph& g) { return g.site_ns >= 0 ? g.site_ns : kSiteNsGuess; }

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
// Registration
// ---------------------------------------------------------------------------

// The first executable, at the static addresses, uploaded now (so the first
// call only launches) and weighed: its device memory sets how many
// executables the graph keeps, its host time (instantiation and upload) what
// a fresh one costs. Throws on CUDA errors making it.
inline void AddFirstSlot(DeviceGraph* g) {
  using Clock = std::chrono::steady_clock;
  RelaxedCaptureMode relaxed;  // it also queries and synchronizes its own stream
  cudaStream_t stream = nullptr;  // made before the first measurement: its resources are not the graph's
  bool measured = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess;
  size_t free_before = 0, free_after = 0, total = 0;
  measured &= measured && cudaMemGetInfo(&free_before, &total) == cudaSuccess;
  int64_t host_before = ResidentBytes();
  try {
    auto start = Clock::now();
    ExecSlot& slot = AddSlot(g);
    auto made = Clock::now();
    bool uploaded = measured && cudaGraphUpload(slot.exec, stream) == cudaSuccess &&
                    cudaStreamSynchronize(stream) == cudaSuccess;
    auto end = Clock::now();
    g->fresh_ns = std::chrono::duration<double, std::nano>((uploaded ? end : made) - start).count();
    measured &= uploaded && cudaMemGetInfo(&free_after, &total) == cudaSuccess;
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

// ---------------------------------------------------------------------------
// Choosing the executable
// ---------------------------------------------------------------------------

// What PrepareExec did: launched as it was, rewrote sites in place, or made an executable.
struct Prepared {
  ExecSlot* slot = nullptr;
  size_t rewritten = 0;  // sites rewritten in place
  bool instantiated = false;
};

// Rewrites `slot` in place to `addresses` (the node copies already point
// there); `sites`: the kernel arguments that differ.
inline ffi::Error RewriteSlot(DeviceGraph* g, ExecSlot* slot, const std::vector<uint64_t>& addresses, size_t sites,
                              Prepared* out) {
  std::vector<uint64_t> have = slot->addr;
  MarkChanged(g, &have, addresses);
  size_t kernels = g->marked.size();
  if (auto e = WriteMarked(g, slot->exec); e.failure()) {
    ForgetAddresses(&slot->addr);
    IndexSlots(g);
    return e;
  }
  slot->addr = std::move(have);
  slot->key = BoundKey(*g, addresses);
  slot->launches = 0;
  slot->updated = std::min(g->nodes.size(), slot->updated + kernels);  // nodes updated twice count twice
  IndexSlots(g);
  out->rewritten = sites;
  return ffi::Error::Success();
}

// A fresh executable at `addresses` in `slot` (nullptr: a new slot).
inline ffi::Error FreshSlot(DeviceGraph* g, ExecSlot* slot, const std::vector<uint64_t>& addresses, Prepared* out) {
  RelaxedCaptureMode relaxed;
  if (auto e = InstantiateAt(g, addresses, &slot); e.failure()) return e;
  out->slot = slot;
  out->instantiated = true;
  return ffi::Error::Success();
}

// No executable holds `addresses` and there is no room for another: replaces
// one (see the top of this file). The buffers that moved are misses.
inline ffi::Error Evict(DeviceGraph* g, const std::vector<uint64_t>& addresses, Prepared* out) {
  counters.evict.fetch_add(1, std::memory_order_relaxed);
  ExecSlot *closest = nullptr, *lru = nullptr;
  size_t best = SIZE_MAX;
  for (ExecSlot& slot : g->slots) {
    size_t cost = Cost(*g, slot, addresses);
    if (cost < best || (cost == best && slot.last_use < closest->last_use)) closest = &slot, best = cost;
    if (lru == nullptr || slot.last_use < lru->last_use) lru = &slot;
  }
  for (size_t i : g->bound) g->misses[i] += closest->addr[i] != addresses[i] ? 1 : 0;
  // The kernels a rewrite of the closest would leave updated.
  RetargetAll(g, addresses);
  std::vector<uint64_t> have = closest->addr;
  MarkChanged(g, &have, addresses);
  size_t kernels = std::min(g->nodes.size(), closest->updated + g->marked.size());
  ClearMarks(g);
  double life = g->slot_life >= 0 ? g->slot_life : static_cast<double>(lru->launches);
  bool fresh = FreshPays(FreshNs(*g), SiteNs(*g) * static_cast<double>(best), kernels, std::max(1.0, life));
  ExecSlot* victim = fresh ? lru : closest;
  double served = static_cast<double>(victim->launches);
  g->slot_life = g->slot_life < 0 ? served : 0.8 * g->slot_life + 0.2 * served;
  out->slot = victim;
  return fresh ? FreshSlot(g, victim, addresses, out) : RewriteSlot(g, victim, addresses, best, out);
}

// The executable to launch for `addresses` (see the top of this file).
inline ffi::Error PrepareExec(DeviceGraph* g, const std::vector<uint64_t>& addresses, Prepared* out) {
  ExecSlot* pick = FindSlot(g, BoundKey(*g, addresses), addresses);
  if (pick != nullptr) {
    // A hit on an executable rewritten in place: made afresh once its slowdown pays for it.
    double ahead = std::max(g->slot_life, static_cast<double>(pick->launches + 1));
    if (pick->updated > 0 && FreshPays(FreshNs(*g), 0.0, pick->updated, ahead)) {
      if (auto e = FreshSlot(g, pick, addresses, out); e.failure()) return e;
      counters.refresh.fetch_add(1, std::memory_order_relaxed);
    }
    out->slot = pick;
  } else {
    ExecSlot* unused = nullptr;  // registration's, never launched: replaced, not a miss
    for (ExecSlot& slot : g->slots) unused = slot.last_use == 0 ? &slot : unused;
    size_t sites = unused != nullptr ? Cost(*g, *unused, addresses) : SIZE_MAX;
    ffi::Error e = ffi::Error::Success();
    if (sites < kRebindWorthAnExec) {
      RetargetAll(g, addresses);
      out->slot = unused;
      e = RewriteSlot(g, unused, addresses, sites, out);
    } else if (unused != nullptr || g->slots.size() < g->max_execs) {
      e = FreshSlot(g, unused, addresses, out);  // a free slot: filled once per address set
    } else {
      e = Evict(g, addresses, out);
    }
    if (e.failure()) return e;
    pick = out->slot;
  }
  pick->last_use = ++g->calls;
  pick->launches += 1;
  if (++g->recent_calls >= kMissWindow) {
    g->recent_calls /= 2;
    for (uint32_t& m : g->misses) m /= 2;
  }
  return ffi::Error::Success();
}

// Learns what a rewrite in place costs, per site, and what a fresh executable
// costs: the host time of the rewrite or instantiation (`prepare_ns`), plus
// what the launch after it took over a launch after none (`launch_ns`; the
// driver uploads what changed then).
inline void NoteLaunch(DeviceGraph* g, const Prepared& p, double prepare_ns, double launch_ns) {
  double slower = g->hit_launch_ns >= 0 ? std::max(0.0, launch_ns - g->hit_launch_ns) : 0.0;
  if (p.instantiated) {
    double made = prepare_ns + slower;
    g->fresh_ns = g->fresh_ns < 0 ? made : 0.75 * g->fresh_ns + 0.25 * made;
    return;
  }
  if (p.rewritten == 0) {
    g->hit_launch_ns = g->hit_launch_ns < 0 ? launch_ns : 0.9 * g->hit_launch_ns + 0.1 * launch_ns;
    return;
  }
  double per_site = (prepare_ns + slower) / static_cast<double>(p.rewritten);
  g->site_ns = g->site_ns < 0 ? per_site : 0.75 * g->site_ns + 0.25 * per_site;
}

}  // namespace jaxgraph

#endif  // JAXGRAPH_FFI_EXEC_CACHE_H_
