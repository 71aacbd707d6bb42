// Zero-copy binding: pointing a captured graph's kernel nodes at XLA's buffers.
//
// A graph captured on static device arrays bakes their addresses into its
// kernel nodes' arguments. To replay it on the operands and results XLA hands
// a custom call, without copying them in and out of the static arrays, the
// places that hold those addresses ("sites": a kernel node and one 8-byte
// argument) are found once, at registration, and rewritten whenever XLA's
// addresses change: in the template before a fresh executable is made from
// it, or in an executable in place (device_graph.h; bind_policy.h chooses;
// conditional_graph.h); in the node copies added to XLA's command buffer
// (graph_splice.h).
//
// A buffer is copied instead (the old way) where rebinding could be wrong:
// its address sits inside a struct argument or a kernel passes `extra`
// arguments, a memcpy/memset/child-graph node uses it, a kernel jaxgraph did
// not launch receives it (such a kernel may also reach it through memory
// jaxgraph cannot see: a pointer table, a field of a struct it reads; unless
// the caller trusts foreign kernels, ScanOptions::trust_foreign), or (for an
// input) a kernel may write it, since XLA's operand must stay as it was.
//
// Kernel nodes inside the bodies of conditional nodes (IF, WHILE, SWITCH, at
// any depth) are scanned like top-level ones: CUDA has no call that lists a
// conditional node's bodies on every driver (cuGraphNodeGetParams came after
// CUDA 13.0), so the bodies come from the driver where it has that call and
// otherwise from the capture that made them (ScanOptions::bodies).

#ifndef JAXGRAPH_FFI_GRAPH_BINDING_H_
#define JAXGRAPH_FFI_GRAPH_BINDING_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.h"
#include "driver_api.h"

namespace jaxgraph {

// One kernel node of our clone of the graph, with its own copy of the arguments.
struct KernelNode {
  CUgraphNode node = nullptr;
  CUDA_KERNEL_NODE_PARAMS params{};       // kernelParams points into `arguments`
  std::vector<std::vector<uint8_t>> values;  // each argument's bytes
  std::vector<void*> arguments;              // values[i].data()
  std::string name;                          // the kernel's name, for messages
  std::string flags;                         // per parameter: 'r' read-only pointer, 'w' other; "" unknown
  bool unreadable = false;                   // the driver would not describe its parameters
};

// An 8-byte argument that holds `buffer base + delta`.
struct Site {
  size_t node;
  size_t param;
  uint64_t delta;
};

// How a static buffer meets XLA's buffer; the codes cross to Python
// (jaxgraph._jax_interop.replay_boundary.BindingMode), the reason text beside them.
enum class BindMode : int {
  kBound = 0,   // kernel arguments pointed at XLA's buffer
  kCopied = 1,  // copied in (inputs) or out (outputs) around the replay
  kUnused = 2,  // no node jaxgraph can read refers to it: copied in case the graph reaches it otherwise
  kCopiedByCost = 3,  // could be bound, but copying costs less (bind_policy.h)
};

struct Binding {
  uint64_t base = 0;       // the static buffer's address
  uint64_t bytes = 0;
  BindMode mode = BindMode::kUnused;
  std::vector<Site> sites;
  std::string reason;      // why it is copied (or unused)

  void Copy(const std::string& why) {
    if (mode != BindMode::kCopied) reason = why;
    mode = BindMode::kCopied;
  }
  bool Moves() const { return mode != BindMode::kBound; }  // copied in or out around a replay
  bool Contains(uint64_t address) const { return address >= base && address < base + bytes; }
};

// What jaxgraph knows of the kernels it launched during the capture: by
// CUkernel or CUfunction handle, one flag per parameter.
using KernelFlags = std::map<uint64_t, std::string>;

// What the caller tells the scan.
struct ScanOptions {
  const KernelFlags* kernels = nullptr;
  bool trust_foreign = false;    // bind what kernels jaxgraph did not launch write (outputs)
  std::vector<uint64_t> bodies;  // CUgraph of each conditional body the capture made (any depth)
};

// ---------------------------------------------------------------------------
// Scanning the graph at registration
// ---------------------------------------------------------------------------

class GraphScan {
 public:
  GraphScan(std::vector<Binding>* buffers, const ScanOptions& options, size_t num_inputs)
      : d_(DriverApi::Get()), buffers_(buffers), options_(options), num_inputs_(num_inputs) {}

