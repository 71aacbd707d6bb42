// Graphed loops: one CUDA graph that runs a captured step R times on the device.
// Python side: jaxgraph/_jax_interop/graphed_loops.py (the API) and
// jaxgraph/_graphs/loop_build.py (which compiles the control kernels with NVRTC
// and passes their CUfunctions here).
//
// The loop graph is built node by node (no stream capture):
//
//   init ──► WHILE(h) { step_1 … step_K ; tail } ──► remainder ──► finalize
//
// - `init` (one thread) reads R (fixed, or from a device int32), clears the
//   stop flag, sets the counters and arms h for the first trip (R >= K).
// - The WHILE body holds K copies of the step as child-graph nodes, so what a
//   trip costs (4.2-4.8 us at N=1 on the H100: the WHILE trip table of
//   benchmarks/results/nvidia-h100-80gb-hbm3-loops.md) is paid once per K
//   steps. `tail` (one thread) counts the trip's K steps and re-arms h while
//   a full trip remains and the stop flag (`until`) is clear.
// - With a flag, K is `check_every`: the flag is read once per trip, so a
//   launch runs up to K-1 steps past the step that set it. K = 1 is the exact
//   stop: a trip per step, its tail the only check (no IF guard per step).
//   With a fed pair the tail kernel may copy Y -> X itself (`fused`: the
//   trip is `A ; tail`); else, with a swapped twin (below), the exact body
//   is `A ; tail ; IF(g) { B ; tail }`: the first tail counts A and opens g
//   for B only while steps remain and the flag is clear, so the twin never
//   runs past the flag. With `pdl`, a one-kernel step is added as that
//   kernel's node (not a child graph) and the tail follows it through a
//   programmatic edge from its launch-order port: the tail launches while
//   the step runs and waits for it in griddepcontrol.wait.
// - The R mod K steps left over run after the loop: unrolled when R is fixed
//   and there is no flag, else behind an IF node per bit of the remainder
//   (bit b guards 2^b copies), set by one `bits` kernel that, with a flag,
//   opens none once the flag is set and counts the steps it opens.
// - Ping-pong: the copies alternate between the step (A, reads X writes Y)
//   and a clone with X and Y swapped in its kernels' arguments (B), so K is
//   even and every block but the last single copy keeps the parity. Where
//   swapping is unsafe, a memcpy Y -> X follows every copy instead.
// - `finalize` copies the newer of X and Y over the older, by the count of
//   steps run, so both hold the result.
// - The default exact stop is speculative instead (FillSpeculative): fast
//   trips of K unguarded steps, each followed by a watch kernel that saves
//   what a step may write on the step that sets the flag, restored after
//   the loop, so the steps run past the flag leave nothing behind.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <set>
#include <tuple>
#include <vector>

#include "common.h"
#include "driver_api.h"
#include "graph_binding.h"
#include "nanobind/stl/map.h"
#include "nanobind/stl/pair.h"
#include "nanobind/stl/string.h"
#include "nanobind/stl/tuple.h"
#include "nanobind/stl/vector.h"

