// XLA FFI handler that replays a captured CUDA graph on XLA's stream, bound
// to XLA's own buffers. Python side: jaxgraph/_jax_replay.py.
//
// Python registers a captured graph with its static input and output buffers
// for one device; the table keeps its own clone of the template and its own
// executable, so the Python CUDAGraph can be reset independently (a reset
// retires the entry, and a compiled function that still names it gets a clear
// error instead of a launch of freed memory). One id holds one graph per
// device (jaxgraph.capture_per_device, Replayable.add_device): under
// shard_map or pmap XLA runs the same call on every device, each on its own
// thread and stream, and the handler picks the graph of the device ordinal
// XLA passes the call, bound to that device's buffers. Nothing is shared
// between devices but the id; each device's graph has its own lock.
//
// At each call the graph's kernel nodes are pointed at XLA's operands and
// results (graph_binding.h); a buffer that cannot be rebound safely is copied
// into its static array before the replay (inputs) or out of it after
// (outputs). A few executables are kept per graph, each bound to one set of
// XLA's addresses, so buffers that alternate between calls rebind nothing
// (device_graph.h).
// When XLA records the call into its own command buffer (stream capture),
// cudaGraphLaunch is not permitted: the graph's nodes, bound to XLA's
// buffers, are added to XLA's capture instead (graph_splice.h).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.h"
#include "graph_binding.h"
#include "graph_splice.h"
#include "device_graph.h"
#include "nanobind/stl/map.h"
#include "nanobind/stl/pair.h"
#include "nanobind/stl/string.h"
#include "nanobind/stl/tuple.h"
#include "nanobind/stl/vector.h"

namespace jaxgraph {
namespace {

// ---------------------------------------------------------------------------
// Graph table
// ---------------------------------------------------------------------------

// Every device's graph for one id; a retired device keeps a tombstone.
struct GraphSet {
  std::mutex mutex;
  std::vector<std::shared_ptr<DeviceGraph>> by_device;
  std::vector<char> retired;

  std::shared_ptr<DeviceGraph> Get(int device, bool* retired_out) {
    std::lock_guard<std::mutex> lock(mutex);
    size_t d = static_cast<size_t>(device);
    *retired_out = d < retired.size() && retired[d];
    return d < by_device.size() ? by_device[d] : nullptr;
  }

