// XLA FFI handler that replays a captured CUDA graph on XLA's stream.
//
// Python registers a captured graph (with its static input and output
// buffers) for one device; the table keeps its own clone of the graph
// template and its own executable, so the Python CUDAGraph can be reset
// independently. A reset marks the entry dead, and a compiled function that
// still refers to it gets a clear error instead of a launch of freed memory.
//
// When XLA records the handler into its own command buffer (stream capture),
// cudaGraphLaunch is not permitted; the handler then splices the graph into
// XLA's capture as a child-graph node.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "nanobind/nanobind.h"
#include "nanobind/stl/pair.h"
#include "nanobind/stl/string.h"
#include "nanobind/stl/vector.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
namespace nb = nanobind;

namespace {

// ---------------------------------------------------------------------------
// Graph table
// ---------------------------------------------------------------------------

struct StaticBuffer {
  void* data;
  size_t bytes;
};

struct GraphEntry {
  int device = -1;
  cudaGraph_t graph = nullptr;     // our clone of the template, for splicing
  cudaGraphExec_t exec = nullptr;  // our own executable, for plain replay
  std::vector<StaticBuffer> inputs;
  std::vector<StaticBuffer> outputs;
  bool alive = true;

  ~GraphEntry() {
    // An executable still in flight is freed by the driver when it completes.
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

std::mutex table_mutex;
// (graph id, device ordinal) -> entry. Dead entries stay as tombstones so
// the handler can say what happened.
std::map<std::pair<int64_t, int>, std::unique_ptr<GraphEntry>> graph_table;
int64_t next_graph_id = 1;

// How the handler ran the graph: launched on XLA's stream, or spliced into
// the capture XLA was recording (its command buffer). Tests read these to
// prove splicing happened.
std::atomic<int64_t> launch_count{0};
std::atomic<int64_t> splice_count{0};

std::string CudaMessage(const char* call, cudaError_t err) {
  return std::string(call) + " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
}

std::vector<StaticBuffer> ToBuffers(const std::vector<std::pair<uintptr_t, size_t>>& spec) {
  std::vector<StaticBuffer> out;
  out.reserve(spec.size());
  for (const auto& [ptr, bytes] : spec) out.push_back({reinterpret_cast<void*>(ptr), bytes});
  return out;
}

// Registers a graph for `device`, whose primary context must be current.
// Returns the id to pass as the `graph` attribute. Raises on CUDA errors.
int64_t RegisterGraph(int64_t id, int device, uintptr_t graph,
                      const std::vector<std::pair<uintptr_t, size_t>>& inputs,
                      const std::vector<std::pair<uintptr_t, size_t>>& outputs) {
  if (device < 0) throw std::invalid_argument("device must be a CUDA ordinal >= 0");
  if (graph == 0) throw std::invalid_argument("graph must be a live cudaGraph_t");
  // The caller made the device's primary context current; this makes the
  // runtime agree even on a thread where it has not been used yet.
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) throw std::runtime_error(CudaMessage("cudaSetDevice", err));
  auto entry = std::make_unique<GraphEntry>();
  entry->device = device;
  entry->inputs = ToBuffers(inputs);
  entry->outputs = ToBuffers(outputs);
  err = cudaGraphClone(&entry->graph, reinterpret_cast<cudaGraph_t>(graph));
  if (err != cudaSuccess) throw std::runtime_error(CudaMessage("cudaGraphClone", err));
  err = cudaGraphInstantiate(&entry->exec, entry->graph, 0);
  if (err != cudaSuccess) throw std::runtime_error(CudaMessage("cudaGraphInstantiate", err));
  std::lock_guard<std::mutex> lock(table_mutex);
  if (id <= 0) {
    id = next_graph_id++;
  } else {
    auto it = graph_table.find({id, device});
    if (it != graph_table.end()) {
      throw std::invalid_argument("graph " + std::to_string(id) +
                                  " is already registered for device " + std::to_string(device));
    }
    if (id >= next_graph_id) next_graph_id = id + 1;
  }
  graph_table[{id, device}] = std::move(entry);
  return id;
}

// Marks the entry of `id` on `device` (every device when device < 0) dead
// and frees its graph and executable.
void UnregisterGraph(int64_t id, int device) {
  std::lock_guard<std::mutex> lock(table_mutex);
  for (auto& [key, entry] : graph_table) {
    if (key.first != id || !entry->alive || (device >= 0 && key.second != device)) continue;
    auto tombstone = std::make_unique<GraphEntry>();
    tombstone->device = entry->device;
    tombstone->alive = false;
    entry = std::move(tombstone);
  }
}

size_t LiveGraphs() {
  std::lock_guard<std::mutex> lock(table_mutex);
  size_t n = 0;
  for (const auto& [key, entry] : graph_table) n += entry->alive ? 1 : 0;
  return n;
}

// ---------------------------------------------------------------------------
// Replay
// ---------------------------------------------------------------------------

ffi::Error CheckBuffer(const char* what, size_t index, size_t got, size_t want) {
  if (got == want) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(std::string("jaxgraph_replay: ") + what + " " +
                                     std::to_string(index) + " has " + std::to_string(got) +
                                     " bytes, the graph's static buffer has " +
                                     std::to_string(want));
}

ffi::Error Copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0 || dst == src) return ffi::Error::Success();
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
  if (err != cudaSuccess) return ffi::Error::Internal(CudaMessage("cudaMemcpyAsync", err));
  return ffi::Error::Success();
}

