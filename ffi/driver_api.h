// Every CUDA driver entry point jaxgraph's extensions call, in one table.
//
// The entry points are resolved through the CUDA runtime
// (cudaGetDriverEntryPointByVersion) the first time the table is used, never
// linked: the extensions then load, and import, on a machine without a
// driver, where every entry is null. Each entry names what needs it, so a
// caller asks `Missing(kSplicing)` and gets the symbols its driver lacks,
// for a message that says which call is missing instead of a null call.

#ifndef JAXGRAPH_FFI_DRIVER_API_H_
#define JAXGRAPH_FFI_DRIVER_API_H_

#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <cuda.h>
#include <cuda_runtime_api.h>

namespace jaxgraph {

// Which features need an entry (bits; an entry may serve several). A caller
// of an optional entry checks it for null and does without.
enum DriverNeed : unsigned {
  kOptional = 0,
  kBinding = 1u << 0,       // reading kernel nodes' arguments and rebinding them (graph_binding.h)
  kSplicing = 1u << 1,      // adding a graph's nodes to XLA's capture one by one (graph_splice.h)
  kLoops = 1u << 2,         // building loop graphs node by node (device_loop.cc)
  kConditionals = 1u << 3,  // conditional nodes in those loop graphs (CUDA 12.3)
  kLaunching = 1u << 4,     // launching kernels and graphs (launch.cc)
};

// The driver function `symbol`, ABI of CUDA `version`, or null where the
// driver lacks it. `version` must not predate the symbol; 12000 gives the
// _v2 graph-node calls (CUDA_KERNEL_NODE_PARAMS with `kern`).
inline void* DriverEntryPoint(const char* symbol, unsigned version) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult status;
  if (cudaGetDriverEntryPointByVersion(symbol, &ptr, version, cudaEnableDefault, &status) !=
          cudaSuccess ||
      status != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return ptr;
}

// One symbol of the table, for the missing-entry report.
struct DriverSymbol {
  const char* name;
  unsigned needs;
  bool present;
};

// A typed driver entry point that enters itself in the table's symbol list.
template <typename Fn>
class DriverFn {
 public:
  DriverFn(std::vector<DriverSymbol>* symbols, const char* name, unsigned needs,
           unsigned version = 12000)
      : fn_(reinterpret_cast<Fn>(DriverEntryPoint(name, version))) {
    symbols->push_back({name, needs, fn_ != nullptr});
  }

  template <typename... Args>
  CUresult operator()(Args&&... args) const {
    return fn_(std::forward<Args>(args)...);
  }
  explicit operator bool() const { return fn_ != nullptr; }

 private:
  Fn fn_;
};

class DriverApi {
 public:
  // The table, loaded on first use (thread-safe: a function-local static).
  static const DriverApi& Get() {
    static const DriverApi api;
    return api;
  }

  // The symbols that a feature in `needs` uses and this driver lacks, as
  // "cuA, cuB"; "" when it has them all.
  std::string Missing(unsigned needs) const {
    std::string out;
    for (const DriverSymbol& s : symbols_) {
      if ((s.needs & needs) != 0 && !s.present) out += (out.empty() ? "" : ", ") + std::string(s.name);
    }
    return out;
  }
  bool Complete(unsigned needs) const { return Missing(needs).empty(); }

  DriverApi(const DriverApi&) = delete;
  DriverApi& operator=(const DriverApi&) = delete;

 private:
  DriverApi() = default;
  std::vector<DriverSymbol> symbols_;  // declared before the entries, which fill it

 public:
  // Error text.
  DriverFn<CUresult (*)(CUresult, const char**)> error_name{&symbols_, "cuGetErrorName", kOptional};
  DriverFn<CUresult (*)(CUresult, const char**)> error_string{&symbols_, "cuGetErrorString", kOptional};