namespace jaxgraph {
namespace {

// ---------------------------------------------------------------------------
// The swapped variant of a step
// ---------------------------------------------------------------------------

// A clone of `graph` whose kernels use Y where they used X and X where they
// used Y, for each (X, Y, bytes) of `pairs`. Returns (clone, "") or, where a
// kernel argument cannot be rewritten safely (a pointer inside a struct, a
// memcpy node, a child graph, unknown kernels' end pointers), (0, why).
std::pair<uintptr_t, std::string> SwapVariant(uintptr_t graph,
                                              const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& pairs,
                                              const std::map<uint64_t, std::string>& kernels) {
  const DriverApi& d = DriverApi::Get();
  if (!d.graph_clone || !d.graph_destroy) throw std::runtime_error("the CUDA driver lacks cuGraphClone");
  std::vector<Binding> buffers;
  for (const auto& [x, y, bytes] : pairs) {
    Binding bx, by;
    bx.base = x, bx.bytes = bytes, by.base = y, by.bytes = bytes;
    buffers.push_back(bx);
    buffers.push_back(by);
  }
  CUgraph clone = nullptr;
  CheckDriver(d.graph_clone(&clone, reinterpret_cast<CUgraph>(graph)), "cuGraphClone");
  try {
    KernelFlags flags(kernels.begin(), kernels.end());
    ScanOptions options;
    options.kernels = &flags;
    std::vector<KernelNode> nodes;
    // num_inputs 0: kernels writing X or Y is what a step does, not a reason to copy.
    GraphScan(&buffers, options, 0).Scan(clone, &nodes);
    for (const Binding& b : buffers) {
      if (b.mode == BindMode::kCopied) {
        d.graph_destroy(clone);
        return {0, b.reason};
      }
    }
    for (size_t i = 0; i < buffers.size(); i += 2) {
      Retarget(buffers[i], buffers[i + 1].base, &nodes);
      Retarget(buffers[i + 1], buffers[i].base, &nodes);
    }
    for (KernelNode& k : nodes) {
      CheckDriver(d.set_kernel_params(k.node, &k.params), "cuGraphKernelNodeSetParams");
    }
  } catch (...) {
    d.graph_destroy(clone);
    throw;
  }
  return {reinterpret_cast<uintptr_t>(clone), ""};
}

void DestroyGraph(uintptr_t graph) {
  if (graph == 0) return;
  CheckDriver(DriverApi::Get().graph_destroy(reinterpret_cast<CUgraph>(graph)), "cuGraphDestroy");
}

// ---------------------------------------------------------------------------
// Building the loop graph
// ---------------------------------------------------------------------------

// One kernel argument: its bytes.
using Arg = std::vector<uint8_t>;

template <typename T>
Arg A(T value) {
  Arg a(sizeof(T));
  std::memcpy(a.data(), &value, sizeof(T));
  return a;
}

struct Plan {
  uint64_t step_a = 0, step_b = 0;  // templates; step_b 0: every copy is step_a
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> copies;  // (dst, src, bytes) after each step
  int unroll = 1;
  int64_t fixed = -1;               // R, or -1: read from `count`
  uint64_t count = 0, until = 0, remaining = 0, done = 0;
  int until_bytes = 0;
  uint64_t fused_dst = 0, fused_src = 0, fused_bytes = 0;  // a pair the tail kernel copies (exact stop)
  bool pdl = false;                 // the exact stop: a one-kernel step inlined, its check launched early
  uint64_t init = 0, tail = 0, bits = 0, finalize = 0;  // CUfunctions
  // The speculative exact stop (until=, check_every left out): see FillSpeculative.
  bool speculative = false;
  uint64_t spec_init = 0, watch_kernel = 0, spec_tail = 0, restore = 0;  // CUfunctions
  uint64_t watch = 0;               // int32 [seen0, seen1, stopped] (jaxgraph_loop_watch)
  uint64_t table = 0;               // device (live, copy, bytes) triples of what a step may write
  int entries = 0;
  uint64_t snapshot_bytes = 0;      // their sum (sizes the watch and restore kernels' grid)
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> finals;    // (x, y, bytes)
  int final_mode = 0;               // 0: x/y ping-pong, 1: copies after each step
};

class Builder {
 public:
  explicit Builder(const Plan& p) : p_(p), d_(DriverApi::Get()) {
    if (!d_.Complete(kConditionals)) {
      throw std::runtime_error(
          "graphed loops need CUDA conditional nodes (cuGraphConditionalHandleCreate, CUDA 12.3+); "
          "this CUDA driver lacks them: update the NVIDIA driver");
    }
    if (std::string missing = d_.Missing(kLoops); !missing.empty()) {
      throw std::runtime_error("graphed loops need driver calls this CUDA driver lacks (" + missing +
                               "): update the NVIDIA driver");
    }
    CheckDriver(d_.current_ctx(&ctx_), "cuCtxGetCurrent");
  }

  // Every conditional node made, at any depth: (node, "IF" or "WHILE", its bodies). CUDA before
  // 13.2 cannot describe a conditional node, so introspection and replay in jit learn them here.
  std::vector<std::tuple<uint64_t, std::string, std::vector<uint64_t>>> conditionals;

  CUgraph Build() {
    CUgraph top = nullptr;
    CheckDriver(d_.graph_create(&top, 0), "cuGraphCreate");
    try {
      Fill(top);
    } catch (...) {
      d_.graph_destroy(top);
      throw;
    }
    return top;
  }

 private:
  bool guarded() const { return p_.until != 0; }
  bool dynamic() const { return p_.fixed < 0; }

