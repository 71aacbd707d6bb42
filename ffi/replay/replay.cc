// XLA FFI handlers that replay a captured CUDA graph on XLA's stream, bound
// to XLA's own buffers. Python side: jaxgraph/_jax_interop/replay_boundary.py.
//
// Python registers a captured graph with its static buffers for one device
// (graph_table.h). At each call its kernel nodes are pointed at XLA's operands
// and results (graph_binding.h) in an executable kept for that set of
// addresses (exec_cache.h); a buffer better copied (bind_policy.h) is copied
// into its static array before the replay (inputs) or out of it after
// (outputs). Under XLA's stream capture (a command buffer being recorded) the
// nodes are added to XLA's capture instead (graph_splice.h). A graph with
// conditional nodes is called through jaxgraph_replay_uncaptured, which XLA
// keeps out of its command buffers (conditional_graph.h). Each path has its
// own counter.

#include <algorithm>
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

#include "bind_policy.h"
#include "capture_policy.h"
#include "common.h"
#include "conditional_graph.h"
#include "copy_nodes.h"
#include "device_graph.h"
#include "exec_cache.h"
#include "graph_binding.h"
#include "graph_splice.h"
#include "graph_table.h"
#include "knobs/replay_knobs.h"
#include "nanobind/stl/map.h"
#include "nanobind/stl/pair.h"
#include "nanobind/stl/string.h"
#include "nanobind/stl/tuple.h"
#include "nanobind/stl/vector.h"

