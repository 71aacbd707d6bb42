// Splicing a captured graph into the capture XLA records for its command buffer.
//
// When XLA records a command buffer it runs the replay handler under stream
// capture, where cudaGraphLaunch is not permitted. The graph's nodes are then
// added to XLA's capture graph one by one, in dependency order, after the
// stream's current capture dependencies; the graph's last nodes become the
// stream's dependencies. Adding the nodes themselves (rather than one child
// graph node holding them) keeps them at the level XLA records: when XLA's
// buffers move it re-records and updates its executable, and the kernel
// nodes' new arguments reach it. (Seen on an H100 with jax 0.11.2: kernel
// nodes inside a child graph node kept their old arguments after XLA's update.)
//
// A graph that cannot be re-added this way is "not flattenable" (a memory,
// batch or external-semaphore node; kernel arguments not read, bind="copy"; a
// driver without the calls): it is then spliced as one child-graph node of
// its static template, with every buffer copied (SpliceWhole). A graph with
// conditional nodes is never spliced (conditional_graph.h).

#ifndef JAXGRAPH_FFI_GRAPH_SPLICE_H_
#define JAXGRAPH_FFI_GRAPH_SPLICE_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "driver_api.h"
#include "graph_binding.h"

namespace jaxgraph {

// A node of the template in dependency order, with its dependencies as
// indices of earlier entries.
struct OrderedNode {
  CUgraphNode node = nullptr;
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  std::vector<size_t> deps;
  long kernel = -1;  // index into DeviceGraph::nodes for kernel nodes
  bool sink = true;  // nothing in the graph depends on it
};

// Orders `graph`'s nodes so each comes after its dependencies. Returns false
// (and says why) when the graph cannot be spliced node by node.
inline bool OrderNodes(CUgraph graph, const std::vector<KernelNode>& kernels,
                       std::vector<OrderedNode>* out, std::string* why) {
  const DriverApi& d = DriverApi::Get();
  if (std::string missing = d.Missing(kSplicing); !missing.empty()) {
    *why = "the CUDA driver lacks a call splicing needs: " + missing;
    return false;
  }
  size_t count = 0;
  if (d.get_nodes(graph, nullptr, &count) != CUDA_SUCCESS) return *why = "cuGraphGetNodes failed", false;
  std::vector<CUgraphNode> nodes(count);
  if (count > 0 && d.get_nodes(graph, nodes.data(), &count) != CUDA_SUCCESS) {
    return *why = "cuGraphGetNodes failed", false;
  }
  std::unordered_map<CUgraphNode, size_t> index;
  for (size_t i = 0; i < nodes.size(); ++i) index[nodes[i]] = i;
  std::unordered_map<CUgraphNode, long> kernel_index;
  for (size_t k = 0; k < kernels.size(); ++k) kernel_index[kernels[k].node] = static_cast<long>(k);

  std::vector<OrderedNode> all(nodes.size());
  std::vector<size_t> pending(nodes.size(), 0);
  std::vector<std::vector<size_t>> dependents(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    OrderedNode& n = all[i];
    n.node = nodes[i];
    if (d.node_type(n.node, &n.type) != CUDA_SUCCESS) return *why = "cuGraphNodeGetType failed", false;
    switch (n.type) {
      case CU_GRAPH_NODE_TYPE_KERNEL: case CU_GRAPH_NODE_TYPE_MEMCPY: case CU_GRAPH_NODE_TYPE_MEMSET:
      case CU_GRAPH_NODE_TYPE_EMPTY: case CU_GRAPH_NODE_TYPE_GRAPH: case CU_GRAPH_NODE_TYPE_HOST:
      case CU_GRAPH_NODE_TYPE_EVENT_RECORD: case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
        break;
      default:
        *why = "the graph has a node (type " + std::to_string(static_cast<int>(n.type)) +
               ") that cannot be added to XLA's capture one by one";
        return false;
    }
    auto k = kernel_index.find(n.node);
    n.kernel = k != kernel_index.end() ? k->second : -1;
    if (n.type == CU_GRAPH_NODE_TYPE_KERNEL && n.kernel < 0) {  // bind="copy": the arguments were not read
      *why = "its kernel nodes' arguments were not read (bind='copy')";
      return false;
    }
    size_t num_deps = 0;
    if (d.deps(n.node, nullptr, &num_deps) != CUDA_SUCCESS) {
      return *why = "cuGraphNodeGetDependencies failed (edges with data?)", false;
    }
    std::vector<CUgraphNode> deps(num_deps);
    if (num_deps > 0 && d.deps(n.node, deps.data(), &num_deps) != CUDA_SUCCESS) {
      return *why = "cuGraphNodeGetDependencies failed (edges with data?)", false;
    }
    for (CUgraphNode dep : deps) {
      size_t j = index.at(dep);
      dependents[j].push_back(i);
      all[j].sink = false;
      ++pending[i];
    }
  }
  // Kahn's algorithm; deps become positions in `out`.
  std::vector<size_t> position(nodes.size(), SIZE_MAX), ready;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (pending[i] == 0) ready.push_back(i);
  }
  std::vector<std::vector<size_t>> deps_of(nodes.size());
  while (!ready.empty()) {
    size_t i = ready.back();
    ready.pop_back();
    position[i] = out->size();
    out->push_back(all[i]);
    out->back().deps = deps_of[i];
    for (size_t j : dependents[i]) {
      deps_of[j].push_back(position[i]);
      if (--pending[j] == 0) ready.push_back(j);
    }
  }
  if (out->size() != nodes.size()) return *why = "the graph has a cycle", false;
  return true;
}