  void Fill(CUgraph top) {
    if (p_.speculative) return FillSpeculative(top);
    const int k = p_.unroll;
    const bool has_while = guarded() || dynamic() || p_.fixed >= k;
    CUgraphConditionalHandle h = has_while ? Handle(top) : 0;
    int mode = (guarded() ? 1 : 0) | (has_while ? 2 : 0);
    CUgraphNode prev = Kernel(top, nullptr, p_.init, 1,
                              {A(p_.remaining), A(p_.done), A(p_.count), A(static_cast<int>(dynamic() ? 0 : p_.fixed)),
                               A(p_.until), A(p_.until_bytes), A(k), A(h), A(mode)});
    if (has_while) {
      CUgraph body = nullptr;
      prev = Conditional(top, prev, h, CU_GRAPH_COND_TYPE_WHILE, &body);
      if (guarded() && k == 1 && p_.step_b != 0) {
        ExactPair(body, h);
      } else {
        Tail(body, Steps(body, nullptr, k, 0), k, h, 0, p_.fused_bytes != 0);
      }
    }
    if (!(guarded() && k == 1)) prev = Remainder(top, prev, has_while);
    for (const auto& [x, y, bytes] : p_.finals) {
      prev = Kernel(top, prev, p_.finalize, Blocks(bytes), {A(x), A(y), A(bytes), A(p_.done), A(p_.final_mode)},
                    256);
    }
  }

  // The speculative exact stop:
  //
  //   init ─► WHILE(h) { step_1 ; watch_1 … step_K ; watch_K ; tail } ─► restore ─► WHILE(s) { step ; copies ; tail } ─► finalize
  //
  // A fast trip runs K steps unguarded, each followed by a watch kernel that, on the step that first
  // finds the flag set, saves what a step may write (the snapshot table) and the steps run so far; the
  // trip's tail ends the loop once a watch saw the flag. `restore` then copies the saved state back
  // over what the steps run past the flag wrote, so the loop ends as if none had run. The slow WHILE
  // runs the R mod K steps that fill no fast trip, a step a trip with the flag tested after each (the
  // old exact stop; a copy Y -> X after each step keeps both halves of a fed pair equal).
  void FillSpeculative(CUgraph top) {
    const int k = p_.unroll;
    CUgraphConditionalHandle h = Handle(top), s = Handle(top);
    CUgraphNode prev = Kernel(top, nullptr, p_.spec_init, 1,
                              {A(p_.remaining), A(p_.done), A(p_.watch), A(p_.count),
                               A(static_cast<int>(dynamic() ? 0 : p_.fixed)), A(p_.until), A(p_.until_bytes), A(k),
                               A(h), A(s)});
    CUgraph fast = nullptr;
    prev = Conditional(top, prev, h, CU_GRAPH_COND_TYPE_WHILE, &fast);
    CUgraphNode node = nullptr;
    for (int i = 0; i < k; ++i) {
      node = Steps(fast, node, 1, i);
      // Every block of a watch runs each step only to find the flag clear, so its grid stays small
      // (grid-stride: a large snapshot takes longer once, at the stop).
      node = Kernel(fast, node, p_.watch_kernel, std::min(Blocks(p_.snapshot_bytes), kWatchBlocks),
                    {A(p_.table), A(p_.entries), A(p_.until), A(p_.until_bytes), A(p_.watch), A(i & 1), A(p_.done),
                     A(i)}, 256);
    }
    Kernel(fast, node, p_.spec_tail, 1,
           {A(p_.remaining), A(p_.done), A(p_.watch), A(k & 1), A(k), A(h), A(s)});
    prev = Kernel(top, prev, p_.restore, Blocks(p_.snapshot_bytes), {A(p_.table), A(p_.entries), A(p_.watch)}, 256);
    CUgraph slow = nullptr;
    prev = Conditional(top, prev, s, CU_GRAPH_COND_TYPE_WHILE, &slow);
    CUgraphNode step = nullptr;
    CheckDriver(d_.add_child(&step, slow, nullptr, 0, reinterpret_cast<CUgraph>(p_.step_a)),
                "cuGraphAddChildGraphNode (a step must hold no conditional or memory nodes)");
    for (const auto& [x, y, bytes] : p_.finals) step = Memcpy(slow, step, x, y, bytes);
    Tail(slow, step, 1, s, 0, false);
    for (const auto& [x, y, bytes] : p_.finals) {
      prev = Kernel(top, prev, p_.finalize, Blocks(bytes), {A(x), A(y), A(bytes), A(p_.done), A(p_.final_mode)},
                    256);
    }
  }

