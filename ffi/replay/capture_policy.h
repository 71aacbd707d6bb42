// Which buffers a replay spliced into XLA's command buffer keeps bound, and
// which it copies, chosen by cost. Included by replay.cc only.
//
// XLA (jax 0.11.2) records a command-buffer-compatible FFI call by running its
// handler under stream capture and holds the captured graph as one child node
// of its own executable. When the call's buffers move, XLA updates that node
// in place (cuGraphExecChildGraphNodeSetParams) from a recording for the new
// addresses: it keeps recordings for several recent address sets (seen on the
// H100: an output alternating between two buffers, and 8 rotating inputs,
// each recorded once), and runs the handler again only for a set it does not
// hold (32 rotating inputs: nearly every call). A bound buffer's sites (the
// kernel arguments holding its address) differ between recordings, so every
// such update rewrites them in XLA's executable; a copied buffer leaves the
// kernels on its static array, which never moves, and the update changes one
// memcpy node. A copy costs a memcpy node on every call, whether or not XLA's
// addresses changed.
//
// Measured by benchmarks/capture_policies.py on the H100 (N = 100 chain, the
// output held by 199 kernel arguments, 16 KB; benchmarks/results/
// nvidia-h100-80gb-hbm3-capture-policies.md): where every call records, 2.06x
// the floor with every buffer bound, 1.75x with the output copied, 1.67x with
// every buffer copied, 1.66x with the template spliced whole; where XLA's
// addresses recur, all four within 1.05-1.09x of the floor.
//
// kAuto weighs the two per bound buffer: the sites rewritten on a share of
// calls that record again (kRecordShare, an assumption) against a memcpy
// node on every call. kBind is the default: in the common case (a jitted
// loop, XLA's buffers alternating between a few addresses it holds
// recordings for) nothing is re-recorded, so a copy would be paid on every
// call for nothing; kAuto is for programs whose buffers cycle through more
// addresses than XLA keeps.

#ifndef JAXGRAPH_FFI_CAPTURE_POLICY_H_
#define JAXGRAPH_FFI_CAPTURE_POLICY_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "device_graph.h"

namespace jaxgraph {

// How replays go into XLA's command buffer; the codes cross to Python
// (jaxgraph._jax_interop.replay_contract.CapturePolicy). kBind is the default; the others
// exist so tests and benchmarks (benchmarks/capture_policies.py) can compare
// the ways. A graph keeps the policy of its first recording: XLA updates a
// recorded call only from a recording of the same shape (nodes and edges),
// and fails the call otherwise (CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, seen
// when the policy changed between two recordings of one call).
enum class CapturePolicy : int {
  kAuto = 0,   // by cost (CopyPays): a bound buffer with many sites and few bytes copied, the rest bound
  kBind = 1,   // every bound buffer bound in the spliced nodes
  kCopy = 2,   // every bound buffer copied; nodes spliced one by one at the static arrays
  kWhole = 3,  // the static template as one child-graph node, every buffer copied
};
inline std::atomic<int> capture_policy{static_cast<int>(CapturePolicy::kBind)};

constexpr double kSiteUs = 0.24;              // a site rewritten by XLA's update, per recording (estimated:
                                              // jit_cycle, bind over auto, per site, 0.24-0.35 us)
constexpr double kRecordShare = 1.0 / 16;     // calls that record again (assumed; see above)
constexpr double kCopyUs = 1.5;               // a memcpy node per call (assumed: below the noise at 16 KB)
constexpr double kCopyBytesPerUs = 1e6;       // its bytes at 1 TB/s (assumed: under a third of H100's peak)

// Whether copying `b` under capture costs less than keeping it bound.
inline bool CopyPays(const Binding& b) {
  return static_cast<double>(b.sites.size()) * kSiteUs * kRecordShare >
         kCopyUs + static_cast<double>(b.bytes) / kCopyBytesPerUs;
}

// What one recording splices: the template whole, or its nodes with some
// bound buffers copied (`copy`, per buffer; empty: none).
struct CapturePlan {
  bool whole = false;
  std::vector<char> copy;
};

// The plan of a recording of `g`, under the policy of its first recording.
inline CapturePlan PlanCapture(DeviceGraph* g) {
  if (g->capture_policy < 0) g->capture_policy = capture_policy.load(std::memory_order_relaxed);
  auto policy = static_cast<CapturePolicy>(g->capture_policy);
  CapturePlan plan;
  if (policy == CapturePolicy::kWhole) {
    plan.whole = true;
    return plan;
  }
  if (policy == CapturePolicy::kBind) return plan;
  for (size_t i : g->bound) {
    if (policy == CapturePolicy::kAuto && !CopyPays(g->buffers[i])) continue;
    if (plan.copy.empty()) plan.copy.assign(g->buffers.size(), 0);
    plan.copy[i] = 1;
  }
  if (plan.copy.empty()) return plan;
  // An input sharing its buffer with a copied output is copied in with it.
  for (size_t i = 0; i < g->num_inputs; ++i) {
    if (g->alias[i] >= 0 && plan.copy[g->num_inputs + g->alias[i]]) plan.copy[i] = 1;
  }
  return plan;
}

// The addresses the spliced nodes take: XLA's, or the static array's for a
// buffer the plan copies.
inline const std::vector<uint64_t>& SpliceAddresses(const DeviceGraph& g, const std::vector<uint64_t>& addresses,
                                                    const CapturePlan& plan) {
  if (plan.copy.empty()) return addresses;
  thread_local std::vector<uint64_t> at;
  at = addresses;
  for (size_t i = 0; i < at.size(); ++i) {
    if (plan.copy[i]) at[i] = g.static_addr[i];
  }
  return at;
}

}  // namespace jaxgraph

#endif  // JAXGRAPH_FFI_CAPTURE_POLICY_H_