// Adds nodes to the capture in progress on `stream`: `add(graph, entry,
// &tail)` adds them to the capture's graph after `entry`, the nodes the
// stream's next work would depend on, and names in `tail` the nodes later
// captured work must follow, which become the stream's dependencies (an empty
// tail leaves them as they were).
template <typename Add>
ffi::Error AppendToCapture(cudaStream_t stream, Add add) {
  cudaStreamCaptureStatus status;
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* entry = nullptr;
  size_t num_entry = 0;
  cudaError_t err = cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph, &entry, nullptr, &num_entry);
  if (err != cudaSuccess) return ffi::Error::Internal(RuntimeError("cudaStreamGetCaptureInfo", err));
  const auto* first = reinterpret_cast<const CUgraphNode*>(entry);
  std::vector<CUgraphNode> tail;
  ffi::Error added = add(reinterpret_cast<CUgraph>(graph), std::vector<CUgraphNode>(first, first + num_entry),
                         &tail);
  if (added.failure()) return added;
  if (tail.empty()) return ffi::Error::Success();
  err = cudaStreamUpdateCaptureDependencies(stream, reinterpret_cast<cudaGraphNode_t*>(tail.data()), nullptr,
                                            tail.size(), cudaStreamSetCaptureDependencies);
  if (err != cudaSuccess) {
    return ffi::Error::Internal(RuntimeError("cudaStreamUpdateCaptureDependencies", err));
  }
  return ffi::Error::Success();
}

// Adds `child` to the capture on `stream` as one child-graph node (the
// fallback for graphs whose nodes cannot be added one by one). Through the
// runtime, so it needs none of the driver calls splicing node by node does.
inline ffi::Error SpliceWhole(cudaGraph_t child, cudaStream_t stream) {
  return AppendToCapture(stream, [&](CUgraph graph, const std::vector<CUgraphNode>& entry,
                                     std::vector<CUgraphNode>* tail) {
    cudaGraphNode_t node;
    cudaError_t err = cudaGraphAddChildGraphNode(&node, reinterpret_cast<cudaGraph_t>(graph),
                                                 reinterpret_cast<const cudaGraphNode_t*>(entry.data()),
                                                 entry.size(), child);
    if (err != cudaSuccess) return ffi::Error::Internal(RuntimeError("cudaGraphAddChildGraphNode", err));
    tail->push_back(reinterpret_cast<CUgraphNode>(node));
    return ffi::Error::Success();
  });
}

