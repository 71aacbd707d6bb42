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
// Node types that cannot be re-added this way (memory, conditional, batch and
// external-semaphore nodes) make a graph "not flattenable": it is then spliced
// as one child graph node of its static template, with every buffer copied.

#ifndef JAXGRAPH_FFI_GRAPH_SPLICE_H_
#define JAXGRAPH_FFI_GRAPH_SPLICE_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.h"
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

struct SpliceDriver {
  using DepsFn = CUresult (*)(CUgraphNode, CUgraphNode*, size_t*);  // the 12.0 ABI: no edge data
  using AddKernelFn = CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t,
                                   const CUDA_KERNEL_NODE_PARAMS*);
  using AddMemcpyFn = CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t,
                                   const CUDA_MEMCPY3D*, CUcontext);
  using AddMemsetFn = CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t,
                                   const CUDA_MEMSET_NODE_PARAMS*, CUcontext);
  using AddEmptyFn = CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t);
  using AddChildFn = CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUgraph);
  using AddEventFn = CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUevent);
  using GetEventFn = CUresult (*)(CUgraphNode, CUevent*);
  using HostParamsFn = CUresult (*)(CUgraphNode, CUDA_HOST_NODE_PARAMS*);
  using AddHostFn = CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t,
                                 const CUDA_HOST_NODE_PARAMS*);
  using CtxFn = CUresult (*)(CUcontext*);

  DepsFn deps = Driver<DepsFn>("cuGraphNodeGetDependencies");
  AddKernelFn add_kernel = Driver<AddKernelFn>("cuGraphAddKernelNode");
  AddMemcpyFn add_memcpy = Driver<AddMemcpyFn>("cuGraphAddMemcpyNode");
  AddMemsetFn add_memset = Driver<AddMemsetFn>("cuGraphAddMemsetNode");
  AddEmptyFn add_empty = Driver<AddEmptyFn>("cuGraphAddEmptyNode");
  AddChildFn add_child = Driver<AddChildFn>("cuGraphAddChildGraphNode");
  AddEventFn add_record = Driver<AddEventFn>("cuGraphAddEventRecordNode");
  AddEventFn add_wait = Driver<AddEventFn>("cuGraphAddEventWaitNode");
  GetEventFn record_event = Driver<GetEventFn>("cuGraphEventRecordNodeGetEvent");
  GetEventFn wait_event = Driver<GetEventFn>("cuGraphEventWaitNodeGetEvent");
  HostParamsFn host_params = Driver<HostParamsFn>("cuGraphHostNodeGetParams");
  AddHostFn add_host = Driver<AddHostFn>("cuGraphAddHostNode");
  CtxFn current_ctx = Driver<CtxFn>("cuCtxGetCurrent");

  static const SpliceDriver& Get() {
    static SpliceDriver driver;
    return driver;
  }
  bool Complete() const {
    return deps && add_kernel && add_memcpy && add_memset && add_empty && add_child && add_record &&
           add_wait && record_event && wait_event && host_params && add_host && current_ctx;
  }
};

