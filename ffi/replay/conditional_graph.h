// Graphs with conditional nodes (IF, IF/ELSE, WHILE, SWITCH, nested), replayed
// from the template itself. Included by graph_table.h and replay.cc.
//
// CUDA refuses to clone a graph with conditional nodes and to place one in
// another graph (a child-graph node, or XLA's command buffer), and documents
// that only one executable of such a graph may exist at a time. So the table
// holds the template itself (the replayable keeps its CUDAGraph alive; a
// reset detaches the entry here before the template is destroyed) and one
// executable: its own where the driver makes one, otherwise the CUDAGraph's
// own executable, borrowed as it is: never rebound (a g.replay() could run in
// between), so every buffer of such an entry is copied.
//
// When XLA's addresses change, the executable's bound kernel arguments (nodes
// inside the bodies too) are rewritten in place: node by node
// (cuGraphExecKernelNodeSetParams), or, where the driver refuses that for a
// node, by pointing the template at XLA's buffers, updating the whole
// executable from it (cuGraphExecUpdate: a conditional node's own parameters
// never change, which that call requires) and pointing the template back. The
// template always ends at its static arrays.
//
// The call is launched on XLA's stream by jaxgraph_replay_uncaptured, a
// handler registered without the command-buffer trait, so XLA splits its
// command buffer around the call rather than recording it. Should XLA record
// it anyway, the handler finds the stream capturing and fails with a clear
// error (a launch there is not permitted, and a splice would need a child
// graph, which CUDA refuses for these graphs).

#ifndef JAXGRAPH_FFI_CONDITIONAL_GRAPH_H_
#define JAXGRAPH_FFI_CONDITIONAL_GRAPH_H_

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.h"
#include "device_graph.h"
#include "graph_binding.h"