// Adds a copy of one template node to `target` after `deps`; a kernel node
// takes its (rebound) arguments from `kernels`.
inline CUresult AddNodeCopy(const OrderedNode& n, const std::vector<KernelNode>& kernels, CUgraph target,
                            const std::vector<CUgraphNode>& deps, CUcontext ctx, CUgraphNode* added) {
  const DriverApi& d = DriverApi::Get();
  const CUgraphNode* dp = deps.empty() ? nullptr : deps.data();
  switch (n.type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
      return d.add_kernel(added, target, dp, deps.size(), &kernels[n.kernel].params);
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
      CUDA_MEMCPY3D m{};
      CUresult r = d.memcpy_params(n.node, &m);
      return r != CUDA_SUCCESS ? r : d.add_memcpy(added, target, dp, deps.size(), &m, ctx);
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      CUDA_MEMSET_NODE_PARAMS m{};
      CUresult r = d.memset_params(n.node, &m);
      return r != CUDA_SUCCESS ? r : d.add_memset(added, target, dp, deps.size(), &m, ctx);
    }
    case CU_GRAPH_NODE_TYPE_GRAPH: {
      CUgraph child = nullptr;
      CUresult r = d.child_graph(n.node, &child);
      return r != CUDA_SUCCESS ? r : d.add_child(added, target, dp, deps.size(), child);
    }
    case CU_GRAPH_NODE_TYPE_HOST: {
      CUDA_HOST_NODE_PARAMS h{};
      CUresult r = d.host_params(n.node, &h);
      return r != CUDA_SUCCESS ? r : d.add_host(added, target, dp, deps.size(), &h);
    }
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: {
      CUevent event = nullptr;
      CUresult r = d.record_event(n.node, &event);
      return r != CUDA_SUCCESS ? r : d.add_record(added, target, dp, deps.size(), event);
    }
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: {
      CUevent event = nullptr;
      CUresult r = d.wait_event(n.node, &event);
      return r != CUDA_SUCCESS ? r : d.add_wait(added, target, dp, deps.size(), event);
    }
    default:  // an empty node (OrderNodes lets no other type through)
      return d.add_empty(added, target, dp, deps.size());
  }
}

// Adds the ordered nodes to the capture on `stream` one by one; kernel nodes
// take their (rebound) arguments from `kernels`. The graph's first nodes
// follow the stream's work, its last ones become the stream's dependencies.
inline ffi::Error SpliceNodes(const std::vector<OrderedNode>& order, const std::vector<KernelNode>& kernels,
                              cudaStream_t stream) {
  for (const OrderedNode& n : order) {
    if (n.type == CU_GRAPH_NODE_TYPE_KERNEL &&
        (n.kernel < 0 || static_cast<size_t>(n.kernel) >= kernels.size())) {  // OrderNodes refuses these
      return ffi::Error::Internal("jaxgraph_replay: a kernel node has no argument copy to splice");
    }
  }
  return AppendToCapture(stream, [&](CUgraph target, const std::vector<CUgraphNode>& entry,
                                     std::vector<CUgraphNode>* tail) {
    CUcontext ctx = nullptr;
    DriverApi::Get().current_ctx(&ctx);
    std::vector<CUgraphNode> added(order.size(), nullptr);
    for (size_t i = 0; i < order.size(); ++i) {
      const OrderedNode& n = order[i];
      std::vector<CUgraphNode> deps;
      for (size_t p : n.deps) deps.push_back(added[p]);
      CUresult r = AddNodeCopy(n, kernels, target, n.deps.empty() ? entry : deps, ctx, &added[i]);
      if (r != CUDA_SUCCESS) {
        return ffi::Error::Internal("jaxgraph_replay: adding a node to XLA's capture: " +
                                    DriverError("cuGraphAdd*Node", r));
      }
      if (n.sink) tail->push_back(added[i]);
    }
    return ffi::Error::Success();
  });
}

}  // namespace jaxgraph

#endif  // JAXGRAPH_FFI_GRAPH_SPLICE_H_
