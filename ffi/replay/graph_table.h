// The replay handler's graph table: the small ids HLO carries, each naming
// one captured graph per device (DeviceGraph), and building an entry at
// registration. Included by replay.cc only.
//
// A graph without conditional nodes is cloned, so the Python CUDAGraph can
// be reset independently; one with conditional nodes, which CUDA cannot
// clone, is used as it is (conditional_graph.h). Either way a reset retires
// the entry, and a compiled function that still names it gets a clear error.
// One id holds one graph per device (jaxgraph.capture_per_device,
// Replayable.add_device): under shard_map or pmap XLA runs the same call on
// every device, each on its own thread and stream, and the handler picks the
// graph of the device ordinal XLA passes the call. Nothing is shared between
// devices but the id; each device's graph has its own lock.

#ifndef JAXGRAPH_FFI_GRAPH_TABLE_H_
#define JAXGRAPH_FFI_GRAPH_TABLE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bind_policy.h"
#include "common.h"
#include "conditional_graph.h"
#include "copy_nodes.h"
#include "device_graph.h"
#include "graph_binding.h"
#include "graph_splice.h"

namespace jaxgraph {

// Every device's graph for one id, keyed by CUDA ordinal: a device whose
// graph was reset keeps a tombstone (retired), one never captured has no
// entry (missing), so the handler can say which.
using GraphSet = HandleTable<DeviceGraph>;

// The devices with a live graph in `set`, as "0, 1", for messages.
inline std::string LiveDevices(const GraphSet& set) {
  std::string out;
  for (const auto& [device, graph] : set.LiveEntries()) {
    out += (out.empty() ? "" : ", ") + std::to_string(device);
  }
  return out.empty() ? "none" : out;
}

inline HandleTable<GraphSet> graph_table;
inline std::atomic<int64_t> next_graph_id{1};

using BufferSpec = std::vector<std::pair<uint64_t, uint64_t>>;  // (address, bytes)
using AliasList = std::vector<std::pair<int, int>>;            // (input, output)

// What a registration asks for besides the graph and its buffers.
struct RegisterOptions {
  ScanOptions scan;
  bool bind = true;                // false: copy every buffer (bind="copy")
  bool drop_unreferenced = false;  // leave out inputs nothing in the graph refers to
  uint64_t borrowed_exec = 0;      // the CUDAGraph's executable, for a conditional graph
  RingKernels ring;                // the copy nodes' kernels (none: copies on the stream)
};

// The caller's (input, output) alias pairs must name buffers that exist:
// checked before anything indexes by them (DropUnreferenced renumbers inputs
// through a table of num_inputs entries).
inline void CheckAliases(const AliasList& aliases, size_t num_inputs, size_t num_outputs) {
  for (const auto& [input, output] : aliases) {
    if (input < 0 || static_cast<size_t>(input) >= num_inputs) {
      throw std::invalid_argument("alias names input " + std::to_string(input) + ", which does not exist (the "
                                  "graph has " + std::to_string(num_inputs) + " inputs)");
    }
    if (output < 0 || static_cast<size_t>(output) >= num_outputs) {
      throw std::invalid_argument("alias names output " + std::to_string(output) + ", which does not exist (the "
                                  "graph has " + std::to_string(num_outputs) + " outputs)");
    }
  }
}

// Pairs each input with the output of the same static buffer (XLA aliases
// them, so one XLA buffer serves both), and copies inputs the user aliased to
// another output: the graph's writes to that output must not race its reads.
inline void PairAliases(DeviceGraph* g, const AliasList& user_aliases) {
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
    in.reason = out.Moves() ? out.reason : "shares its buffer with output " + std::to_string(g->alias[i]);
  }
}