  // Contexts.
  DriverFn<CUresult (*)(CUcontext*)> current_ctx{&symbols_, "cuCtxGetCurrent",
                                                 kSplicing | kLoops | kLaunching};
  DriverFn<CUresult (*)(CUcontext)> set_current_ctx{&symbols_, "cuCtxSetCurrent", kLaunching};

  // Reading a graph.
  DriverFn<CUresult (*)(CUgraph, CUgraphNode*, size_t*)> get_nodes{&symbols_, "cuGraphGetNodes",
                                                                   kBinding | kSplicing};
  DriverFn<CUresult (*)(CUgraphNode, CUgraphNodeType*)> node_type{&symbols_, "cuGraphNodeGetType",
                                                                  kBinding | kSplicing};
  // The 12.0 ABI: dependencies without edge data.
  DriverFn<CUresult (*)(CUgraphNode, CUgraphNode*, size_t*)> deps{&symbols_, "cuGraphNodeGetDependencies",
                                                                  kSplicing};
  DriverFn<CUresult (*)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS*)> kernel_params{
      &symbols_, "cuGraphKernelNodeGetParams", kBinding};
  DriverFn<CUresult (*)(CUgraphNode, CUDA_MEMCPY3D*)> memcpy_params{
      &symbols_, "cuGraphMemcpyNodeGetParams", kBinding | kSplicing};
  DriverFn<CUresult (*)(CUgraphNode, CUDA_MEMSET_NODE_PARAMS*)> memset_params{
      &symbols_, "cuGraphMemsetNodeGetParams", kBinding | kSplicing};
  DriverFn<CUresult (*)(CUgraphNode, CUDA_HOST_NODE_PARAMS*)> host_params{
      &symbols_, "cuGraphHostNodeGetParams", kSplicing};
  DriverFn<CUresult (*)(CUgraphNode, CUgraph*)> child_graph{&symbols_, "cuGraphChildGraphNodeGetGraph",
                                                            kBinding | kSplicing};
  DriverFn<CUresult (*)(CUgraphNode, CUevent*)> record_event{&symbols_, "cuGraphEventRecordNodeGetEvent",
                                                             kSplicing};
  DriverFn<CUresult (*)(CUgraphNode, CUevent*)> wait_event{&symbols_, "cuGraphEventWaitNodeGetEvent",
                                                           kSplicing};
  // A conditional node's bodies: newer than CUDA 13.0, so optional (the
  // capture lists the bodies where the driver cannot).
  DriverFn<CUresult (*)(CUgraphNode, CUgraphNodeParams*)> node_params{&symbols_, "cuGraphNodeGetParams",
                                                                      kOptional, 13010};

  // Kernels: parameter layout (CUDA 12.4) and names (12.3, for messages only).
  DriverFn<CUresult (*)(CUfunction, size_t, size_t*, size_t*)> func_param_info{
      &symbols_, "cuFuncGetParamInfo", kBinding, 12040};
  DriverFn<CUresult (*)(CUkernel, size_t, size_t*, size_t*)> kernel_param_info{
      &symbols_, "cuKernelGetParamInfo", kBinding, 12040};
  DriverFn<CUresult (*)(const char**, CUfunction)> func_name{&symbols_, "cuFuncGetName", kOptional, 12030};
  DriverFn<CUresult (*)(const char**, CUkernel)> kernel_name{&symbols_, "cuKernelGetName", kOptional,
                                                             12030};

  // Rewriting kernel arguments.
  DriverFn<CUresult (*)(CUgraphNode, const CUDA_KERNEL_NODE_PARAMS*)> set_kernel_params{
      &symbols_, "cuGraphKernelNodeSetParams", kBinding};
  DriverFn<CUresult (*)(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS*)> exec_set_kernel_params{
      &symbols_, "cuGraphExecKernelNodeSetParams", kBinding};

  // Making graphs.
  DriverFn<CUresult (*)(CUgraph*, unsigned)> graph_create{&symbols_, "cuGraphCreate", kLoops};
  DriverFn<CUresult (*)(CUgraph*, CUgraph)> graph_clone{&symbols_, "cuGraphClone", kLoops};
  DriverFn<CUresult (*)(CUgraph)> graph_destroy{&symbols_, "cuGraphDestroy", kLoops};