// Adds the graph as a child node of the capture in progress on `stream` and
// makes it the stream's only dependency, so later captured work follows it.
ffi::Error Splice(cudaGraph_t child, cudaStream_t stream) {
  cudaStreamCaptureStatus status;
  cudaGraph_t capture_graph = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  size_t num_deps = 0;
  cudaError_t err = cudaStreamGetCaptureInfo(stream, &status, nullptr, &capture_graph, &deps,
                                             nullptr, &num_deps);
  if (err != cudaSuccess) return ffi::Error::Internal(CudaMessage("cudaStreamGetCaptureInfo", err));
  cudaGraphNode_t node;
  err = cudaGraphAddChildGraphNode(&node, capture_graph, deps, num_deps, child);
  if (err != cudaSuccess) return ffi::Error::Internal(CudaMessage("cudaGraphAddChildGraphNode", err));
  err = cudaStreamUpdateCaptureDependencies(stream, &node, nullptr, 1,
                                            cudaStreamSetCaptureDependencies);
  if (err != cudaSuccess) {
    return ffi::Error::Internal(CudaMessage("cudaStreamUpdateCaptureDependencies", err));
  }
  return ffi::Error::Success();
}

ffi::Error ReplayImpl(cudaStream_t stream, int32_t device, ffi::RemainingArgs args,
                      ffi::RemainingRets rets, int64_t graph_id) {
  // Held across the enqueue so a concurrent unregister cannot free the
  // executable between lookup and launch.
  std::lock_guard<std::mutex> lock(table_mutex);
  auto it = graph_table.find({graph_id, device});
  if (it == graph_table.end()) {
    bool other_device = false;
    for (const auto& [key, entry] : graph_table) other_device |= key.first == graph_id;
    if (other_device) {
      return ffi::Error::InvalidArgument(
          "jaxgraph_replay: graph " + std::to_string(graph_id) + " was not captured for device " +
          std::to_string(device) + "; capture a graph on that device and register it");
    }
    return ffi::Error::InvalidArgument(
        "jaxgraph_replay: graph " + std::to_string(graph_id) +
        " is not registered in this process; build the function with jaxgraph.replayable(...) "
        "in this process (compiled functions cannot be moved between processes)");
  }
  GraphEntry& entry = *it->second;
  if (!entry.alive) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jaxgraph_replay: graph " + std::to_string(graph_id) +
                          " was reset or destroyed after this function was compiled; "
                          "capture it again and build a new replayable function");
  }
  if (args.size() != entry.inputs.size() || rets.size() != entry.outputs.size()) {
    return ffi::Error::InvalidArgument("jaxgraph_replay: operand or result count does not match "
                                       "the registered graph");
  }
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    if (auto e = CheckBuffer("operand", i, buffer->size_bytes(), entry.inputs[i].bytes); e.failure())
      return e;
    if (auto e = Copy(entry.inputs[i].data, buffer->untyped_data(), entry.inputs[i].bytes, stream);
        e.failure())
      return e;
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(stream, &status);
  if (err != cudaSuccess) return ffi::Error::Internal(CudaMessage("cudaStreamIsCapturing", err));
  if (status == cudaStreamCaptureStatusActive) {
    if (auto e = Splice(entry.graph, stream); e.failure()) return e;
    splice_count.fetch_add(1, std::memory_order_relaxed);
  } else {
    err = cudaGraphLaunch(entry.exec, stream);
    if (err != cudaSuccess) return ffi::Error::Internal(CudaMessage("cudaGraphLaunch", err));
    launch_count.fetch_add(1, std::memory_order_relaxed);
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    if (auto e = CheckBuffer("result", i, (*buffer)->size_bytes(), entry.outputs[i].bytes);
        e.failure())
      return e;
    if (auto e = Copy((*buffer)->untyped_data(), entry.outputs[i].data, entry.outputs[i].bytes,
                      stream);
        e.failure())
      return e;
  }
  return ffi::Error::Success();
}

}  // namespace

// Command-buffer compatible: under XLA's stream capture the graph is spliced
// in as a child node (see Splice) instead of launched.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Replay, ReplayImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .RemainingArgs()          // bound to the static inputs
                                  .RemainingRets()          // copied from the static outputs
                                  .Attr<int64_t>("graph"),  // graph table id
                              {xla::ffi::Traits::kCmdBufferCompatible});

template <typename T>
nb::capsule EncapsulateFfiHandler(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "Encapsulated function must be an XLA FFI handler");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

NB_MODULE(_replay, m) {
  m.def("registrations", []() {
    nb::dict registrations;
    registrations["jaxgraph_replay"] = EncapsulateFfiHandler(Replay);
    return registrations;
  });
  m.def("register_graph", &RegisterGraph, nb::arg("id"), nb::arg("device"), nb::arg("graph"),
        nb::arg("inputs"), nb::arg("outputs"),
        "Clone and instantiate a captured graph for one device; return its table id "
        "(a new one when id <= 0).");
  m.def("unregister_graph", &UnregisterGraph, nb::arg("id"), nb::arg("device") = -1,
        "Mark a graph id dead on `device` (every device when < 0) and free its clone and "
        "executable; idempotent.");
  m.def("live_graphs", &LiveGraphs, "Number of live (graph, device) entries.");
  m.def("launch_count", []() { return launch_count.load(); },
        "How many times the handler launched a graph on XLA's stream.");
  m.def("splice_count", []() { return splice_count.load(); },
        "How many times the handler spliced a graph into XLA's stream capture.");
}