// Orders `graph`'s nodes so each comes after its dependencies. Returns false
// (and says why) when the graph cannot be spliced node by node.
inline bool OrderNodes(CUgraph graph, const std::vector<KernelNode>& kernels,
                       std::vector<OrderedNode>* out, std::string* why) {
  const GraphDriver& g = GraphDriver::Get();
  const SpliceDriver& d = SpliceDriver::Get();
  if (!d.Complete()) {
    *why = "the CUDA driver lacks a call splicing needs";
    return false;
  }
  size_t count = 0;
  if (g.get_nodes(graph, nullptr, &count) != CUDA_SUCCESS) return *why = "cuGraphGetNodes failed", false;
  std::vector<CUgraphNode> nodes(count);
  if (count > 0 && g.get_nodes(graph, nodes.data(), &count) != CUDA_SUCCESS) {
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
    if (g.node_type(n.node, &n.type) != CUDA_SUCCESS) return *why = "cuGraphNodeGetType failed", false;
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

// Adds the ordered nodes to the capture on `stream`; kernel nodes take their
// (rebound) arguments from `kernels`.
inline ffi::Error SpliceNodes(const std::vector<OrderedNode>& order,
                              const std::vector<KernelNode>& kernels, cudaStream_t stream) {
  const GraphDriver& g = GraphDriver::Get();
  const SpliceDriver& d = SpliceDriver::Get();
  cudaStreamCaptureStatus status;
  cudaGraph_t capture_graph = nullptr;
  const cudaGraphNode_t* entry = nullptr;
  size_t num_entry = 0;
  cudaError_t err = cudaStreamGetCaptureInfo(stream, &status, nullptr, &capture_graph, &entry,
                                             nullptr, &num_entry);
  if (err != cudaSuccess) return ffi::Error::Internal(RuntimeError("cudaStreamGetCaptureInfo", err));
  if (order.empty()) return ffi::Error::Success();
  std::vector<CUgraphNode> entry_deps(reinterpret_cast<const CUgraphNode*>(entry),
                                      reinterpret_cast<const CUgraphNode*>(entry) + num_entry);
  CUgraph target = reinterpret_cast<CUgraph>(capture_graph);
  CUcontext ctx = nullptr;
  d.current_ctx(&ctx);
  std::vector<CUgraphNode> added(order.size(), nullptr);
  std::vector<CUgraphNode> sinks;
  for (size_t i = 0; i < order.size(); ++i) {
    const OrderedNode& n = order[i];
    std::vector<CUgraphNode> deps;
    for (size_t p : n.deps) deps.push_back(added[p]);
    if (n.deps.empty()) deps = entry_deps;  // the graph's first nodes follow the stream's work
    const CUgraphNode* dp = deps.empty() ? nullptr : deps.data();
    CUresult r = CUDA_SUCCESS;
    switch (n.type) {
      case CU_GRAPH_NODE_TYPE_KERNEL:
        if (n.kernel < 0 || static_cast<size_t>(n.kernel) >= kernels.size()) {  // OrderNodes refuses these
          return ffi::Error::Internal("jaxgraph_replay: a kernel node has no argument copy to splice");
        }
        r = d.add_kernel(&added[i], target, dp, deps.size(), &kernels[n.kernel].params);
        break;
      case CU_GRAPH_NODE_TYPE_MEMCPY: {
        CUDA_MEMCPY3D m{};
        r = g.memcpy_params(n.node, &m);
        if (r == CUDA_SUCCESS) r = d.add_memcpy(&added[i], target, dp, deps.size(), &m, ctx);
        break;
      }
      case CU_GRAPH_NODE_TYPE_MEMSET: {
        CUDA_MEMSET_NODE_PARAMS m{};
        r = g.memset_params(n.node, &m);
        if (r == CUDA_SUCCESS) r = d.add_memset(&added[i], target, dp, deps.size(), &m, ctx);
        break;
      }
      case CU_GRAPH_NODE_TYPE_GRAPH: {
        CUgraph child = nullptr;
        r = g.child_graph(n.node, &child);
        if (r == CUDA_SUCCESS) r = d.add_child(&added[i], target, dp, deps.size(), child);
        break;
      }
      case CU_GRAPH_NODE_TYPE_HOST: {
        CUDA_HOST_NODE_PARAMS h{};
        r = d.host_params(n.node, &h);
        if (r == CUDA_SUCCESS) r = d.add_host(&added[i], target, dp, deps.size(), &h);
        break;
      }
      case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      case CU_GRAPH_NODE_TYPE_WAIT_EVENT: {
        bool record = n.type == CU_GRAPH_NODE_TYPE_EVENT_RECORD;
        CUevent event = nullptr;
        r = record ? d.record_event(n.node, &event) : d.wait_event(n.node, &event);
        if (r == CUDA_SUCCESS) {
          r = (record ? d.add_record : d.add_wait)(&added[i], target, dp, deps.size(), event);
        }
        break;
      }
      default:
        r = d.add_empty(&added[i], target, dp, deps.size());
        break;
    }
    if (r != CUDA_SUCCESS) {
      return ffi::Error::Internal("jaxgraph_replay: adding a node to XLA's capture: " +
                                  DriverError("cuGraphAdd*Node", r));
    }
    if (n.sink) sinks.push_back(added[i]);
  }
  err = cudaStreamUpdateCaptureDependencies(stream, reinterpret_cast<cudaGraphNode_t*>(sinks.data()),
                                            nullptr, sinks.size(), cudaStreamSetCaptureDependencies);
  if (err != cudaSuccess) {
    return ffi::Error::Internal(RuntimeError("cudaStreamUpdateCaptureDependencies", err));
  }
  return ffi::Error::Success();
}

}  // namespace jaxgraph

#endif  // JAXGRAPH_FFI_GRAPH_SPLICE_H_