  // Adding nodes.
  DriverFn<CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_KERNEL_NODE_PARAMS*)>
      add_kernel{&symbols_, "cuGraphAddKernelNode", kSplicing | kLoops};
  DriverFn<CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_MEMCPY3D*, CUcontext)>
      add_memcpy{&symbols_, "cuGraphAddMemcpyNode", kSplicing | kLoops};
  DriverFn<CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_MEMSET_NODE_PARAMS*,
                        CUcontext)>
      add_memset{&symbols_, "cuGraphAddMemsetNode", kSplicing};
  DriverFn<CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_HOST_NODE_PARAMS*)>
      add_host{&symbols_, "cuGraphAddHostNode", kSplicing};
  DriverFn<CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t)> add_empty{
      &symbols_, "cuGraphAddEmptyNode", kSplicing};
  DriverFn<CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUgraph)> add_child{
      &symbols_, "cuGraphAddChildGraphNode", kSplicing | kLoops};
  DriverFn<CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUevent)> add_record{
      &symbols_, "cuGraphAddEventRecordNode", kSplicing};
  DriverFn<CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUevent)> add_wait{
      &symbols_, "cuGraphAddEventWaitNode", kSplicing};

  // Conditional nodes (CUDA 12.3; the _v2 cuGraphAddNode, with edge data).
  DriverFn<CUresult (*)(CUgraphConditionalHandle*, CUgraph, CUcontext, unsigned, unsigned)>
      conditional_handle{&symbols_, "cuGraphConditionalHandleCreate", kConditionals, 12030};
  DriverFn<CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, const CUgraphEdgeData*, size_t,
                        CUgraphNodeParams*)>
      add_node{&symbols_, "cuGraphAddNode", kConditionals, 12030};

  // Launching.
  DriverFn<CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        CUstream, void**, void**)>
      launch_kernel{&symbols_, "cuLaunchKernel", kLaunching};
  DriverFn<CUresult (*)(CUgraphExec, CUstream)> graph_launch{&symbols_, "cuGraphLaunch", kLaunching};
};

// A one-dimensional kernel node's parameters: `function` (a CUfunction) on
// `blocks` x `threads`, its arguments' addresses in `args` (the driver copies them).
inline CUDA_KERNEL_NODE_PARAMS KernelNodeParams(uint64_t function, unsigned blocks, unsigned threads, void** args) {
  CUDA_KERNEL_NODE_PARAMS params;
  std::memset(&params, 0, sizeof(params));
  params.func = reinterpret_cast<CUfunction>(function);
  params.gridDimX = blocks, params.gridDimY = 1, params.gridDimZ = 1;
  params.blockDimX = threads, params.blockDimY = 1, params.blockDimZ = 1;
  params.kernelParams = args;
  return params;
}

// "call failed with CUDA_ERROR_X: explanation" for a driver result.
inline std::string DriverError(const char* call, CUresult result) {
  const DriverApi& d = DriverApi::Get();
  const char* name = nullptr;
  const char* text = nullptr;
  std::string out = std::string(call) + " failed with ";
  if (d.error_name && d.error_name(result, &name) == CUDA_SUCCESS && name != nullptr) {
    out += name;
  } else {
    out += "CUresult " + std::to_string(static_cast<int>(result));
  }
  if (d.error_string && d.error_string(result, &text) == CUDA_SUCCESS && text != nullptr) {
    out += std::string(": ") + text;
  }
  return out;
}

// Throws DriverError's text unless `result` is CUDA_SUCCESS (for code run
// from Python, which raises it; handlers return an ffi::Error instead).
inline void CheckDriver(CUresult result, const char* call) {
  if (result != CUDA_SUCCESS) throw std::runtime_error(DriverError(call, result));
}

}  // namespace jaxgraph

#endif  // JAXGRAPH_FFI_DRIVER_API_H_