  // The devices with a live graph, as "0, 1", for messages.
  std::string LiveDevices() {
    std::lock_guard<std::mutex> lock(mutex);
    std::string out;
    for (size_t d = 0; d < by_device.size(); ++d) {
      if (by_device[d] == nullptr) continue;
      out += (out.empty() ? "" : ", ") + std::to_string(d);
    }
    return out.empty() ? "none" : out;
  }
};

HandleTable<GraphSet> graph_table;
std::atomic<int64_t> next_graph_id{1};

// How the handler ran graphs, for tests and profiles.
std::atomic<int64_t> launch_count{0};   // launched on XLA's stream
std::atomic<int64_t> handler_calls{0};  // calls of the handler, and their host time:
std::atomic<int64_t> handler_ns{0};     // what benchmarks/profile_call.py reports
std::atomic<int64_t> splice_count{0};   // spliced into XLA's command buffer
std::atomic<int64_t> copy_count{0};     // buffers copied in or out

using BufferSpec = std::vector<std::pair<uint64_t, uint64_t>>;  // (address, bytes)

// Pairs each input with the output of the same static buffer (XLA aliases
// them, so one XLA buffer serves both), and copies inputs the user aliased to
// another output: the graph's writes to that output must not race its reads.
void PairAliases(DeviceGraph* g, const std::vector<std::pair<int, int>>& user_aliases) {
  g->alias.assign(g->num_inputs, -1);
  for (size_t i = 0; i < g->num_inputs; ++i) {
    for (size_t j = g->num_inputs; j < g->buffers.size(); ++j) {
      if (g->buffers[i].base == g->buffers[j].base && g->buffers[i].bytes == g->buffers[j].bytes) {
        g->alias[i] = static_cast<int>(j - g->num_inputs);
      }
    }
  }
  for (const auto& [input, output] : user_aliases) {
    if (input < 0 || static_cast<size_t>(input) >= g->num_inputs) {
      throw std::invalid_argument("alias names input " + std::to_string(input) + ", which does not exist");
    }
    if (g->alias[input] != output) {
      g->buffers[input].Copy("aliased to output " + std::to_string(output) +
                             ": copied so the graph's writes cannot race its reads");
    }
  }
  for (size_t i = 0; i < g->num_inputs; ++i) {
    if (g->alias[i] < 0) continue;
    Binding& out = g->buffers[g->num_inputs + g->alias[i]];
    Binding& in = g->buffers[i];
    in.mode = out.mode;  // one buffer: it follows its output
    in.reason = out.mode == BindMode::kCopied ? out.reason : "shares its buffer with output " +
                                                                   std::to_string(g->alias[i]);
  }
}

std::unique_ptr<DeviceGraph> BuildDeviceGraph(int device, uint64_t graph, const BufferSpec& inputs,
                                              const BufferSpec& outputs,
                                              const std::vector<std::pair<int, int>>& aliases,
                                              const KernelFlags& kernels, bool bind) {
  auto g = std::make_unique<DeviceGraph>();
  g->device = device;
  g->num_inputs = inputs.size();
  for (const BufferSpec* spec : {&inputs, &outputs}) {
    for (const auto& [ptr, bytes] : *spec) {
      Binding b;
      b.base = ptr;
      b.bytes = bytes;
      g->buffers.push_back(b);
    }
  }
  if (HasMemoryNodes(reinterpret_cast<CUgraph>(graph))) {
    // CUDA cannot clone such a graph (cudaErrorNotSupported), and a clone is what
    // binds XLA's buffers and goes into XLA's command buffers.
    throw std::runtime_error(
        "the graph allocates or frees memory in its own nodes (stream-ordered cudaMallocAsync / "
        "cuMemAllocAsync during the capture, e.g. by another library's allocator), which CUDA "
        "cannot clone, so it cannot be replayed inside jit; allocate before the capture (or with "
        "jaxgraph, whose pool needs no memory nodes), or replay from the host with "
        "via=\"callback\"");
  }
  cudaGraph_t clone = nullptr;
  cudaError_t err = cudaGraphClone(&clone, reinterpret_cast<cudaGraph_t>(graph));
  if (err != cudaSuccess) throw std::runtime_error(RuntimeError("cudaGraphClone", err));
  g->graph = reinterpret_cast<CUgraph>(clone);
  if (bind) {
    GraphScan(&g->buffers, &kernels, g->num_inputs).Scan(g->graph, &g->nodes);
  } else {
    for (auto& b : g->buffers) b.Copy("bind='copy' was asked for");
  }
  for (size_t i = 0; i < g->buffers.size(); ++i) {
    // No argument points at it: copy it, in case the graph reaches it some way
    // jaxgraph cannot see (a pointer stored in device memory).
    if (g->buffers[i].mode == BindMode::kUnused) {
      g->buffers[i].Copy("no kernel argument points at it (the graph may reach it through device memory)");
    }
  }
  PairAliases(g.get(), aliases);
  for (auto& k : g->nodes) {  // the nodes were moved into place: point at their own storage
    if (k.unreadable || k.params.extra != nullptr) continue;  // the driver's own arguments
    for (size_t i = 0; i < k.values.size(); ++i) k.arguments[i] = k.values[i].data();
    k.params.kernelParams = k.arguments.data();
  }
  for (size_t i = 0; i < g->buffers.size(); ++i) {
    if (g->buffers[i].mode == BindMode::kBound && !g->buffers[i].sites.empty()) g->bound.push_back(i);
  }
  g->dirty.assign(g->nodes.size(), 0);
  for (const Binding& b : g->buffers) g->static_addr.push_back(b.base);
  g->template_addr = g->static_addr;
  g->slots.reserve(kMaxExecs);
  if (!OrderNodes(g->graph, g->nodes, &g->order, &g->unflattenable) && g->unflattenable.empty()) {
    g->unflattenable = "the graph's nodes could not be ordered";
  }
  AddSlot(g.get());  // the first executable now, so the first call only launches
  return g;
}

// Registers a graph for `device`, whose primary context the caller made
// current. Returns the id to pass as the `graph` attribute (a new one when
// id <= 0). Raises on CUDA errors.
int64_t RegisterGraph(int64_t id, int device, uint64_t graph, const BufferSpec& inputs,
                      const BufferSpec& outputs, const std::vector<std::pair<int, int>>& aliases,
                      const KernelFlags& kernels, bool bind) {
  if (device < 0) throw std::invalid_argument("device must be a CUDA ordinal >= 0");
  if (graph == 0) throw std::invalid_argument("graph must be a live cudaGraph_t");
  // Makes the runtime agree with the driver even on a thread where it has not been used yet.
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) throw std::runtime_error(RuntimeError("cudaSetDevice", err));
  std::shared_ptr<DeviceGraph> entry =
      BuildDeviceGraph(device, graph, inputs, outputs, aliases, kernels, bind);
  HandleTable<GraphSet>::Status status;
  std::shared_ptr<GraphSet> set = id > 0 ? graph_table.Find(id, &status) : nullptr;
  if (set == nullptr) {
    if (id <= 0) id = next_graph_id++;
    set = std::make_shared<GraphSet>();
    graph_table.Insert(id, set);
  }
  std::lock_guard<std::mutex> lock(set->mutex);
  size_t d = static_cast<size_t>(device);
  if (d < set->by_device.size() && set->by_device[d] != nullptr) {
    throw std::invalid_argument("graph " + std::to_string(id) + " is already registered for device " +
                                std::to_string(device));
  }
  if (set->by_device.size() <= d) {
    set->by_device.resize(d + 1);
    set->retired.resize(d + 1, 0);
  }
  set->by_device[d] = std::move(entry);
  set->retired[d] = 0;
  return id;
}

// Retires `id` on `device` (every device when device < 0); the clone and
// executable are freed once no call is using them.
void UnregisterGraph(int64_t id, int device) {
  HandleTable<GraphSet>::Status status;
  std::shared_ptr<GraphSet> set = graph_table.Find(id, &status);
  if (set == nullptr) return;
  std::lock_guard<std::mutex> lock(set->mutex);
  for (size_t d = 0; d < set->by_device.size(); ++d) {
    if (device >= 0 && d != static_cast<size_t>(device)) continue;
    if (set->by_device[d] != nullptr) set->retired[d] = 1;
    set->by_device[d] = nullptr;
  }
}

size_t LiveGraphs() {
  size_t n = 0;
  // Counting needs every set; ids are dense, so walk them.
  for (int64_t id = 1; id < next_graph_id; ++id) {
    HandleTable<GraphSet>::Status status;
    std::shared_ptr<GraphSet> set = graph_table.Find(id, &status);
    if (set == nullptr) continue;
    std::lock_guard<std::mutex> lock(set->mutex);
    for (const auto& g : set->by_device) n += g != nullptr ? 1 : 0;
  }
  return n;
}

// (kind, index, mode, sites, reason) for each static buffer of `id` on `device`.
std::vector<std::tuple<std::string, int, std::string, int, std::string>> DescribeBindings(
    int64_t id, int device) {
  HandleTable<GraphSet>::Status status;
  std::shared_ptr<GraphSet> set = graph_table.Find(id, &status);
  bool retired = false;
  std::shared_ptr<DeviceGraph> g = set != nullptr ? set->Get(device, &retired) : nullptr;
  if (g == nullptr) throw std::invalid_argument("graph " + std::to_string(id) + " is not live on device " +
                                                std::to_string(device));
  std::lock_guard<std::mutex> lock(g->mutex);
  std::vector<std::tuple<std::string, int, std::string, int, std::string>> out;
  for (size_t i = 0; i < g->buffers.size(); ++i) {
    const Binding& b = g->buffers[i];
    bool input = i < g->num_inputs;
    int index = static_cast<int>(input ? i : i - g->num_inputs);
    const char* mode = b.mode == BindMode::kBound ? "bound" : "copied";
    size_t sites = input && g->alias[i] >= 0 ? g->buffers[g->num_inputs + g->alias[i]].sites.size()
                                              : b.sites.size();
    out.emplace_back(input ? "input" : "output", index, mode, static_cast<int>(sites), b.reason);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Replay
// ---------------------------------------------------------------------------

ffi::Error CheckBytes(const char* what, size_t index, size_t got, size_t want) {
  if (got == want) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(std::string("jaxgraph_replay: ") + what + " " +
                                     std::to_string(index) + " has " + std::to_string(got) +
                                     " bytes, the graph's static buffer has " + std::to_string(want));
}

ffi::Error Copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0 || dst == src) return ffi::Error::Success();
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
  if (err != cudaSuccess) return ffi::Error::Internal(RuntimeError("cudaMemcpyAsync", err));
  copy_count.fetch_add(1, std::memory_order_relaxed);
  return ffi::Error::Success();
}

// Adds `child` as one node of the capture in progress on `stream` and makes it
// the stream's only dependency, so later captured work follows it (for graphs
// whose nodes cannot be spliced one by one; see graph_splice.h).
ffi::Error Splice(cudaGraph_t child, cudaStream_t stream) {
  cudaStreamCaptureStatus status;
  cudaGraph_t capture_graph = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  size_t num_deps = 0;
  cudaError_t err = cudaStreamGetCaptureInfo(stream, &status, nullptr, &capture_graph, &deps,
                                             nullptr, &num_deps);
  if (err != cudaSuccess) return ffi::Error::Internal(RuntimeError("cudaStreamGetCaptureInfo", err));
  cudaGraphNode_t node;
  err = cudaGraphAddChildGraphNode(&node, capture_graph, deps, num_deps, child);
  if (err != cudaSuccess) return ffi::Error::Internal(RuntimeError("cudaGraphAddChildGraphNode", err));
  err = cudaStreamUpdateCaptureDependencies(stream, &node, nullptr, 1, cudaStreamSetCaptureDependencies);
  if (err != cudaSuccess) {
    return ffi::Error::Internal(RuntimeError("cudaStreamUpdateCaptureDependencies", err));
  }
  return ffi::Error::Success();
}

// XLA's address for each static buffer: an input's operand, an output's result
// (an input paired with an output takes the output's: XLA aliases them).
ffi::Error XlaAddresses(const DeviceGraph& g, ffi::RemainingArgs args, ffi::RemainingRets rets,
                        std::vector<uint64_t>* addresses) {
  if (args.size() != g.num_inputs || rets.size() != g.buffers.size() - g.num_inputs) {
    return ffi::Error::InvalidArgument("jaxgraph_replay: operand or result count does not match "
                                       "the registered graph");
  }
  addresses->resize(g.buffers.size());
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    if (auto e = CheckBytes("operand", i, buffer->size_bytes(), g.buffers[i].bytes); e.failure()) return e;
    (*addresses)[i] = reinterpret_cast<uint64_t>(buffer->untyped_data());
  }
  for (size_t j = 0; j < rets.size(); ++j) {
    auto buffer = rets.get<ffi::AnyBuffer>(j);
    if (buffer.has_error()) return buffer.error();
    const Binding& b = g.buffers[g.num_inputs + j];
    if (auto e = CheckBytes("result", j, (*buffer)->size_bytes(), b.bytes); e.failure()) return e;
    (*addresses)[g.num_inputs + j] = reinterpret_cast<uint64_t>((*buffer)->untyped_data());
  }
  return ffi::Error::Success();
}