// Leaves out the inputs no node refers to (unused, not an output's buffer,
// not aliased by the caller); renumbers `aliases`. Returns which inputs stay.
inline std::vector<bool> DropUnreferenced(DeviceGraph* g, AliasList* aliases) {
  std::vector<bool> kept(g->num_inputs, true);
  std::vector<int> renumber(g->num_inputs, -1);
  std::vector<Binding> buffers;
  for (size_t i = 0; i < g->num_inputs; ++i) {
    const Binding& b = g->buffers[i];
    bool shared = false;
    for (size_t j = g->num_inputs; j < g->buffers.size(); ++j) shared |= g->buffers[j].base == b.base;
    for (const auto& pair : *aliases) shared |= pair.first == static_cast<int>(i);
    kept[i] = shared || b.mode != BindMode::kUnused;
    if (kept[i]) {
      renumber[i] = static_cast<int>(buffers.size());
      buffers.push_back(b);
    }
  }
  for (size_t j = g->num_inputs; j < g->buffers.size(); ++j) buffers.push_back(g->buffers[j]);
  g->num_inputs -= std::count(kept.begin(), kept.end(), false);
  g->buffers = std::move(buffers);
  for (auto& pair : *aliases) pair.first = renumber[pair.first];
  return kept;
}

inline std::unique_ptr<DeviceGraph> BuildDeviceGraph(int device, uint64_t graph, const BufferSpec& inputs,
                                                     const BufferSpec& outputs, AliasList aliases,
                                                     const RegisterOptions& options, std::vector<bool>* kept) {
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
  Survey survey = SurveyGraph(reinterpret_cast<CUgraph>(graph));
  if (survey.memory) {
    // CUDA can neither clone such a graph (cudaErrorNotSupported) nor make a
    // second executable of it, and replay inside jit needs one of the two.
    throw std::runtime_error(
        "the graph allocates or frees memory in its own nodes (stream-ordered cudaMallocAsync / "
        "cuMemAllocAsync during the capture, e.g. by another library's allocator), which CUDA "
        "cannot clone, so it cannot be replayed inside jit; allocate before the capture (or with "
        "jaxgraph, whose pool needs no memory nodes), or replay from the host with "
        "via=\"callback\"");
  }
  g->conditionals = survey.conditionals;
  if (survey.conditionals > 0) {
    g->graph = reinterpret_cast<CUgraph>(graph);  // CUDA cannot clone it: the template itself
    g->owns_graph = false;
  } else {
    cudaGraph_t clone = nullptr;
    int64_t before = ResidentBytes();
    cudaError_t err = cudaGraphClone(&clone, reinterpret_cast<cudaGraph_t>(graph));
    if (err != cudaSuccess) throw std::runtime_error(RuntimeError("cudaGraphClone", err));
    g->graph = reinterpret_cast<CUgraph>(clone);
    g->memory.clone_host = Grown(before, ResidentBytes());
  }
  if (options.bind) {
    int64_t before = ResidentBytes();
    GraphScan scan(&g->buffers, options.scan, g->num_inputs);
    scan.Scan(g->graph, &g->nodes);
    g->conditionals = std::max(g->conditionals, scan.conditionals());  // nested ones too
    g->memory.binding_host = Grown(before, ResidentBytes());
  } else {
    for (auto& b : g->buffers) b.Copy("bind='copy' was asked for");
  }
  kept->assign(g->num_inputs, true);
  if (options.drop_unreferenced) *kept = DropUnreferenced(g.get(), &aliases);
  for (auto& b : g->buffers) {
    // No argument points at it: copied, in case the graph reaches it some way
    // jaxgraph cannot see (a pointer stored in device memory).
    if (b.mode == BindMode::kUnused) b.reason = "no kernel argument points at it (the graph may reach it "
                                                "through device memory): copied";
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
  g->misses.assign(g->buffers.size(), 0);
  g->copy_nodes.assign(g->buffers.size(), nullptr);
  for (const Binding& b : g->buffers) g->static_addr.push_back(b.base);
  g->template_addr = g->static_addr;
  g->nodes_addr = g->static_addr;
  if (g->conditionals > 0) {
    g->unflattenable = "the graph has conditional nodes, which CUDA cannot place in another graph";
    PrepareConditional(g.get(), options.borrowed_exec);
    return g;
  }
  g->slots.reserve(kMaxExecs);
  if (!OrderNodes(g->graph, g->nodes, &g->order, &g->unflattenable) && g->unflattenable.empty()) {
    g->unflattenable = "the graph's nodes could not be ordered";
  }
  int64_t launchable_from = device_launch_nodes.load();
  size_t kernels = g->nodes.size();  // read for binding; with bind='copy' nothing was read: the graph's nodes
  if (!options.bind && cudaGraphGetNodes(reinterpret_cast<cudaGraph_t>(g->graph), nullptr, &kernels) != cudaSuccess) {
    cudaGetLastError();
    kernels = 0;
  }
  g->device_launchable = launchable_from >= 0 && kernels >= static_cast<size_t>(launchable_from);
  // Such a graph copies its buffers by nodes of its executable, fed by a ring
  // of addresses (copy_nodes.h): every buffer's node now, before it is made.
  if (g->device_launchable && options.ring.copy != 0 && options.ring.advance != 0) {
    if (std::string why = AddCopyNodes(g.get(), options.ring); !why.empty()) {
      g->launch_note = "its copied buffers are copied on the stream, not by nodes of its executable: " + why;
    }
  }
  // A graph kept as one executable whatever it weighs chooses first, so that
  // the copy nodes it may add are in its first executable too.
  g->max_execs = ExecBudget(-1, g->nodes.size());
  if (g->max_execs <= 1) ChooseAtRegistration(g.get());
  AddFirstSlot(g.get());  // the first executable now, so the first call only launches
  ChooseAtRegistration(g.get());  // with the executable weighed
  return g;
}

// Registers a graph for `device`, whose primary context the caller made
// current. Returns the id to pass as the `graph` attribute (a new one when
// id <= 0) and which inputs stay operands. Raises on CUDA errors.
inline std::pair<int64_t, std::vector<bool>> RegisterGraph(int64_t id, int device, uint64_t graph,
                                                           const BufferSpec& inputs, const BufferSpec& outputs,
                                                           const AliasList& aliases,
                                                           const RegisterOptions& options) {
  CheckAliases(aliases, inputs.size(), outputs.size());  // first: BuildDeviceGraph indexes by them
  if (device < 0) throw std::invalid_argument("device must be a CUDA ordinal >= 0");
  if (graph == 0) throw std::invalid_argument("graph must be a live cudaGraph_t");
  // Makes the runtime agree with the driver even on a thread where it has not been used yet.
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) throw std::runtime_error(RuntimeError("cudaSetDevice", err));
  std::vector<bool> kept;
  std::shared_ptr<DeviceGraph> entry = BuildDeviceGraph(device, graph, inputs, outputs, aliases, options, &kept);
  HandleStatus status;
  std::shared_ptr<GraphSet> set = id > 0 ? graph_table.Find(id, &status) : nullptr;
  if (set == nullptr) {
    if (id <= 0) id = next_graph_id++;
    set = std::make_shared<GraphSet>();
    graph_table.Insert(id, set);
  }
  if (!set->InsertNew(device, std::move(entry))) {
    throw std::invalid_argument("graph " + std::to_string(id) + " is already registered for device " +
                                std::to_string(device));
  }
  return {id, kept};
}