  // Finds the sites in `graph`'s kernel nodes, top-level and inside
  // conditional bodies (kept in `nodes`), and marks the buffers that must be
  // copied. Throws on driver errors.
  void Scan(CUgraph graph, std::vector<KernelNode>* nodes) {
    if (std::string missing = d_.Missing(kBinding); !missing.empty()) {
      for (auto& b : *buffers_) {
        b.Copy("the CUDA driver lacks the calls rebinding needs (CUDA >= 12.4): " + missing);
      }
      return;
    }
    ScanLevel(graph, nodes);
    if (conditionals_ == 0 || !bodies_from_capture_) return;
    if (options_.bodies.empty()) {
      for (auto& b : *buffers_) {
        b.Copy("the graph has conditional nodes whose bodies jaxgraph cannot read (this driver lacks "
               "cuGraphNodeGetParams, and the capture named no bodies)");
      }
      return;
    }
    // The capture listed every body, nested ones included: scan each once.
    for (uint64_t body : options_.bodies) ScanLevel(reinterpret_cast<CUgraph>(body), nodes);
  }

  // Conditional nodes seen (top-level and nested).
  size_t conditionals() const { return conditionals_; }

 private:
  void ScanLevel(CUgraph graph, std::vector<KernelNode>* nodes) {
    for (CUgraphNode node : Nodes(graph)) {
      CUgraphNodeType type;
      CheckDriver(d_.node_type(node, &type), "cuGraphNodeGetType");
      if (type == CU_GRAPH_NODE_TYPE_KERNEL) {
        nodes->push_back(ReadKernel(node));
        ClassifyKernel(nodes->size() - 1, &nodes->back());
      } else if (type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
        ++conditionals_;
        ScanConditional(node, nodes);
      } else {
        ClassifyOther(node, type);
      }
    }
  }

  // A conditional node's bodies, through the driver where it can say what
  // they are; otherwise they are scanned from the capture's list (Scan).
  void ScanConditional(CUgraphNode node, std::vector<KernelNode>* nodes) {
    if (!bodies_from_capture_ && d_.node_params) {
      CUgraphNodeParams p{};
      if (d_.node_params(node, &p) == CUDA_SUCCESS && p.type == CU_GRAPH_NODE_TYPE_CONDITIONAL &&
          p.conditional.phGraph_out != nullptr) {
        for (unsigned i = 0; i < p.conditional.size; ++i) ScanLevel(p.conditional.phGraph_out[i], nodes);
        return;
      }
    }
    bodies_from_capture_ = true;
  }

  std::vector<CUgraphNode> Nodes(CUgraph graph) {
    size_t count = 0;
    CheckDriver(d_.get_nodes(graph, nullptr, &count), "cuGraphGetNodes");
    std::vector<CUgraphNode> nodes(count);
    if (count > 0) CheckDriver(d_.get_nodes(graph, nodes.data(), &count), "cuGraphGetNodes");
    nodes.resize(count);
    return nodes;
  }

  KernelNode ReadKernel(CUgraphNode node) {
    KernelNode k;
    k.node = node;
    CheckDriver(d_.kernel_params(node, &k.params), "cuGraphKernelNodeGetParams");
    k.name = Name(k.params);
    k.flags = Flags(k.params);
    if (k.params.extra != nullptr) return k;  // arguments in `extra`: see ClassifyKernel
    for (size_t i = 0;; ++i) {
      size_t size = 0;
      CUresult r = ParamSize(k.params, i, &size);
      if (r == CUDA_ERROR_INVALID_VALUE) break;  // past the last parameter
      if (r != CUDA_SUCCESS || k.params.kernelParams == nullptr) {
        k.unreadable = true;
        break;
      }
      const auto* src = static_cast<const uint8_t*>(k.params.kernelParams[i]);
      k.values.emplace_back(src, src + size);
    }
    if (k.unreadable) return k;  // keeps the driver's own arguments; every buffer is copied
    for (auto& v : k.values) k.arguments.push_back(v.data());
    k.params.kernelParams = k.arguments.data();
    return k;
  }

  // The size of parameter `i`: asks for the CUfunction, for a CUkernel passed
  // where a CUfunction goes (how jaxgraph launches), then for `kern`.
  CUresult ParamSize(const CUDA_KERNEL_NODE_PARAMS& p, size_t i, size_t* size) const {
    size_t offset = 0;
    CUresult r = CUDA_ERROR_INVALID_HANDLE;
    if (p.func != nullptr) {
      r = d_.func_param_info(p.func, i, &offset, size);
      if (r == CUDA_SUCCESS || r == CUDA_ERROR_INVALID_VALUE) return r;
      r = d_.kernel_param_info(reinterpret_cast<CUkernel>(p.func), i, &offset, size);
      if (r == CUDA_SUCCESS || r == CUDA_ERROR_INVALID_VALUE) return r;
    }
    if (p.kern != nullptr) r = d_.kernel_param_info(p.kern, i, &offset, size);
    return r;
  }