namespace jaxgraph {
namespace {

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
  auto start = std::chrono::steady_clock::now();
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
  counters.copy_ns.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count(),
      std::memory_order_relaxed);
  if (err != cudaSuccess) return ffi::Error::Internal(RuntimeError("cudaMemcpyAsync", err));
  counters.copy.fetch_add(1, std::memory_order_relaxed);
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
// all of them when `everything` (a graph spliced whole at its static addresses),
// and the bound ones `also` names (a recording's plan, capture_policy.h); on a
// launch (`launch`) of a graph with copy nodes, none: every buffer with bytes
// has its node in the executable (copy_nodes.h).
ffi::Error CopyBuffers(DeviceGraph* g, const std::vector<uint64_t>& addresses, bool outputs,
                       bool everything, const std::vector<char>& also, cudaStream_t stream, bool launch) {
  if (launch && HasCopyNodes(*g)) return ffi::Error::Success();
  size_t begin = outputs ? g->num_inputs : 0, end = outputs ? g->buffers.size() : g->num_inputs;
  for (size_t i = begin; i < end; ++i) {
    const Binding& b = g->buffers[i];
    if (!b.Moves() && !everything && (also.empty() || !also[i])) continue;
    void* xla = reinterpret_cast<void*>(addresses[i]);
    void* static_array = reinterpret_cast<void*>(b.base);
    auto e = outputs ? Copy(xla, static_array, b.bytes, stream) : Copy(static_array, xla, b.bytes, stream);
    if (e.failure()) return e;
  }
  return ffi::Error::Success();
}

// Replays `g` on `stream`; `uncaptured`: called through jaxgraph_replay_uncaptured.
ffi::Error RunGraph(DeviceGraph* g, cudaStream_t stream, const std::vector<uint64_t>& addresses,
                    bool uncaptured) {
  const char* target = uncaptured ? "jaxgraph_replay_uncaptured" : "jaxgraph_replay";
  if (g->detached) {  // a reset detached it at once; the table entry goes when no capture is underway
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      std::string(target) + ": the graph was reset or destroyed after this function was "
                      "compiled; capture it again and build a new replayable function");
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(stream, &status);
  if (err != cudaSuccess) return ffi::Error::Internal(RuntimeError("cudaStreamIsCapturing", err));
  bool splice = status == cudaStreamCaptureStatusActive;
  if (splice && g->conditionals > 0) return CapturedConditional(target);
  auto stream_id = reinterpret_cast<uint64_t>(stream);
  if (!splice && std::find(g->streams.begin(), g->streams.end(), stream_id) == g->streams.end()) {
    g->streams.push_back(stream_id);  // what freeing its memory must wait for (graph_uses)
  }
  // Under capture (XLA recording), which bound buffers stay bound (capture_policy.h).
  CapturePlan plan = splice ? PlanCapture(g) : CapturePlan{};
  bool whole = splice && (plan.whole || !g->unflattenable.empty());  // one child graph: copy everything
  if (whole) plan.copy.clear();
  bool launch = !splice && g->conditionals == 0;
  if (auto e = CopyBuffers(g, addresses, false, whole, plan.copy, stream, launch); e.failure()) return e;
  if (g->conditionals > 0) {
    if (auto e = LaunchConditional(g, stream, addresses); e.failure()) return e;
    counters.Count(uncaptured ? ReplayPath::kUncapturedLaunch : ReplayPath::kLaunch);
  } else if (whole) {
    // The template is spliced as it is, with every buffer copied to and from
    // its static array: point it back there if a launch retargeted it.
    if (g->template_addr != g->static_addr) {
      if (auto e = PointTemplateAt(g, g->static_addr); e.failure()) return e;
    }
    if (!HasCopyNodes(*g)) {
      if (auto e = SpliceWhole(reinterpret_cast<cudaGraph_t>(g->graph), stream); e.failure()) return e;
    } else {  // XLA's recording copies on its stream, so the template goes without its copy nodes
      cudaGraph_t clone = CloneWithoutCopyNodes(*g);
      if (clone == nullptr) return ffi::Error::Internal("jaxgraph_replay: cloning the graph without its copy nodes failed");
      ffi::Error e = SpliceWhole(clone, stream);
      cudaGraphDestroy(clone);
      if (e.failure()) return e;
    }
    counters.Count(ReplayPath::kSpliceWhole);
  } else if (splice) {
    RetargetAll(g, SpliceAddresses(*g, addresses, plan));
    if (auto e = SpliceNodes(g->order, g->nodes, stream); e.failure()) return e;
    counters.Count(ReplayPath::kSpliceNodes);
  } else {
    using Clock = std::chrono::steady_clock;
    auto start = Clock::now();
    Prepared prepared;
    if (auto e = PrepareExec(g, addresses, &prepared); e.failure()) return e;
    if (HasCopyNodes(*g)) {
      if (auto e = WriteRingEntry(g, addresses); e.failure()) return e;
    }
    auto launched = Clock::now();
    err = cudaGraphLaunch(prepared.slot->exec, stream);
    if (err != cudaSuccess) return ffi::Error::Internal(RuntimeError("cudaGraphLaunch", err));
    if (HasCopyNodes(*g)) g->ring.Launched();
    auto end = Clock::now();
    counters.launch_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(end - launched).count(),
                                 std::memory_order_relaxed);
    counters.prepare_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(launched - start).count(),
                                  std::memory_order_relaxed);
    counters.Count(uncaptured ? ReplayPath::kUncapturedLaunch : ReplayPath::kLaunch);
    using Ns = std::chrono::duration<double, std::nano>;
    NoteLaunch(g, prepared, Ns(launched - start).count(), Ns(end - launched).count());
    if (auto e = CopyBuffers(g, addresses, true, false, plan.copy, stream, true); e.failure()) return e;
    // After the copies out: a buffer switched to copying is copied from the next call. Not once
    // XLA has recorded the graph: a recording that copied one more buffer would differ in shape
    // from XLA's earlier ones, which XLA cannot update from (capture_policy.h).
    return g->capture_policy >= 0 ? ffi::Error::Success() : Adapt(g);
  }
  return CopyBuffers(g, addresses, true, whole, plan.copy, stream, launch);
}