// Copies the inputs in (or, with `outputs`, the outputs out) that are copied:
// all of them when `everything` (a graph spliced whole at its static addresses).
ffi::Error CopyBuffers(DeviceGraph* g, const std::vector<uint64_t>& addresses, bool outputs,
                       bool everything, cudaStream_t stream) {
  size_t begin = outputs ? g->num_inputs : 0, end = outputs ? g->buffers.size() : g->num_inputs;
  for (size_t i = begin; i < end; ++i) {
    const Binding& b = g->buffers[i];
    if (b.mode != BindMode::kCopied && !everything) continue;
    void* xla = reinterpret_cast<void*>(addresses[i]);
    void* static_array = reinterpret_cast<void*>(b.base);
    auto e = outputs ? Copy(xla, static_array, b.bytes, stream) : Copy(static_array, xla, b.bytes, stream);
    if (e.failure()) return e;
  }
  return ffi::Error::Success();
}

ffi::Error RunGraph(DeviceGraph* g, cudaStream_t stream, const std::vector<uint64_t>& addresses) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(stream, &status);
  if (err != cudaSuccess) return ffi::Error::Internal(RuntimeError("cudaStreamIsCapturing", err));
  bool splice = status == cudaStreamCaptureStatusActive;
  bool whole = splice && !g->unflattenable.empty();  // spliced as one child graph: copy everything
  if (auto e = CopyBuffers(g, addresses, false, whole, stream); e.failure()) return e;
  if (whole) {
    // The template is spliced as it is, with every buffer copied to and from
    // its static array: point it back there if a launch retargeted it.
    if (g->template_addr != g->static_addr) {
      if (auto e = PointTemplateAt(g, g->static_addr); e.failure()) return e;
    }
    if (auto e = Splice(reinterpret_cast<cudaGraph_t>(g->graph), stream); e.failure()) return e;
    splice_count.fetch_add(1, std::memory_order_relaxed);
  } else if (splice) {
    RetargetAll(g, addresses);
    if (auto e = SpliceNodes(g->order, g->nodes, stream); e.failure()) return e;
    splice_count.fetch_add(1, std::memory_order_relaxed);
  } else {
    ExecSlot* slot = nullptr;
    if (auto e = PrepareExec(g, addresses, &slot); e.failure()) return e;
    err = cudaGraphLaunch(slot->exec, stream);
    if (err != cudaSuccess) return ffi::Error::Internal(RuntimeError("cudaGraphLaunch", err));
    launch_count.fetch_add(1, std::memory_order_relaxed);
  }
  return CopyBuffers(g, addresses, true, whole, stream);
}

