// Copies inside the executable: each static buffer of a large graph has a
// copy node in the graph (an input's before its first kernels, an output's
// after its last), a kernel that reads the call's XLA address from the graph's
// address ring (copy_ring.h) and copies, or returns at once where the entry
// holds 0 (a bound buffer). A last node frees the call's entry. Included by
// bind_policy.h.
//
// Why: on the H100 a 4 KB cudaMemcpyAsync took 5.5-8 us of host time
// (benchmarks/probes/handler_parts_probe.py, tests/GPU_RESULTS.md, session 4), and
// memcpy nodes aimed at each call's buffers, as here before, took two
// cudaGraphExecMemcpyNodeSetParams1D per call once XLA alternated its buffers:
// 4.3-7.1 us of a 15-22 us call at 100k kernels (scale runs at 7112b1b). A
// call now writes its addresses to pinned memory and launches. Only graphs
// whose executables are launchable from the device (thousands of kernels:
// device_graph.h) get the nodes: there each copy node's few microseconds on
// the device are lost in milliseconds of kernels, the handler's host time is
// what matters, and they keep one executable (exec_cache.h). Every buffer
// gets its node at registration, bound or not, so switching one to copying
// changes nothing in the executable (bind_policy.h).
//
// The nodes stay out of XLA's recordings: the node by node splice takes the
// template's nodes as ordered at registration (before any copy node), and a
// whole splice takes a clone without them; both copy on the stream.

#ifndef JAXGRAPH_FFI_COPY_NODES_H_
#define JAXGRAPH_FFI_COPY_NODES_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common.h"
#include "device_graph.h"