// The live graphs of `id` on `device` (every device when device < 0).
inline std::vector<std::shared_ptr<DeviceGraph>> GraphsOf(int64_t id, int device) {
  HandleStatus status;
  std::shared_ptr<GraphSet> set = graph_table.Find(id, &status);
  std::vector<std::shared_ptr<DeviceGraph>> out;
  if (set == nullptr) return out;
  for (auto& [d, graph] : set->LiveEntries()) {
    if (device < 0 || d == device) out.push_back(std::move(graph));
  }
  return out;
}

// Stops `id` on `device` (every device when < 0) from using what its
// CUDAGraph owns (the template of a conditional graph, a borrowed
// executable), at once: the owner is about to destroy them. Destroys
// nothing, so it is safe during a capture; waits for a call in progress.
inline void DetachGraph(int64_t id, int device) {
  for (const auto& g : GraphsOf(id, device)) {
    std::lock_guard<std::mutex> lock(g->mutex);
    g->detached = true;
    if (g->borrowed_exec) g->slots.clear(), g->slot_of.clear();
    if (!g->owns_graph) g->graph = nullptr;
  }
}

// Retires `id` on `device` (every device when device < 0); the clone and
// executables are freed once no call is using them.
inline void UnregisterGraph(int64_t id, int device) {
  DetachGraph(id, device);
  HandleStatus status;
  std::shared_ptr<GraphSet> set = graph_table.Find(id, &status);
  if (set != nullptr) set->RetireLive([device](int64_t d) { return device < 0 || d == device; });
}

