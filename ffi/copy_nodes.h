// Copies inside the executable: a copied buffer of a large graph is copied by
// a memcpy node of the graph (an input's before its first kernels, an output's
// after its last), pointed at each call's XLA buffer, instead of by a
// cudaMemcpyAsync before or after the launch. Included by bind_policy.h.
//
// Why: on the H100 (benchmarks/handler_parts_probe.py, tests/GPU_RESULTS.md,
// session 4) a 4 KB cudaMemcpyAsync took 5.5-8 us of host time, alone or with
// JAX up, while pointing a memcpy node of a 100k-kernel executable at a new
// address took 0.5-2 us. In the handler (benchmarks/scale.py, in-place state,
// XLA's buffers alternating, so both nodes are aimed anew on every call) the
// call went from 30.2 to 25.7 us at 100k kernels and from 19.7 to 12.1 us at
// 10k (scale runs at ef0ef12 and 7155474); a call whose addresses repeat
// launches and copies nothing itself. Only graphs whose executables are
// launchable from the device (thousands of kernels: device_graph.h) get them:
// there the handler's host time per call is what matters, and they keep one
// executable (exec_cache.h).
//
// The template's copy nodes hold placeholders (the static array onto itself)
// and are never launched so: each executable records what its nodes point at
// (ExecSlot::copy_addr, 0 for a placeholder) and a launch points them at the
// call's buffers first. The nodes stay out of XLA's recordings: the node by
// node splice takes the template's nodes as ordered at registration (before
// any copy node), and a whole splice takes a clone without them; both copy on
// the stream as before.

#ifndef JAXGRAPH_FFI_COPY_NODES_H_
#define JAXGRAPH_FFI_COPY_NODES_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common.h"
#include "device_graph.h"

namespace jaxgraph {

// Host ns to point one copy node of an executable at a new address, the
// slower launch after it included: the model's price of a copy by node when
// the address keeps changing. Alone 0.5-2 us at 100k kernels (above); in the
// handler 2-6 us at 10k-100k (benchmarks/scale.py at 7155474, XLA's buffers
// alternating: 3.7-12 us for two, and launches 1.7-5 us slower), about what
// rewriting one kernel argument costs there (4.1-4.5 us), which also adds no
// copy on the device: a buffer with one site stays bound.
constexpr double kCopyNodeHostNs = 4000.0;

// Whether `g`'s copied buffers are copied by nodes of its executables.
inline bool WantsCopyNodes(const DeviceGraph& g) {
  return g.device_launchable && g.conditionals == 0 && !g.borrowed_exec;
}

inline bool HasCopyNodes(const DeviceGraph& g) {
  for (cudaGraphNode_t node : g.copy_nodes) {
    if (node != nullptr) return true;
  }
  return false;
}

// The template's nodes with no dependency (`roots`) or no dependent (else).
inline cudaError_t EndNodes(cudaGraph_t graph, bool roots, std::vector<cudaGraphNode_t>* out) {
  size_t count = 0;
  if (roots) {
    cudaError_t err = cudaGraphGetRootNodes(graph, nullptr, &count);
    out->resize(count);
    return err != cudaSuccess || count == 0 ? err : cudaGraphGetRootNodes(graph, out->data(), &count);
  }
  size_t edges = 0;
  cudaError_t err = cudaGraphGetNodes(graph, nullptr, &count);
  if (err == cudaSuccess) err = cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges);
  if (err != cudaSuccess) return err;
  std::vector<cudaGraphNode_t> nodes(count), from(edges), to(edges);
  if (count > 0 && (err = cudaGraphGetNodes(graph, nodes.data(), &count)) != cudaSuccess) return err;
  if (edges > 0 && (err = cudaGraphGetEdges(graph, from.data(), to.data(), nullptr, &edges)) != cudaSuccess) {
    return err;
  }
  std::vector<cudaGraphNode_t> sorted_from(from);
  std::sort(sorted_from.begin(), sorted_from.end());
  out->clear();
  for (cudaGraphNode_t node : nodes) {
    if (!std::binary_search(sorted_from.begin(), sorted_from.end(), node)) out->push_back(node);
  }
  return cudaSuccess;
}

