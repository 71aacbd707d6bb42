// What tests and benchmarks reach of the replay module besides the handlers:
// the process-wide settings (the device-launch threshold, the copy ring's
// size, the capture policy, a graph's executable limit) and the bind-or-copy
// policy's decisions on given figures (bind_policy.h), for tests and readers.
// Included by replay.cc only, inside its module definition.

#ifndef JAXGRAPH_FFI_REPLAY_KNOBS_H_
#define JAXGRAPH_FFI_REPLAY_KNOBS_H_

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "replay/bind_policy.h"
#include "replay/capture_policy.h"
#include "replay/conditional_graph.h"
#include "replay/copy_ring.h"
#include "replay/device_graph.h"
#include "replay/exec_cache.h"
#include "replay/graph_table.h"
#include "nanobind/nanobind.h"
#include "nanobind/stl/vector.h"

namespace jaxgraph {

inline void DefineKnobs(nanobind::module_& m) {
  namespace nb = nanobind;
  m.def("set_copy_ring_slots", [](int64_t slots) {
    if (slots < 1) throw std::invalid_argument("copy ring slots must be >= 1, got " + std::to_string(slots));
    return copy_ring_slots.exchange(slots);
  }, nb::arg("slots"), "Calls of one graph in flight before the handler waits for the device, for graphs "
     "registered from now on (their copy nodes' address ring, ffi/replay/copy_ring.h); returns the previous value. For tests.");
  m.def("device_launch_nodes", []() { return device_launch_nodes.load(); },
        "The kernel nodes from which a graph gets device-launchable executables and copy nodes (< 0: never).");
  m.def("set_device_launch_nodes", [](int64_t nodes) { return device_launch_nodes.exchange(nodes); },
        nb::arg("nodes"), "Graphs registered from now on with at least `nodes` kernel nodes get device-launchable "
        "executables (< 0: none); returns the previous threshold. For tests and benchmarks.");
  m.def("conditional_instantiate_failure", [](int err, bool has_borrowed) {
    return ConditionalInstantiateFailure(static_cast<cudaError_t>(err), has_borrowed);
  }, nb::arg("err"), nb::arg("has_borrowed"), "What registering a graph with conditional nodes says when "
     "cudaGraphInstantiate answers `err` (a cudaError_t): '' where it shares the CUDAGraph's executable "
     "(`has_borrowed`). For tests.");
  m.def("set_max_executables", &LimitExecs, nb::arg("id"), nb::arg("device"), nb::arg("count"),
        "Let graph `id` on `device` keep at most `count` executables (1 to the cap; the least recently used go "
        "now); returns the previous limit. For tests that need a full cache.");
  m.def("set_capture_policy", [](int policy) {
    if (policy < static_cast<int>(CapturePolicy::kAuto) || policy > static_cast<int>(CapturePolicy::kWhole))
      throw std::invalid_argument("capture policy must be a code of codes()['capture'], got " + std::to_string(policy));
    return capture_policy.exchange(policy);
  }, nb::arg("policy"),
     "Set how replays go into XLA's command buffers (a code of codes()['capture']) for graphs "
     "recorded for the first time from now on (a graph keeps the policy of its first recording); "
     "returns the previous code. For tests and benchmarks (benchmarks/capture_policies.py).");
  // The bind-or-copy policy's decisions on given figures (bind_policy.h), for tests and readers.
  m.def("policy_exec_budget", &ExecBudget, nb::arg("exec_bytes"), nb::arg("nodes"),
        "Executables a graph keeps when one takes `exec_bytes` of device memory (-1: estimated from `nodes`).");
  auto copies = [](const std::vector<uint64_t>& bytes) {  // copying buffers of `bytes`, per call
    double ns = 0;
    for (uint64_t b : bytes) ns += CopyNs(b);
    return ns;
  };
  m.def("policy_copy_at_registration", [copies](size_t sites, const std::vector<uint64_t>& bytes, size_t max_execs) {
    return CopyAtRegistration(sites, copies(bytes), max_execs);
  }, nb::arg("sites"), nb::arg("bytes"), nb::arg("max_execs"),
     "Whether registration copies a static array with `sites` kernel arguments, copied as buffers of `bytes`.");
  m.def("policy_copy_after_misses", [copies](uint32_t misses, uint64_t calls, size_t sites, double site_ns,
                                             const std::vector<uint64_t>& bytes, double fresh_ns, double switch_ns) {
    return CopyAfterMisses(misses, calls, sites, site_ns, copies(bytes), fresh_ns, switch_ns);
  }, nb::arg("misses"), nb::arg("calls"), nb::arg("sites"), nb::arg("site_ns"), nb::arg("bytes"),
     nb::arg("fresh_ns") = -1.0, nb::arg("switch_ns") = 0.0,
     "Whether a bound array whose address was new on `misses` of `calls` calls switches to copying (a miss "
     "costs a rewrite at `site_ns` per site, or `fresh_ns`; -1 unknown; the switch itself `switch_ns`).");
  m.def("policy_copy_host_ns", &CopyHostNs,
        "Host ns the policy prices one cudaMemcpyAsync at now: a guess until the process has copied 8 times, then "
        "the mean of its copies so far.");
  m.def("policy_fresh_pays", &FreshPays, nb::arg("fresh_ns"), nb::arg("rewrite_ns"), nb::arg("kernels"),
        nb::arg("launches"), "Whether a fresh executable beats rewriting in place (exec_cache.h).");
}

}  // namespace jaxgraph

#endif  // JAXGRAPH_FFI_REPLAY_KNOBS_H_