namespace jaxgraph {

// Why a conditional graph's instantiation failure `err` stops its registration,
// or "" where the CUDAGraph's executable (`has_borrowed`) may be shared: CUDA's
// one-executable rule for such graphs answers cudaErrorNotSupported; any other
// failure is reported as CUDA said it, not as that rule.
inline std::string ConditionalInstantiateFailure(cudaError_t err, bool has_borrowed) {
  if (err != cudaErrorNotSupported) {
    return "CUDA could not instantiate this graph with conditional nodes for replay (" +
           RuntimeError("cudaGraphInstantiate", err) + "); the graph itself is refused, so sharing the "
           "CUDAGraph's executable would not help: check that g.replay() runs, and what the graph holds "
           "(g.summary())";
  }
  if (has_borrowed) return "";
  return "CUDA would not make a second executable of this graph with conditional nodes (" +
         RuntimeError("cudaGraphInstantiate", err) + ": CUDA allows one executable of such a graph) and the "
         "CUDAGraph has none to share; instantiate the CUDAGraph (capture_end does, or call instantiate()) "
         "before building the replayable";
}

// The one executable of a conditional graph, at its static addresses: a new
// one, or `borrowed` (the CUDAGraph's, 0 if it has none) where CUDA refuses a
// second. Throws when there is neither, or when CUDA refused for another reason.
inline void PrepareConditional(DeviceGraph* g, uint64_t borrowed) {
  ExecSlot slot;
  slot.addr = g->static_addr;
  cudaError_t err = cudaGraphInstantiate(&slot.exec, reinterpret_cast<cudaGraph_t>(g->graph), 0);
  if (err == cudaSuccess) {
    counters.instantiate.fetch_add(1, std::memory_order_relaxed);
  } else {
    cudaGetLastError();  // clear the runtime's sticky copy of a non-fatal error
    std::string failure = ConditionalInstantiateFailure(err, borrowed != 0);
    if (!failure.empty()) throw std::runtime_error(failure);
    slot.exec = reinterpret_cast<cudaGraphExec_t>(borrowed);
    g->borrowed_exec = true;
    // The executable is the CUDAGraph's own: it is never pointed at XLA's
    // buffers, since a g.replay() between our update and our restore would
    // write them. Every bound buffer is copied instead (a few us per call,
    // less than updating the executable twice per call).
    for (Binding& b : g->buffers) {
      if (b.mode == BindMode::kBound) {
        b.Copy("the graph's one executable is the CUDAGraph's own (CUDA allows one executable of a "
               "graph with conditional nodes), so it stays at the static arrays: copied");
      }
    }
    g->bound.clear();
  }
  g->slots.push_back(std::move(slot));
  g->max_execs = 1;
}

// Writes every kernel node with a bound site into the template (the node
// copies hold the addresses to write).
inline ffi::Error WriteBoundNodes(DeviceGraph* g) {
  for (size_t i : g->bound) {
    for (const Site& site : g->buffers[i].sites) Mark(g, site.node);
  }
  return WriteMarked(g, nullptr);
}

// Updates the whole executable from the template pointed at `addresses`,
// then points the template back at its static arrays.
inline ffi::Error UpdateWholeExec(DeviceGraph* g, ExecSlot* slot, const std::vector<uint64_t>& addresses) {
  ClearMarks(g);
  ForgetAddresses(&slot->addr);  // until the update below succeeds
  RetargetAll(g, addresses);
  if (auto e = WriteBoundNodes(g); e.failure()) {
    RetargetAll(g, g->static_addr);  // the template back at its static arrays, as far as it goes
    ClearMarks(g);
    (void)WriteBoundNodes(g);
    return e;
  }
  cudaGraphExecUpdateResultInfo info{};
  cudaError_t err = cudaGraphExecUpdate(slot->exec, reinterpret_cast<cudaGraph_t>(g->graph), &info);
  RetargetAll(g, g->static_addr);  // the template back at its static arrays, whatever happened
  if (auto e = WriteBoundNodes(g); e.failure()) return e;
  if (err != cudaSuccess) {
    cudaGetLastError();
    return ffi::Error::Internal("jaxgraph_replay: rebinding a graph with conditional nodes: " +
                                RuntimeError("cudaGraphExecUpdate", err) + " (update result " +
                                std::to_string(static_cast<int>(info.result)) + ")");
  }
  counters.rebind.fetch_add(static_cast<int64_t>(g->nodes.size()), std::memory_order_relaxed);
  slot->addr = addresses;
  return ffi::Error::Success();
}

// Points the executable's bound kernel arguments at `addresses` in place.
inline ffi::Error PointExecAt(DeviceGraph* g, ExecSlot* slot, const std::vector<uint64_t>& addresses) {
  if (Cost(*g, *slot, addresses) == 0) return ffi::Error::Success();
  if (!g->exec_update_whole) {
    const DriverApi& d = DriverApi::Get();
    std::vector<uint64_t> have = slot->addr;
    RetargetAll(g, addresses);
    MarkChanged(g, &have, addresses);
    for (size_t n : g->marked) {
      KernelNode& k = g->nodes[n];
      CUresult r = d.exec_set_kernel_params(reinterpret_cast<CUgraphExec>(slot->exec), k.node, &k.params);
      if (r != CUDA_SUCCESS) {  // e.g. a node inside a body on a driver that refuses it: whole updates
        g->exec_update_whole = true;
        break;
      }
      counters.rebind.fetch_add(1, std::memory_order_relaxed);
    }
    ClearMarks(g);
    if (!g->exec_update_whole) {
      slot->addr = have;
      return ffi::Error::Success();
    }
  }
  return UpdateWholeExec(g, slot, addresses);
}

// Launches the conditional graph `g` on `stream` bound to `addresses`; the
// caller copies the copied buffers around it.
inline ffi::Error LaunchConditional(DeviceGraph* g, cudaStream_t stream, const std::vector<uint64_t>& addresses) {
  if (g->detached || g->slots.empty()) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jaxgraph_replay: the graph was reset or destroyed after this function was "
                      "compiled; capture it again and build a new replayable function");
  }
  ExecSlot* slot = &g->slots[0];
  if (auto e = PointExecAt(g, slot, addresses); e.failure()) return e;
  cudaError_t err = cudaGraphLaunch(slot->exec, stream);
  if (err != cudaSuccess) return ffi::Error::Internal(RuntimeError("cudaGraphLaunch", err));
  slot->last_use = ++g->calls;
  // Launches already enqueued keep the arguments they were launched with.
  if (g->borrowed_exec) return PointExecAt(g, slot, g->static_addr);
  return ffi::Error::Success();
}

// The error when XLA records a call of a conditional graph into its command
// buffer (it should not: the handler has no command-buffer trait).
inline ffi::Error CapturedConditional(const char* target) {
  return ffi::Error(
      ffi::ErrorCode::kFailedPrecondition,
      std::string(target) +
          ": XLA is recording this call into a CUDA graph (a command buffer), but the graph has "
          "conditional nodes, which CUDA can neither launch during a capture nor place in another "
          "graph; run it outside XLA's command buffers (XLA_FLAGS=--xla_gpu_enable_command_buffer= "
          "or a list without CUSTOM_CALL)");
}

}  // namespace jaxgraph

#endif  // JAXGRAPH_FFI_CONDITIONAL_GRAPH_H_