  void ClassifyKernel(size_t index, KernelNode* k) {
    if (k->params.extra != nullptr) {
      for (auto& b : *buffers_) b.Copy("kernel " + k->name + " passes its arguments through `extra`");
      return;
    }
    if (k->unreadable) {
      for (auto& b : *buffers_) b.Copy("the driver would not describe kernel " + k->name + "'s parameters");
      return;
    }
    for (size_t p = 0; p < k->values.size(); ++p) {
      const std::vector<uint8_t>& v = k->values[p];
      if (v.size() == 8) {
        uint64_t word;
        std::memcpy(&word, v.data(), 8);
        ClassifyWord(word, index, p, *k);
      } else if (v.size() > 8) {
        for (size_t at = 0; at + 8 <= v.size(); at += 8) {
          uint64_t word;
          std::memcpy(&word, v.data() + at, 8);
          MarkTouched(word, "its address is inside a struct argument of kernel " + k->name);
        }
      }
    }
  }

  // An 8-byte argument: a site of the buffer it points into. jaxgraph's own
  // kernels take arrays by their start, so only "inside" counts for them; a
  // kernel jaxgraph did not launch may also hold an end pointer (one past a
  // buffer, often another buffer's start, as allocations are adjacent): that
  // buffer is copied, since rebinding it as the other buffer would be wrong.
  void ClassifyWord(uint64_t word, size_t node, size_t param, const KernelNode& k) {
    Binding* inside = nullptr;
    for (auto& b : *buffers_) {
      if (b.Contains(word)) inside = &b;
      else if (k.flags.empty() && b.bytes > 0 && word == b.base + b.bytes) {
        b.Copy("kernel " + k.name + ", which jaxgraph did not launch, may hold a pointer to its end");
      }
    }
    Binding* b = inside;
    if (b == nullptr) return;
    size_t index = static_cast<size_t>(b - buffers_->data());
    if (index < num_inputs_ && !(param < k.flags.size() && k.flags[param] == 'r')) {
      b->Copy(k.flags.empty()
                  ? "kernel " + k.name + ", which jaxgraph did not launch, may write it"
                  : "kernel " + k.name + " takes it through a non-const pointer (parameter " +
                        std::to_string(param) + ")");
    } else if (k.flags.empty() && !options_.trust_foreign) {
      // The README's promise: what a foreign kernel touches is copied, as it
      // may hold the address where jaxgraph cannot see (a pointer table).
      b->Copy("kernel " + k.name + ", which jaxgraph did not launch, receives its address (it may "
              "also reach it through memory jaxgraph cannot see); trust_foreign_kernels=True binds it");
    }
    if (b->mode == BindMode::kUnused) b->mode = BindMode::kBound;
    b->sites.push_back({node, param, word - b->base});
  }

  void ClassifyOther(CUgraphNode node, CUgraphNodeType type) {
    switch (type) {
      case CU_GRAPH_NODE_TYPE_MEMCPY: {
        CUDA_MEMCPY3D m{};
        CheckDriver(d_.memcpy_params(node, &m), "cuGraphMemcpyNodeGetParams");
        MarkRange(m.srcMemoryType, m.srcDevice, m.srcPitch, m.srcHeight, m.WidthInBytes, m.Height,
                  m.Depth, "a memcpy node reads it");
        MarkRange(m.dstMemoryType, m.dstDevice, m.dstPitch, m.dstHeight, m.WidthInBytes, m.Height,
                  m.Depth, "a memcpy node writes it");
        break;
      }
      case CU_GRAPH_NODE_TYPE_MEMSET: {
        CUDA_MEMSET_NODE_PARAMS m{};
        CheckDriver(d_.memset_params(node, &m), "cuGraphMemsetNodeGetParams");
        uint64_t end = m.dst + (m.height > 0 ? m.height - 1 : 0) * m.pitch + m.width * m.elementSize;
        MarkOverlap(m.dst, end, "a memset node writes it");
        break;
      }
      case CU_GRAPH_NODE_TYPE_GRAPH: {
        CUgraph child = nullptr;
        CheckDriver(d_.child_graph(node, &child), "cuGraphChildGraphNodeGetGraph");
        ScanChild(child);
        break;
      }
      case CU_GRAPH_NODE_TYPE_KERNEL: {  // inside a child graph: any use means copy
        KernelNode k = ReadKernel(node);
        if (k.params.extra != nullptr || k.unreadable) {
          for (auto& b : *buffers_) b.Copy("a kernel in a child graph hides its arguments");
        }
        for (const auto& v : k.values) {
          for (size_t at = 0; at + 8 <= v.size(); at += 8) {
            uint64_t word;
            std::memcpy(&word, v.data() + at, 8);
            MarkTouched(word, "kernel " + k.name + " inside a child graph uses it");
          }
        }
        break;
      }
      case CU_GRAPH_NODE_TYPE_CONDITIONAL:  // inside a child graph (CUDA forbids it there)
      case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP:
      case CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL:
      case CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT:
        for (auto& b : *buffers_) {
          b.Copy("the graph has a node (type " + std::to_string(static_cast<int>(type)) +
                 ") jaxgraph cannot look inside");
        }
        break;
      default:  // host, empty, event, memory alloc/free: no static buffer addresses
        break;
    }
  }