ffi::Error ReplayBody(cudaStream_t stream, int32_t device, ffi::RemainingArgs args,
                      ffi::RemainingRets rets, int64_t graph_id) {
  HandleTable<GraphSet>::Status status;
  std::shared_ptr<GraphSet> set = graph_table.Find(graph_id, &status);
  bool retired = false;
  std::shared_ptr<DeviceGraph> g = set != nullptr ? set->Get(device, &retired) : nullptr;
  if (g == nullptr) {
    std::string what = "graph " + std::to_string(graph_id);
    if (set != nullptr && !retired) {
      // The device XLA runs this call on (its FFI device ordinal, the CUDA
      // ordinal) has no graph: e.g. a mesh larger than the capture.
      return ffi::Error::InvalidArgument(
          "jaxgraph_replay: " + what + " was not captured for device " + std::to_string(device) +
          " (it has graphs for devices " + set->LiveDevices() + "); capture it on every device the "
          "computation runs on (jaxgraph.capture_per_device(..., devices=...), or "
          "Replayable.add_device)");
    }
    return UnusableId("jaxgraph_replay", what, retired,
                      retired ? "it was reset or destroyed after this function was compiled; capture "
                                "it again and build a new replayable function"
                              : "build the function with jaxgraph.replayable(...) in this process");
  }
  std::lock_guard<std::mutex> lock(g->mutex);
  thread_local std::vector<uint64_t> addresses;
  if (auto e = XlaAddresses(*g, args, rets, &addresses); e.failure()) return e;
  return RunGraph(g.get(), stream, addresses);
}