inline size_t LiveGraphs() {
  size_t n = 0;
  // Counting needs every set; ids are dense, so walk them.
  for (int64_t id = 1; id < next_graph_id; ++id) n += GraphsOf(id, -1).size();
  return n;
}

inline std::shared_ptr<DeviceGraph> LiveGraph(int64_t id, int device) {
  auto graphs = GraphsOf(id, device);
  if (graphs.empty()) {
    throw std::invalid_argument("graph " + std::to_string(id) + " is not live on device " + std::to_string(device));
  }
  return graphs.front();
}

// Lets `id` on `device` keep at most `count` executables (clamped to 1 and
// kMaxExecs; the least recently used beyond it are destroyed now: a launch in
// flight completes first). Returns the previous limit. For tests.
inline size_t LimitExecs(int64_t id, int device, size_t count) {
  std::shared_ptr<DeviceGraph> g = LiveGraph(id, device);
  std::lock_guard<std::mutex> lock(g->mutex);
  size_t previous = g->max_execs;
  if (g->conditionals > 0) return previous;  // one executable, always
  g->max_execs = std::clamp<size_t>(count, 1, kMaxExecs);
  RelaxedCaptureMode relaxed;
  while (g->slots.size() > g->max_execs) {
    auto lru = std::min_element(g->slots.begin(), g->slots.end(),
                                [](const ExecSlot& a, const ExecSlot& b) { return a.last_use < b.last_use; });
    cudaGraphExecDestroy(lru->exec);
    g->slots.erase(lru);
  }
  IndexSlots(g.get());
  return previous;
}

// (kind, index, mode code, sites, reason) for each static buffer of `id` on `device`.
inline std::vector<std::tuple<std::string, int, int, int, std::string>> DescribeBindings(int64_t id, int device) {
  std::shared_ptr<DeviceGraph> g = LiveGraph(id, device);
  std::lock_guard<std::mutex> lock(g->mutex);
  std::vector<std::tuple<std::string, int, int, int, std::string>> out;
  for (size_t i = 0; i < g->buffers.size(); ++i) {
    const Binding& b = g->buffers[i];
    bool input = i < g->num_inputs;
    int index = static_cast<int>(input ? i : i - g->num_inputs);
    size_t sites = input && g->alias[i] >= 0 ? g->buffers[g->num_inputs + g->alias[i]].sites.size()
                                              : b.sites.size();
    out.emplace_back(input ? "input" : "output", index, static_cast<int>(b.mode), static_cast<int>(sites),
                     b.reason);
  }
  return out;
}

// The paths calls of `g` can take (ReplayPath codes).
inline std::vector<int> PathsOf(const DeviceGraph& g) {
  if (g.conditionals > 0) return {static_cast<int>(ReplayPath::kUncapturedLaunch)};
  ReplayPath splice = g.unflattenable.empty() ? ReplayPath::kSpliceNodes : ReplayPath::kSpliceWhole;
  return {static_cast<int>(ReplayPath::kLaunch), static_cast<int>(splice)};
}

}  // namespace jaxgraph

#endif  // JAXGRAPH_FFI_GRAPH_TABLE_H_
