// XLA FFI handler that launches a jaxgraph Kernel (NVRTC-compiled CUDA C++)
// on the stream XLA gives it, so a custom kernel runs inside jax.jit as one
// typed custom call; and the eager launch entry point Kernel.launch uses.
//
// Kernels are registered once from Python into a handle table; HLO carries
// only the small integer id, never a raw pointer. Python side: jaxgraph/_jax_interop/kernel_call.py.

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.h"
#include "driver_api.h"
#include "nanobind/stl/string.h"

namespace jaxgraph {
namespace {

// ---------------------------------------------------------------------------
// Kernel table
// ---------------------------------------------------------------------------

// A CUkernel (from cuLibraryLoadData) is context-independent: the driver loads
// it into whichever context is current at launch, so one entry serves every
// device of the same architecture.
//
// Ids are chosen by Python when a kernel is first traced (they must be baked
// into HLO even where no GPU exists to load the kernel); the handle is added
// when the kernel is loaded. An entry stays, its library kept loaded by Python,
// until the process exits: XLA's recordings launch the kernel without calling
// this handler, after its Python object is collected too.
struct KernelEntry {
  CUkernel handle = nullptr;
  std::string name;
  int64_t num_params = 0;  // the kernel's parameter count: a call passes one code per parameter
};

HandleTable<KernelEntry> kernel_table;

void RegisterKernel(int64_t id, uintptr_t handle, const std::string& name, int64_t num_params) {
  if (id <= 0) throw std::invalid_argument("kernel id must be positive");
  if (handle == 0) throw std::invalid_argument("kernel handle must not be null");
  if (num_params < 0) throw std::invalid_argument("num_params must be >= 0");
  kernel_table.Insert(id, std::make_shared<KernelEntry>(
                              KernelEntry{reinterpret_cast<CUkernel>(handle), name, num_params}));
}

// ---------------------------------------------------------------------------
// Launch
// ---------------------------------------------------------------------------

// Collects the buffers' addresses, then the kernel's argument pointers.
// `params` has one entry per kernel parameter, in order: an index >= 0 names a
// buffer (operands first, then results); a negative value -(k+1) names word k
// of `scalars`, where each scalar sits little-endian in its own 8-byte word.
ffi::Error PackArguments(ffi::RemainingArgs args, ffi::RemainingRets rets,
                         ffi::Span<const int64_t> params, ffi::Span<const int64_t> scalars,
                         std::vector<void*>* pointers, std::vector<void*>* kernel_params) {
  const size_t num_buffers = args.size() + rets.size();
  pointers->assign(num_buffers, nullptr);
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    (*pointers)[i] = buffer->untyped_data();
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    (*pointers)[args.size() + i] = (*buffer)->untyped_data();
  }
  kernel_params->resize(params.size());
  for (size_t p = 0; p < params.size(); ++p) {
    int64_t code = params[p];
    if (code >= 0) {
      if (code >= static_cast<int64_t>(num_buffers)) {
        return ffi::Error::InvalidArgument("jaxgraph_launch: buffer index out of range");
      }
      (*kernel_params)[p] = &(*pointers)[code];
    } else {
      size_t word = static_cast<size_t>(-(code + 1));
      if (word >= scalars.size()) {
        return ffi::Error::InvalidArgument("jaxgraph_launch: scalar index out of range");
      }
      (*kernel_params)[p] = const_cast<int64_t*>(&scalars[word]);
    }
  }
  return ffi::Error::Success();
}

std::string Geometry(ffi::Span<const int64_t> grid, ffi::Span<const int64_t> block,
                     int64_t shared_mem) {
  auto dims = [](ffi::Span<const int64_t> d) {
    return std::to_string(d[0]) + "x" + std::to_string(d[1]) + "x" + std::to_string(d[2]);
  };
  return "grid " + dims(grid) + ", block " + dims(block) + ", shared_mem " +
         std::to_string(shared_mem);
}

ffi::Error LaunchImpl(cudaStream_t stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                      int64_t kernel_id, ffi::Span<const int64_t> grid,
                      ffi::Span<const int64_t> block, int64_t shared_mem,
                      ffi::Span<const int64_t> params, ffi::Span<const int64_t> scalars) {
  if (grid.size() != 3 || block.size() != 3) {
    return ffi::Error::InvalidArgument("jaxgraph_launch: grid and block must have 3 entries");
  }
  const DriverApi& d = DriverApi::Get();
  if (!d.launch_kernel) {
    return ffi::Error::Internal("jaxgraph_launch: cuLaunchKernel not found in the CUDA driver");
  }
  std::vector<void*> pointers, kernel_params;
  if (auto e = PackArguments(args, rets, params, scalars, &pointers, &kernel_params); e.failure()) {
    return e;
  }
  // Visit holds the table's shared lock until the launch is enqueued, so a
  // kernel collected concurrently (which unloads its library) waits for it.
  return kernel_table.Visit(kernel_id, [&](auto status, KernelEntry* entry) -> ffi::Error {
    if (entry == nullptr) {
      return UnusableId("jaxgraph_launch", "kernel " + std::to_string(kernel_id),
                        status == HandleStatus::kRetired,
                        status == HandleStatus::kRetired
                            ? "keep the jaxgraph.Kernel alive as long as compiled functions that "
                              "call it"
                            : "trace the jaxgraph.Kernel's jax_call in this process on a machine "
                              "with a CUDA GPU");
    }
    // The driver reads one argument per parameter through kernel_params: fewer would read past it.
    if (static_cast<int64_t>(params.size()) != entry->num_params) {
      return ffi::Error::InvalidArgument(
          "jaxgraph_launch: kernel " + entry->name + " takes " + std::to_string(entry->num_params) +
          " parameters, but the call passes " + std::to_string(params.size()) +
          " parameter codes (the params attribute has one per kernel parameter)");
    }
    CUresult result = d.launch_kernel(reinterpret_cast<CUfunction>(entry->handle), grid[0], grid[1],
                             grid[2], block[0], block[1], block[2],
                             static_cast<unsigned>(shared_mem),
                             reinterpret_cast<CUstream>(stream), kernel_params.data(), nullptr);
    if (result != CUDA_SUCCESS) {
      return ffi::Error::Internal("jaxgraph_launch: kernel " + entry->name + ": " +
                                  DriverError("cuLaunchKernel", result) + " (" +
                                  Geometry(grid, block, shared_mem) + ")");
    }
    return ffi::Error::Success();
  });
}

ffi::Error LaunchOnCpuImpl(ffi::RemainingArgs, ffi::RemainingRets, ffi::Dictionary) {
  return NotOnCuda("jaxgraph_launch (Kernel.jax_call)", "");
}

}  // namespace
}  // namespace jaxgraph