  // The exact stop with a swapped twin: A ; tail ; IF(g) { B ; tail }. The first tail counts A and
  // opens g only while a step remains and the flag is clear; B's tail re-arms h. (B's tail after the
  // IF instead, in the trip itself, measured 0.75-0.87 us per step slower on an H100: benchmarks/probes/stop_probe.py.)
  void ExactPair(CUgraph body, CUgraphConditionalHandle h) {
    CUgraphConditionalHandle g = Handle(body);
    CUgraphNode head = Tail(body, Steps(body, nullptr, 1, 0), 1, h, g, false);
    CUgraph inner = nullptr;
    Conditional(body, head, g, CU_GRAPH_COND_TYPE_IF, &inner);
    Tail(inner, Steps(inner, nullptr, 1, 1), 0, h, 0, false);
  }

  // The control kernel after `unroll` steps: counts them, re-arms h (and opens g), copies the fused pair.
  CUgraphNode Tail(CUgraph graph, CUgraphNode prev, int unroll, CUgraphConditionalHandle h,
                   CUgraphConditionalHandle g, bool fused) {
    const uint64_t bytes = fused ? p_.fused_bytes : 0;
    return Kernel(graph, prev, p_.tail, fused ? Blocks(bytes) : 1,
                  {A(p_.remaining), A(p_.done), A(p_.until), A(p_.until_bytes), A(unroll), A(h), A(g),
                   A(fused ? p_.fused_dst : uint64_t{0}), A(fused ? p_.fused_src : uint64_t{0}), A(bytes)},
                  fused ? 256 : 1);
  }

  static constexpr unsigned kWatchBlocks = 64;

  static unsigned Blocks(uint64_t bytes) {  // a word per thread, 256 threads a block
    return static_cast<unsigned>(std::min<uint64_t>(1024, bytes / 1024 + 1));
  }

  // The steps left after the full trips: unrolled (fixed R, no flag), else behind an IF per bit.
  CUgraphNode Remainder(CUgraph top, CUgraphNode prev, bool has_while) {
    const int k = p_.unroll;
    if (!dynamic() && !guarded()) {
      int64_t r = has_while ? p_.fixed % k : p_.fixed;
      return r > 0 ? Steps(top, prev, static_cast<int>(r), 0) : prev;
    }
    // Bits of a remainder in [0, k-1]; with a fixed R only those of R mod k can be set.
    const int64_t possible = dynamic() ? k - 1 : p_.fixed % k;
    int nbits = 0;
    while ((int64_t{1} << nbits) <= possible) ++nbits;
    if (nbits == 0) return prev;
    std::vector<CUgraphConditionalHandle> hs(8, 0);
    for (int b = 0; b < nbits; ++b) {
      if ((possible >> b) & 1 || dynamic()) hs[b] = Handle(top);
    }
    std::vector<Arg> args{A(p_.remaining), A(p_.done), A(p_.until), A(p_.until_bytes)};
    for (int b = 0; b < 8; ++b) args.push_back(A(hs[b]));
    args.push_back(A(nbits));
    prev = Kernel(top, prev, p_.bits, 1, args);
    // Largest block first: the even blocks keep the ping-pong parity, the single copy goes last.
    for (int b = nbits - 1; b >= 0; --b) {
      if (hs[b] == 0) continue;
      CUgraph inner = nullptr;
      prev = Conditional(top, prev, hs[b], CU_GRAPH_COND_TYPE_IF, &inner);
      Steps(inner, nullptr, 1 << b, 0);
    }
    return prev;
  }

  // `n` copies of the step in `graph` after `prev`, the first of parity `first`.
  CUgraphNode Steps(CUgraph graph, CUgraphNode prev, int n, int first) {
    for (int i = 0; i < n; ++i) {
      uint64_t step = ((first + i) % 2 == 1 && p_.step_b != 0) ? p_.step_b : p_.step_a;
      CUgraphNode node = nullptr;
      CUDA_KERNEL_NODE_PARAMS kernel;
      if (p_.pdl && SingleKernel(step, &kernel)) {
        CheckDriver(d_.add_kernel(&node, graph, prev ? &prev : nullptr, prev ? 1 : 0, &kernel),
                    "cuGraphAddKernelNode (the step's kernel)");
        inlined_.insert(node);
      } else {
        CheckDriver(d_.add_child(&node, graph, prev ? &prev : nullptr, prev ? 1 : 0,
                                 reinterpret_cast<CUgraph>(step)),
                    "cuGraphAddChildGraphNode (a step must hold no conditional or memory nodes)");
      }
      prev = node;
      for (const auto& [dst, src, bytes] : p_.copies) prev = Memcpy(graph, prev, dst, src, bytes);
    }
    return prev;
  }