ffi::Error ReplayImpl(cudaStream_t stream, int32_t device, ffi::RemainingArgs args,
                      ffi::RemainingRets rets, int64_t graph_id, int64_t call) {
  (void)call;  // only makes each call site distinct, so XLA never merges two replays
  auto start = std::chrono::steady_clock::now();
  ffi::Error result = ReplayBody(stream, device, args, rets, graph_id);
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
  handler_calls.fetch_add(1, std::memory_order_relaxed);
  handler_ns.fetch_add(ns.count(), std::memory_order_relaxed);
  return result;
}

ffi::Error ReplayOnCpuImpl(ffi::RemainingArgs, ffi::RemainingRets, ffi::Dictionary) {
  return NotOnCuda("jaxgraph_replay (a jaxgraph.replayable)",
                   ", or build the replayable with via=\"callback\", which replays from the host");
}

}  // namespace
}  // namespace jaxgraph

// Command-buffer compatible: under XLA's stream capture the bound graph is
// spliced in as a child node (see Splice) instead of launched.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Replay, jaxgraph::ReplayImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<xla::ffi::DeviceOrdinal>()  // picks the device's graph
                                  .RemainingArgs()          // XLA's operands: the static inputs
                                  .RemainingRets()          // XLA's results: the static outputs
                                  .Attr<int64_t>("graph")   // graph table id
                                  .Attr<int64_t>("call"),   // distinct per call site
                              {xla::ffi::Traits::kCmdBufferCompatible});