// Launching a kernel is a plain stream operation, so XLA may record it into
// its own command buffers.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Launch, jaxgraph::LaunchImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .RemainingArgs()                   // operands
                                  .RemainingRets()                   // results
                                  .Attr<int64_t>("kernel")           // kernel table id
                                  .Attr<xla::ffi::Span<const int64_t>>("grid")
                                  .Attr<xla::ffi::Span<const int64_t>>("block")
                                  .Attr<int64_t>("shared_mem")       // dynamic bytes
                                  .Attr<xla::ffi::Span<const int64_t>>("params")
                                  .Attr<xla::ffi::Span<const int64_t>>("scalars"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

// Registered for JAX's CPU platform: a clear error instead of "no handler".
XLA_FFI_DEFINE_HANDLER_SYMBOL(LaunchOnCpu, jaxgraph::LaunchOnCpuImpl,
                              xla::ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attrs<xla::ffi::Dictionary>());

// ---------------------------------------------------------------------------
// Eager launch from Python
// ---------------------------------------------------------------------------

namespace jaxgraph {
namespace {

// Kernel.launch's last step, with what is cheapest to pass from Python: the
// launch geometry and the packed arguments as bytes (Python packs each with
// one precompiled struct; one 8-byte slot per parameter, the geometry 7
// uint32: grid xyz, block xyz, dynamic shared memory). Makes `context` (the
// device's primary context) current first if another library switched it.
// Returns 0, a CUresult from cuLaunchKernel, or minus cuCtxSetCurrent's.
int LaunchFromPython(uintptr_t function, uintptr_t context, uintptr_t stream,
                     const nb::bytes& geometry, const nb::bytes& params) {
  const DriverApi& d = DriverApi::Get();
  if (!d.launch_kernel || !d.current_ctx || !d.set_current_ctx) {
    return static_cast<int>(CUDA_ERROR_NOT_FOUND);
  }
  constexpr size_t kGeometryBytes = 7 * sizeof(uint32_t);
  if (geometry.size() != kGeometryBytes || params.size() % 8 != 0) {
    return static_cast<int>(CUDA_ERROR_INVALID_VALUE);
  }
  uint32_t g[7];
  std::memcpy(g, geometry.c_str(), kGeometryBytes);
  // The driver reads each parameter through its pointer during the call: the
  // slots point into the (immutable, 8-byte aligned) bytes Python passed.
  const size_t count = params.size() / 8;
  void* inline_slots[32];
  std::vector<void*> heap_slots;
  void** slots = inline_slots;
  if (count > 32) {
    heap_slots.resize(count);
    slots = heap_slots.data();
  }
  char* data = const_cast<char*>(params.c_str());
  for (size_t i = 0; i < count; ++i) slots[i] = data + 8 * i;
  CUcontext current = nullptr;
  CUcontext wanted = reinterpret_cast<CUcontext>(context);
  if (wanted != nullptr && (d.current_ctx(&current) != CUDA_SUCCESS || current != wanted)) {
    if (CUresult r = d.set_current_ctx(wanted); r != CUDA_SUCCESS) return -static_cast<int>(r);
  }
  return static_cast<int>(d.launch_kernel(reinterpret_cast<CUfunction>(function), g[0], g[1], g[2],
                                          g[3], g[4], g[5], g[6], reinterpret_cast<CUstream>(stream),
                                          slots, nullptr));
}

// CUDAGraph.replay's launch: as LaunchFromPython, one driver call with no
// per-call marshalling of handle objects (at one kernel per graph, that
// marshalling is a fifth of a replay's host time).
int GraphLaunchFromPython(uintptr_t graph_exec, uintptr_t stream) {
  const DriverApi& d = DriverApi::Get();
  if (!d.graph_launch) return static_cast<int>(CUDA_ERROR_NOT_FOUND);
  return static_cast<int>(
      d.graph_launch(reinterpret_cast<CUgraphExec>(graph_exec), reinterpret_cast<CUstream>(stream)));
}

// The calling thread's current CUDA context (0 when none), so Python can see
// whether another library (XLA, CuPy, torch) switched it since jaxgraph set it.
uintptr_t CurrentContext() {
  const DriverApi& d = DriverApi::Get();
  CUcontext ctx = nullptr;
  if (!d.current_ctx || d.current_ctx(&ctx) != CUDA_SUCCESS) return 0;
  return reinterpret_cast<uintptr_t>(ctx);
}

}  // namespace
}  // namespace jaxgraph

NB_MODULE(_launch, m) {
  namespace nb = nanobind;
  using namespace jaxgraph;
  m.def("registrations", []() {
    nb::dict registrations;
    registrations["jaxgraph_launch"] = EncapsulateFfiHandler(Launch);
    return registrations;
  }, "FFI handler capsules for JAX's CUDA platform, by target name.");
  m.def("cpu_registrations", []() {
    nb::dict registrations;
    registrations["jaxgraph_launch"] = EncapsulateFfiHandler(LaunchOnCpu);
    return registrations;
  }, "FFI handler capsules for JAX's CPU platform: they fail saying jaxgraph needs CUDA.");
  m.def("register_kernel", &RegisterKernel, nb::arg("id"), nb::arg("handle"), nb::arg("name"),
        nb::arg("num_params"),
        "Enter a loaded CUkernel handle (of a kernel with `num_params` parameters) into the launch table "
        "under `id` (> 0).");
  m.def("unregister_kernel", [](int64_t id) { kernel_table.Retire(id); }, nb::arg("id"),
        "Mark kernel `id` destroyed: the handler then fails with a clear error.");
  m.def("live_kernels", []() { return kernel_table.Live(); },
        "Number of kernels the handler can launch.");
  m.def("launch", &LaunchFromPython, nb::arg("function"), nb::arg("context"), nb::arg("stream"),
        nb::arg("geometry"), nb::arg("params"),
        "cuLaunchKernel(function, grid, block, shared_mem, stream, params) in `context`; geometry is 7 "
        "uint32 (grid xyz, block xyz, shared_mem), params one 8-byte slot per parameter. Returns 0, the "
        "launch's CUresult, or minus cuCtxSetCurrent's.");
  m.def("current_context", &CurrentContext, "cuCtxGetCurrent() as an integer (0: none or failure).");
  m.def("graph_launch", &GraphLaunchFromPython, nb::arg("graph_exec"), nb::arg("stream"),
        "cuGraphLaunch(graph_exec, stream); returns the CUresult.");
}