  void ScanChild(CUgraph child) {
    for (CUgraphNode node : Nodes(child)) {
      CUgraphNodeType type;
      CheckDriver(d_.node_type(node, &type), "cuGraphNodeGetType");
      ClassifyOther(node, type);
    }
  }

  void MarkRange(CUmemorytype type, CUdeviceptr base, size_t pitch, size_t height, size_t width,
                 size_t rows, size_t depth, const std::string& why) {
    if (type != CU_MEMORYTYPE_DEVICE && type != CU_MEMORYTYPE_UNIFIED) return;
    rows = rows > 0 ? rows : 1;
    depth = depth > 0 ? depth : 1;
    size_t row_pitch = pitch > 0 ? pitch : width;
    size_t slice = row_pitch * (height > 0 ? height : rows);
    uint64_t end = base + (depth - 1) * slice + (rows - 1) * row_pitch + width;
    MarkOverlap(base, end, why);
  }

  void MarkOverlap(uint64_t begin, uint64_t end, const std::string& why) {
    for (auto& b : *buffers_) {
      if (b.bytes > 0 && begin < b.base + b.bytes && b.base < end) b.Copy(why);
    }
  }

  void MarkTouched(uint64_t word, const std::string& why) {
    for (auto& b : *buffers_) {
      if (b.bytes > 0 && word >= b.base && word <= b.base + b.bytes) b.Copy(why);
    }
  }

  std::string Name(const CUDA_KERNEL_NODE_PARAMS& p) const {
    const char* name = nullptr;
    if (p.func != nullptr && d_.func_name && d_.func_name(&name, p.func) == CUDA_SUCCESS &&
        name != nullptr) {
      return name;
    }
    for (CUkernel k : {reinterpret_cast<CUkernel>(p.func), p.kern}) {
      if (k != nullptr && d_.kernel_name && d_.kernel_name(&name, k) == CUDA_SUCCESS &&
          name != nullptr) {
        return name;
      }
    }
    return "<unnamed>";
  }

  std::string Flags(const CUDA_KERNEL_NODE_PARAMS& p) const {
    if (options_.kernels == nullptr) return "";
    for (uint64_t handle : {reinterpret_cast<uint64_t>(p.func), reinterpret_cast<uint64_t>(p.kern)}) {
      if (handle == 0) continue;
      auto it = options_.kernels->find(handle);
      if (it != options_.kernels->end()) return it->second;
    }
    return "";
  }

  const DriverApi& d_;
  std::vector<Binding>* buffers_;
  const ScanOptions& options_;
  size_t num_inputs_;
  size_t conditionals_ = 0;
  bool bodies_from_capture_ = false;  // the driver cannot list bodies: use options_.bodies
};

// ---------------------------------------------------------------------------
// Rebinding at replay
// ---------------------------------------------------------------------------

// Points every site of `b` at `address` in the nodes' argument copies.
inline void Retarget(const Binding& b, uint64_t address, std::vector<KernelNode>* nodes) {
  for (const Site& s : b.sites) {
    uint64_t value = address + s.delta;
    std::memcpy((*nodes)[s.node].values[s.param].data(), &value, 8);
  }
}

}  // namespace jaxgraph

#endif  // JAXGRAPH_FFI_GRAPH_BINDING_H_