namespace jaxgraph {

// The copy nodes' kernels, loaded in the graph's device's context (Python:
// jaxgraph/_graphs/copy_ring.py): jaxgraph_ring_copy and jaxgraph_ring_advance.
struct RingKernels {
  uint64_t copy = 0;
  uint64_t advance = 0;
};

// Whether buffer `i` is copied by its copy node on a launch now: it has one, and is not bound.
inline bool CopiedByNode(const DeviceGraph& g, size_t i) { return g.copy_nodes[i] != nullptr && g.buffers[i].Moves(); }

// Buffers copied by nodes on a launch now.
inline size_t NodeCopied(const DeviceGraph& g) {
  size_t n = 0;
  for (size_t i = 0; i < g.copy_nodes.size(); ++i) n += CopiedByNode(g, i);
  return n;
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

// One kernel node of `function` after `deps` with these arguments (values
// the driver copies), or nullptr with the error in `why`.
inline cudaGraphNode_t AddKernel(cudaGraph_t graph, uint64_t function, const std::vector<cudaGraphNode_t>& deps,
                                 unsigned blocks, unsigned threads, std::vector<void*> args, std::string* why) {
  CUDA_KERNEL_NODE_PARAMS params = KernelNodeParams(function, blocks, threads, args.data());
  CUgraphNode node = nullptr;
  CUresult r = DriverApi::Get().add_kernel(&node, reinterpret_cast<CUgraph>(graph),
                                           reinterpret_cast<const CUgraphNode*>(deps.data()), deps.size(), &params);
  if (r != CUDA_SUCCESS) *why = DriverError("cuGraphAddKernelNode", r);
  return r == CUDA_SUCCESS ? reinterpret_cast<cudaGraphNode_t>(node) : nullptr;
}

// Blocks of 256 threads for copying `bytes` 16 at a time, 8 per thread, at most 1024.
inline unsigned CopyBlocks(uint64_t bytes) {
  uint64_t blocks = (bytes + 256 * 16 * 8 - 1) / (256 * 16 * 8);
  return static_cast<unsigned>(std::clamp<uint64_t>(blocks, 1, 1024));
}

// Gives every buffer of `g` its copy node and the graph its advance node, fed
// by a new ring. Returns "" or why not (the template then as it was, the
// buffers copied on the stream).
inline std::string AddCopyNodes(DeviceGraph* g, const RingKernels& kernels) {
  auto graph = reinterpret_cast<cudaGraph_t>(g->graph);
  if (!DriverApi::Get().add_kernel) return "the driver lacks cuGraphAddKernelNode";
  std::vector<cudaGraphNode_t> roots, leaves, added;
  if (EndNodes(graph, true, &roots) != cudaSuccess || EndNodes(graph, false, &leaves) != cudaSuccess ||
      roots.empty()) {
    cudaGetLastError();
    return "its roots and leaves could not be read";
  }
  if (std::string why = g->ring.Allocate(static_cast<uint64_t>(copy_ring_slots.load()), g->buffers.size());
      !why.empty()) {
    return why;
  }
  std::string why;
  uint64_t ring = reinterpret_cast<uint64_t>(g->ring.entries()), slots = g->ring.slots, stride = g->ring.stride;
  uint64_t seq = reinterpret_cast<uint64_t>(g->ring.seq), done = reinterpret_cast<uint64_t>(g->ring.host);
  std::vector<cudaGraphNode_t> nodes(g->buffers.size(), nullptr), outs;
  for (size_t i = 0; i < g->buffers.size() && why.empty(); ++i) {
    uint64_t index = i, array = g->buffers[i].base, bytes = g->buffers[i].bytes;
    int out = i < g->num_inputs ? 0 : 1;
    if (bytes == 0) continue;
    nodes[i] = AddKernel(graph, kernels.copy, out ? leaves : std::vector<cudaGraphNode_t>{}, CopyBlocks(bytes), 256,
                         {&ring, &slots, &stride, &seq, &index, &array, &bytes, &out}, &why);
    if (nodes[i] == nullptr) break;
    added.push_back(nodes[i]);
    if (out) {
      outs.push_back(nodes[i]);
    } else {  // before every root
      std::vector<cudaGraphNode_t> from(roots.size(), nodes[i]);
      cudaError_t err = cudaGraphAddDependencies(graph, from.data(), roots.data(), nullptr, roots.size());
      if (err != cudaSuccess) why = RuntimeError("cudaGraphAddDependencies", err);
    }
  }
  cudaGraphNode_t advance = nullptr;
  if (why.empty()) advance = AddKernel(graph, kernels.advance, outs.empty() ? leaves : outs, 1, 1, {&seq, &done}, &why);
  if (advance == nullptr) {
    for (cudaGraphNode_t node : added) cudaGraphDestroyNode(node);
    cudaGetLastError();
    g->ring.Release(g->device);
    return why;
  }
  g->copy_nodes = nodes;
  g->ring_advance = advance;
  return "";
}

// Writes this call's addresses into the ring entry the next launch takes: a
// copied buffer's XLA address, 0 for a bound one (its node copies nothing).
// Call Launched() on the ring after the launch succeeds.
inline ffi::Error WriteRingEntry(DeviceGraph* g, const std::vector<uint64_t>& addresses) {
  bool waited = false;
  uint64_t* entry = g->ring.NextEntry(&waited);
  if (waited) counters.ring_wait.fetch_add(1, std::memory_order_relaxed);
  if (entry == nullptr) {
    return ffi::Error::Internal("jaxgraph_replay: the graph's " + std::to_string(g->ring.slots) + " calls in flight "
                                "did not finish within " + std::to_string(static_cast<int>(kCopyRingWaitSeconds)) +
                                " s (the device stopped making progress?)");
  }
  int64_t copies = 0;
  for (size_t i = 0; i < g->buffers.size(); ++i) {
    bool copied = CopiedByNode(*g, i);
    entry[i] = copied ? addresses[i] : 0;
    copies += copied;
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the entry before the launch that reads it
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
  std::vector<cudaGraphNode_t> ours(g.copy_nodes);
  ours.push_back(g.ring_advance);
  for (cudaGraphNode_t node : ours) {
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