// Adds buffer `i`'s copy node to the template: an input's before every root, an
// output's after every leaf, at placeholder addresses. Returns false, the
// template as it was, where CUDA refuses (the buffer is then copied on the stream).
inline bool AddCopyNode(DeviceGraph* g, size_t i) {
  auto graph = reinterpret_cast<cudaGraph_t>(g->graph);
  bool input = i < g->num_inputs;
  std::vector<cudaGraphNode_t> ends;
  if (EndNodes(graph, input, &ends) != cudaSuccess || ends.empty()) {
    cudaGetLastError();
    return false;
  }
  void* array = reinterpret_cast<void*>(g->buffers[i].base);
  cudaGraphNode_t node = nullptr;
  const cudaGraphNode_t* deps = input ? nullptr : ends.data();
  cudaError_t err = cudaGraphAddMemcpyNode1D(&node, graph, deps, input ? 0 : ends.size(), array, array,
                                             g->buffers[i].bytes, cudaMemcpyDeviceToDevice);
  if (err == cudaSuccess && input) {
    std::vector<cudaGraphNode_t> from(ends.size(), node);
    err = cudaGraphAddDependencies(graph, from.data(), ends.data(), nullptr, ends.size());
    if (err != cudaSuccess) cudaGraphDestroyNode(node);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  g->copy_nodes[i] = node;
  return true;
}

// Points `slot`'s copy nodes at this call's buffers where they point elsewhere.
inline ffi::Error AimCopyNodes(DeviceGraph* g, ExecSlot* slot, const std::vector<uint64_t>& addresses) {
  int64_t copies = 0;
  for (size_t i = 0; i < g->copy_nodes.size(); ++i) {
    if (g->copy_nodes[i] == nullptr) continue;
    ++copies;
    if (slot->copy_addr[i] == addresses[i]) continue;
    void* xla = reinterpret_cast<void*>(addresses[i]);
    void* array = reinterpret_cast<void*>(g->buffers[i].base);
    bool input = i < g->num_inputs;
    cudaError_t err = cudaGraphExecMemcpyNodeSetParams1D(slot->exec, g->copy_nodes[i], input ? array : xla,
                                                         input ? xla : array, g->buffers[i].bytes,
                                                         cudaMemcpyDeviceToDevice);
    if (err != cudaSuccess) {  // the node may point anywhere now: the executable cannot be launched
      slot->copy_addr[i] = 0;
      return ffi::Error::Internal(RuntimeError("cudaGraphExecMemcpyNodeSetParams1D", err));
    }
    slot->copy_addr[i] = addresses[i];
    counters.copy_node_set.fetch_add(1, std::memory_order_relaxed);
  }
  if (copies > 0) counters.node_copy.fetch_add(copies, std::memory_order_relaxed);
  return ffi::Error::Success();
}

// A clone of the template without its copy nodes, for a whole splice (the
// caller destroys it), or nullptr where CUDA refuses.
inline cudaGraph_t CloneWithoutCopyNodes(const DeviceGraph& g) {
  cudaGraph_t clone = nullptr;
  if (cudaGraphClone(&clone, reinterpret_cast<cudaGraph_t>(g.graph)) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  for (cudaGraphNode_t node : g.copy_nodes) {
    cudaGraphNode_t twin = nullptr;
    if (node == nullptr) continue;
    if (cudaGraphNodeFindInClone(&twin, node, clone) != cudaSuccess || cudaGraphDestroyNode(twin) != cudaSuccess) {
      cudaGetLastError();
      cudaGraphDestroy(clone);
      return nullptr;
    }
  }
  return clone;
}

}  // namespace jaxgraph

#endif  // JAXGRAPH_FFI_COPY_NODES_H_