// Registered for JAX's CPU platform: a clear error instead of "no handler".
XLA_FFI_DEFINE_HANDLER_SYMBOL(ReplayOnCpu, jaxgraph::ReplayOnCpuImpl,
                              xla::ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attrs<xla::ffi::Dictionary>());

NB_MODULE(_replay, m) {
  namespace nb = nanobind;
  using namespace jaxgraph;
  m.def("registrations", []() {
    nb::dict registrations;
    registrations["jaxgraph_replay"] = EncapsulateFfiHandler(Replay);
    return registrations;
  }, "FFI handler capsules for JAX's CUDA platform, by target name.");
  m.def("cpu_registrations", []() {
    nb::dict registrations;
    registrations["jaxgraph_replay"] = EncapsulateFfiHandler(ReplayOnCpu);
    return registrations;
  }, "FFI handler capsules for JAX's CPU platform: they fail saying jaxgraph needs CUDA.");
  m.def("register_graph", &RegisterGraph, nb::arg("id"), nb::arg("device"), nb::arg("graph"),
        nb::arg("inputs"), nb::arg("outputs"), nb::arg("aliases"), nb::arg("kernels"),
        nb::arg("bind"),
        "Clone and instantiate a captured graph for one device, find how its static buffers "
        "(address, bytes) bind to XLA's; return its table id (a new one when id <= 0). "
        "`aliases`: (input, output) pairs the caller aliases in XLA; `kernels`: handle -> one "
        "flag per parameter ('r' read-only pointer) of the kernels jaxgraph launched.");
  m.def("unregister_graph", &UnregisterGraph, nb::arg("id"), nb::arg("device") = -1,
        "Retire a graph id on `device` (every device when < 0); idempotent.");
  m.def("describe_bindings", &DescribeBindings, nb::arg("id"), nb::arg("device"),
        "(kind, index, mode, sites, reason) for each static buffer: mode is 'bound' or 'copied'.");
  m.def("live_graphs", &LiveGraphs, "Number of live (graph, device) entries.");
  m.def("counters", []() {
    nb::dict c;
    c["launch"] = launch_count.load();
    c["splice"] = splice_count.load();
    c["rebind"] = rebind_count.load();
    c["copy"] = copy_count.load();
    c["instantiate"] = instantiate_count.load();
    c["handler_calls"] = handler_calls.load();
    c["handler_ns"] = handler_ns.load();
    return c;
  }, "How the handler ran graphs: launches, splices, kernel-node rebinds, buffer copies, "
     "executables made; its calls and their total host time in ns.");
}