  // The parameters of `step`'s kernel when the step is that one kernel node.
  bool SingleKernel(uint64_t step, CUDA_KERNEL_NODE_PARAMS* out) {
    CUgraph g = reinterpret_cast<CUgraph>(step);
    size_t n = 0;
    if (!d_.get_nodes || !d_.node_type || !d_.kernel_params || d_.get_nodes(g, nullptr, &n) != CUDA_SUCCESS ||
        n != 1) {
      return false;
    }
    CUgraphNode node = nullptr;
    CUgraphNodeType type;
    if (d_.get_nodes(g, &node, &n) != CUDA_SUCCESS || d_.node_type(node, &type) != CUDA_SUCCESS ||
        type != CU_GRAPH_NODE_TYPE_KERNEL) {
      return false;
    }
    std::memset(out, 0, sizeof(*out));
    return d_.kernel_params(node, out) == CUDA_SUCCESS;
  }

  CUgraphConditionalHandle Handle(CUgraph graph) {
    CUgraphConditionalHandle h = 0;
    CheckDriver(d_.conditional_handle(&h, graph, ctx_, 0, CU_GRAPH_COND_ASSIGN_DEFAULT),
                "cuGraphConditionalHandleCreate");
    return h;
  }

  CUgraphNode Conditional(CUgraph graph, CUgraphNode prev, CUgraphConditionalHandle h,
                          CUgraphConditionalNodeType type, CUgraph* body) {
    CUgraphNodeParams params;
    std::memset(&params, 0, sizeof(params));
    params.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    params.conditional.handle = h;
    params.conditional.type = type;
    params.conditional.size = 1;
    params.conditional.ctx = ctx_;
    CUgraphNode node = nullptr;
    CheckDriver(d_.add_node(&node, graph, prev ? &prev : nullptr, nullptr, prev ? 1 : 0, &params),
                "cuGraphAddNode (conditional)");
    *body = params.conditional.phGraph_out[0];
    conditionals.emplace_back(reinterpret_cast<uint64_t>(node), type == CU_GRAPH_COND_TYPE_WHILE ? "WHILE" : "IF",
                              std::vector<uint64_t>{reinterpret_cast<uint64_t>(*body)});
    return node;
  }

  CUgraphNode Kernel(CUgraph graph, CUgraphNode prev, uint64_t function, unsigned blocks,
                     std::vector<Arg> args, unsigned threads = 1) {
    std::vector<void*> pointers;
    for (Arg& a : args) pointers.push_back(a.data());
    CUDA_KERNEL_NODE_PARAMS params = KernelNodeParams(function, blocks, threads, pointers.data());
    CUgraphNode node = nullptr;
    if (prev != nullptr && inlined_.count(prev)) {
      // After the step's own kernel: a programmatic edge from its launch-order port lets this
      // control kernel launch once the step's blocks have begun; it waits for the step to finish
      // (griddepcontrol.wait) before reading the flag, so the check costs less than a plain launch.
      CUgraphNodeParams any;
      std::memset(&any, 0, sizeof(any));
      any.type = CU_GRAPH_NODE_TYPE_KERNEL;
      any.kernel.func = params.func;
      any.kernel.gridDimX = blocks, any.kernel.gridDimY = 1, any.kernel.gridDimZ = 1;
      any.kernel.blockDimX = threads, any.kernel.blockDimY = 1, any.kernel.blockDimZ = 1;
      any.kernel.kernelParams = pointers.data();
      CUgraphEdgeData edge;
      std::memset(&edge, 0, sizeof(edge));
      edge.from_port = CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER;
      edge.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
      CheckDriver(d_.add_node(&node, graph, &prev, &edge, 1, &any), "cuGraphAddNode (a programmatic edge)");
      return node;
    }
    CheckDriver(d_.add_kernel(&node, graph, prev ? &prev : nullptr, prev ? 1 : 0, &params),
                "cuGraphAddKernelNode");
    return node;
  }