ffi::Error ReplayBody(cudaStream_t stream, int32_t device, ffi::RemainingArgs args,
                      ffi::RemainingRets rets, int64_t graph_id, bool uncaptured) {
  HandleStatus status;
  std::shared_ptr<GraphSet> set = graph_table.Find(graph_id, &status);
  std::shared_ptr<DeviceGraph> g = set != nullptr ? set->Find(device, &status) : nullptr;
  if (g == nullptr) {
    bool retired = status == HandleStatus::kRetired;  // the device's graph, or (no set) the id
    std::string what = "graph " + std::to_string(graph_id);
    if (set != nullptr && !retired) {
      // The device XLA runs this call on (its FFI device ordinal, the CUDA
      // ordinal) has no graph: e.g. a mesh larger than the capture.
      return ffi::Error::InvalidArgument(
          "jaxgraph_replay: " + what + " was not captured for device " + std::to_string(device) +
          " (it has graphs for devices " + LiveDevices(*set) + "); capture it on every device the "
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
  return RunGraph(g.get(), stream, addresses, uncaptured);
}

// The body of both CUDA handlers, timed.
ffi::Error ReplayTimed(cudaStream_t stream, int32_t device, ffi::RemainingArgs args, ffi::RemainingRets rets,
                       int64_t graph_id, bool uncaptured) {
  auto start = std::chrono::steady_clock::now();
  ffi::Error result = ReplayBody(stream, device, args, rets, graph_id, uncaptured);
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
  counters.handler_calls.fetch_add(1, std::memory_order_relaxed);
  counters.handler_ns.fetch_add(ns.count(), std::memory_order_relaxed);
  return result;
}

ffi::Error ReplayImpl(cudaStream_t stream, int32_t device, ffi::RemainingArgs args,
                      ffi::RemainingRets rets, int64_t graph_id, int64_t call) {
  (void)call;  // only makes each call site distinct, so XLA never merges two replays
  return ReplayTimed(stream, device, args, rets, graph_id, false);
}

ffi::Error ReplayUncapturedImpl(cudaStream_t stream, int32_t device, ffi::RemainingArgs args,
                                ffi::RemainingRets rets, int64_t graph_id, int64_t call) {
  (void)call;
  return ReplayTimed(stream, device, args, rets, graph_id, true);
}

ffi::Error ReplayOnCpuImpl(ffi::RemainingArgs, ffi::RemainingRets, ffi::Dictionary) {
  // via="callback" replays the graph from the host, still on a GPU: only a hint where one exists.
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  cudaGetLastError();
  return NotOnCuda("jaxgraph_replay (a jaxgraph.replayable)",
                   gpus > 0 ? ", or build the replayable with via=\"callback\", which replays from the host"
                            : "; this machine has no CUDA device either, and a replayable replays its CUDA "
                              "graph on a GPU however it is called (via=\"callback\" too). Without a GPU, "
                              "check a program by lowering it for CUDA: "
                              "jax.jit(f).trace(*args).lower(lowering_platforms=(\"cuda\",))");
}

// Python's view of registration: a dict of options, checked here.
std::tuple<int64_t, std::vector<bool>> RegisterFromPython(int64_t id, int device, uint64_t graph,
                                                          const BufferSpec& inputs, const BufferSpec& outputs,
                                                          const AliasList& aliases, const KernelFlags& kernels,
                                                          bool bind, bool trust_foreign, bool drop_unreferenced,
                                                          const std::vector<uint64_t>& bodies,
                                                          uint64_t borrowed_exec,
                                                          const std::vector<uint64_t>& ring_kernels) {
  RegisterOptions options;
  options.scan.kernels = &kernels;
  options.scan.trust_foreign = trust_foreign;
  options.scan.bodies = bodies;
  options.bind = bind;
  options.drop_unreferenced = drop_unreferenced;
  options.borrowed_exec = borrowed_exec;
  if (!ring_kernels.empty() && ring_kernels.size() != 2) {
    throw std::invalid_argument("ring_kernels: (copy, advance) CUfunctions, or none");
  }
  if (ring_kernels.size() == 2) options.ring = RingKernels{ring_kernels[0], ring_kernels[1]};
  auto [out_id, kept] = RegisterGraph(id, device, graph, inputs, outputs, aliases, options);
  return {out_id, kept};
}

}  // namespace
}  // namespace jaxgraph

// What both CUDA handlers take.
inline auto ReplayBinding() {
  return xla::ffi::Ffi::Bind()
      .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
      .Ctx<xla::ffi::DeviceOrdinal>()  // picks the device's graph
      .RemainingArgs()                 // XLA's operands: the static inputs
      .RemainingRets()                 // XLA's results: the static outputs
      .Attr<int64_t>("graph")          // graph table id
      .Attr<int64_t>("call");          // distinct per call site
}

// Command-buffer compatible: under XLA's stream capture the bound graph is
// spliced in (graph_splice.h) instead of launched.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Replay, jaxgraph::ReplayImpl, ReplayBinding(),
                              {xla::ffi::Traits::kCmdBufferCompatible});

// The same without the command-buffer trait, for graphs with conditional
// nodes: XLA runs it outside its command buffers, splitting them around it.
XLA_FFI_DEFINE_HANDLER_SYMBOL(ReplayUncaptured, jaxgraph::ReplayUncapturedImpl, ReplayBinding());

// Registered for JAX's CPU platform: a clear error instead of "no handler".
XLA_FFI_DEFINE_HANDLER_SYMBOL(ReplayOnCpu, jaxgraph::ReplayOnCpuImpl,
                              xla::ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attrs<xla::ffi::Dictionary>());