  CUgraphNode Memcpy(CUgraph graph, CUgraphNode prev, uint64_t dst, uint64_t src, uint64_t bytes) {
    CUDA_MEMCPY3D m;
    std::memset(&m, 0, sizeof(m));
    m.srcMemoryType = CU_MEMORYTYPE_DEVICE, m.srcDevice = src;
    m.dstMemoryType = CU_MEMORYTYPE_DEVICE, m.dstDevice = dst;
    m.WidthInBytes = bytes, m.Height = 1, m.Depth = 1;
    CUgraphNode node = nullptr;
    CheckDriver(d_.add_memcpy(&node, graph, &prev, 1, &m, ctx_), "cuGraphAddMemcpyNode");
    return node;
  }

  const Plan& p_;
  const DriverApi& d_;
  CUcontext ctx_ = nullptr;
  std::set<CUgraphNode> inlined_;  // steps added as their one kernel node (pdl)
};

using Conditionals = std::vector<std::tuple<uint64_t, std::string, std::vector<uint64_t>>>;

std::pair<uintptr_t, Conditionals> BuildLoop(uint64_t step_a, uint64_t step_b,
                    const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& copies, int unroll,
                    int64_t fixed, uint64_t count, uint64_t until, int until_bytes, uint64_t remaining,
                    uint64_t done, const std::vector<uint64_t>& functions,
                    const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& finals, int final_mode,
                    const std::tuple<uint64_t, uint64_t, uint64_t>& fused, bool pdl,
                    const std::tuple<uint64_t, uint64_t, int, uint64_t>& speculative) {
  if (unroll < 1 || unroll > 256) throw std::invalid_argument("unroll must be in [1, 256]");
  if (functions.size() != 8) throw std::invalid_argument("eight control kernels expected");
  Plan p;
  p.step_a = step_a, p.step_b = step_b, p.copies = copies, p.unroll = unroll, p.fixed = fixed;
  p.count = count, p.until = until, p.until_bytes = until_bytes, p.remaining = remaining, p.done = done;
  p.init = functions[0], p.tail = functions[1], p.bits = functions[2], p.finalize = functions[3];
  std::tie(p.fused_dst, p.fused_src, p.fused_bytes) = fused;
  p.spec_init = functions[4], p.watch_kernel = functions[5], p.spec_tail = functions[6], p.restore = functions[7];
  std::tie(p.watch, p.table, p.entries, p.snapshot_bytes) = speculative;
  p.speculative = p.watch != 0;
  if (p.speculative && (until == 0 || p.table == 0 || p.entries < 1)) {
    throw std::invalid_argument("the speculative exact stop needs a flag and a snapshot table");
  }
  p.pdl = pdl && until != 0 && (unroll == 1 || p.speculative);
  p.finals = finals, p.final_mode = final_mode;
  Builder builder(p);
  CUgraph graph = builder.Build();
  return {reinterpret_cast<uintptr_t>(graph), builder.conditionals};
}

}  // namespace
}  // namespace jaxgraph

NB_MODULE(_device_loop, m) {
  namespace nb = nanobind;
  using namespace jaxgraph;
  m.def("swap_variant", &SwapVariant, nb::arg("graph"), nb::arg("pairs"), nb::arg("kernels"),
        "Clone `graph` with each (x, y, bytes) pair's addresses swapped in its kernels' arguments: "
        "(clone, '') or (0, why it cannot be done safely).");
  m.def("destroy_graph", &DestroyGraph, nb::arg("graph"), "cuGraphDestroy.");
  m.def("build_loop", &BuildLoop, nb::arg("step_a"), nb::arg("step_b"), nb::arg("copies"),
        nb::arg("unroll"), nb::arg("fixed"), nb::arg("count"), nb::arg("until"), nb::arg("until_bytes"),
        nb::arg("remaining"), nb::arg("done"), nb::arg("functions"), nb::arg("finals"),
        nb::arg("final_mode"), nb::arg("fused"), nb::arg("pdl"), nb::arg("speculative"),
        "Build the loop graph (see device_loop.cc) in the current context; returns the CUgraph and "
        "its conditional nodes (node, 'IF' or 'WHILE', (body,)).");
}