NB_MODULE(_replay, m) {
  namespace nb = nanobind;
  using namespace jaxgraph;
  auto handlers = [](XLA_FFI_Error* (*replay)(XLA_FFI_CallFrame*), XLA_FFI_Error* (*uncaptured)(XLA_FFI_CallFrame*)) {
    nb::dict registrations;
    registrations["jaxgraph_replay"] = EncapsulateFfiHandler(replay);
    registrations["jaxgraph_replay_uncaptured"] = EncapsulateFfiHandler(uncaptured);
    return registrations;
  };
  m.def("registrations", [handlers]() { return handlers(Replay, ReplayUncaptured); },
        "FFI handler capsules for JAX's CUDA platform, by target name.");
  m.def("cpu_registrations", [handlers]() { return handlers(ReplayOnCpu, ReplayOnCpu); },
        "FFI handler capsules for JAX's CPU platform: they fail saying jaxgraph needs CUDA.");
  m.def("register_graph", &RegisterFromPython, nb::arg("id"), nb::arg("device"), nb::arg("graph"),
        nb::arg("inputs"), nb::arg("outputs"), nb::arg("aliases"), nb::arg("kernels"),
        nb::arg("bind"), nb::arg("trust_foreign"), nb::arg("drop_unreferenced"), nb::arg("bodies"),
        nb::arg("borrowed_exec"), nb::arg("ring_kernels") = std::vector<uint64_t>{},
        "Enter a captured graph for one device (a clone, or the template itself when it has "
        "conditional nodes), find how its static buffers (address, bytes) bind to XLA's; return "
        "(table id, which inputs stay operands). `id` <= 0 asks for a new id. `aliases`: (input, "
        "output) pairs the caller aliases in XLA; `kernels`: handle -> one flag per parameter ('r' "
        "read-only pointer) of the kernels jaxgraph launched; `trust_foreign`: bind outputs that "
        "other kernels receive; `drop_unreferenced`: leave out inputs nothing refers to; `bodies`: "
        "the conditional bodies the capture made; `borrowed_exec`: the CUDAGraph's executable, "
        "shared where CUDA allows one executable of a conditional graph; `ring_kernels`: the copy nodes' "
        "(copy, advance) CUfunctions in the device's context, for a graph large enough to copy by nodes "
        "(none: its copies go on the stream).");
  m.def("unregister_graph", [](int64_t id, int device) {
          UnregisterGraph(id, device);
          SweepRetiredRings();  // here: no lock held, not a handler's thread
        }, nb::arg("id"), nb::arg("device") = -1, nb::call_guard<nb::gil_scoped_release>(),
        "Retire a graph id on `device` (every device when < 0); idempotent. Then frees the copy rings "
        "of retired graphs whose calls have finished (sweep_copy_rings).");
  m.def("sweep_copy_rings", &SweepRetiredRings, nb::call_guard<nb::gil_scoped_release>(),
        "Free the copy rings of retired graphs whose calls have all finished on the device (no wait, "
        "no device-wide synchronize); return how many rings are still waiting for their calls.");
  m.def("retired_copy_rings", &RetiredRings, "Copy rings of retired graphs not freed yet.");
  m.def("detach_graph", &DetachGraph, nb::arg("id"), nb::arg("device") = -1,
        "Stop a graph id from using its CUDAGraph's template and executable, at once (before a "
        "reset destroys them); destroys nothing, so it is safe during a capture.");
  m.def("graph_uses", [](int64_t id, int device) {
          std::vector<std::tuple<int, bool, std::vector<uint64_t>>> out;
          for (const auto& g : GraphsOf(id, device)) {
            std::lock_guard<std::mutex> lock(g->mutex);  // waits for a call in progress
            out.emplace_back(g->device, g->capture_policy >= 0, g->streams);
          }
          return out;
        }, nb::arg("id"), nb::arg("device") = -1, nb::call_guard<nb::gil_scoped_release>(),
        "(device, recorded, streams) for each live graph of `id` (every device when `device` < 0): whether a "
        "stream capture (XLA's command buffer) recorded its nodes, which then replay without this handler, and "
        "the streams its calls launched on. Call after detach_graph, which stops further calls.");
  m.def("describe_bindings", &DescribeBindings, nb::arg("id"), nb::arg("device"),
        "(kind, index, mode, sites, reason) for each static buffer; mode is a code of codes()['binding'].");
  m.def("describe_graph", [](int64_t id, int device) {
    std::shared_ptr<DeviceGraph> g = LiveGraph(id, device);
    std::lock_guard<std::mutex> lock(g->mutex);
    nb::dict d;
    d["paths"] = PathsOf(*g);
    d["conditionals"] = g->conditionals;
    d["kernel_nodes"] = g->nodes.size();
    d["splice_whole_reason"] = g->unflattenable;
    d["borrowed_exec"] = g->borrowed_exec;
    d["exec_update_whole"] = g->exec_update_whole;
    d["executables"] = g->slots.size();
    d["max_executables"] = g->max_execs;
    d["exec_device_bytes"] = g->memory.exec_device;
    d["exec_host_bytes"] = g->memory.exec_host;
    d["clone_host_bytes"] = g->memory.clone_host;
    d["binding_host_bytes"] = g->memory.binding_host;
    d["rewrite_ns_per_site"] = g->site_ns;
    d["instantiate_ns"] = g->fresh_ns;
    d["device_launchable"] = g->device_launchable;
    d["launch_note"] = g->launch_note;
    d["copy_nodes"] = NodeCopied(*g);
    return d;
  }, nb::arg("id"), nb::arg("device"),
     "How calls of a graph run: 'paths' (codes of codes()['path']), 'conditionals' (nodes, any depth), "
     "'kernel_nodes' (read for binding), 'splice_whole_reason', 'borrowed_exec', 'exec_update_whole', "
     "'device_launchable' (its executables), 'launch_note' (why not, if CUDA refused), 'copy_nodes' (copied buffers copied by copy nodes of the "
     "executable); what it holds: "
     "'executables' kept now, 'max_executables', 'exec_device_bytes' (one executable's, measured at "
     "registration; -1 unknown), 'exec_host_bytes', 'clone_host_bytes', 'binding_host_bytes' (from the "
     "process's resident memory: approximate; -1 unknown); 'rewrite_ns_per_site', 'instantiate_ns' (host ns, "
     "measured; -1 not yet).");
  m.def("live_graphs", &LiveGraphs, "Number of live (graph, device) entries.");
  DefineKnobs(m);
  m.def("codes", []() {
    nb::dict binding, path, capture, out;
    binding["bound"] = static_cast<int>(BindMode::kBound);
    binding["copied"] = static_cast<int>(BindMode::kCopied);
    binding["unused"] = static_cast<int>(BindMode::kUnused);
    binding["copied_by_cost"] = static_cast<int>(BindMode::kCopiedByCost);
    for (int p = 0; p < kPaths; ++p) path[kPathNames[p]] = p;
    capture["auto"] = static_cast<int>(CapturePolicy::kAuto);
    capture["bind"] = static_cast<int>(CapturePolicy::kBind);
    capture["copy"] = static_cast<int>(CapturePolicy::kCopy);
    capture["whole"] = static_cast<int>(CapturePolicy::kWhole);
    out["binding"] = binding;
    out["path"] = path;
    out["capture"] = capture;
    return out;
  }, "The codes describe_bindings and describe_graph use, by name.");
  m.def("counters", []() {
    nb::dict c;
    for (int p = 0; p < kPaths; ++p) c[kPathNames[p]] = counters.paths[p].load();
    const std::pair<const char*, const std::atomic<int64_t>*> others[] = {
        {"instantiate", &counters.instantiate}, {"rebind", &counters.rebind}, {"copy", &counters.copy},
        {"to_copy", &counters.to_copy}, {"evict", &counters.evict}, {"refresh", &counters.refresh},
        {"handler_calls", &counters.handler_calls}, {"handler_ns", &counters.handler_ns},
        {"launch_ns", &counters.launch_ns}, {"copy_ns", &counters.copy_ns}, {"prepare_ns", &counters.prepare_ns},
        {"node_copy", &counters.node_copy}, {"ring_wait", &counters.ring_wait}};
    for (const auto& [name, value] : others) c[name] = value->load();
    return c;
  }, "How the handlers ran graphs: calls per replay path (launch, splice_nodes, splice_whole, "
     "uncaptured_launch), executables made, kernel-node rebinds in executables, buffer copies on the stream "
     "(copy) and by copy nodes of the executable (node_copy; ring_wait: launches that waited for the ring), "
     "bound buffers switched to copying by cost, executables replaced for want of room (evict), "
     "executables rewritten in place made afresh when hit again (refresh); handler calls and their "
     "total host time in ns, the part of it inside cudaGraphLaunch (launch_ns), cudaMemcpyAsync (copy_ns) and "
     "choosing, making or rewriting the executable (prepare_ns).");
}
