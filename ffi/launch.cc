// XLA FFI handler that launches a jaxgraph Kernel (NVRTC-compiled CUDA C++)
// on the stream XLA gives it, so a custom kernel runs inside jax.jit as one
// typed custom call.
//
// Kernels are registered once from Python into a handle table; HLO carries
// only the small integer id, never a raw pointer.

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "nanobind/nanobind.h"
#include "nanobind/stl/string.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
namespace nb = nanobind;

namespace {

// ---------------------------------------------------------------------------
// Driver entry point
// ---------------------------------------------------------------------------

// Driver functions are resolved through the CUDA runtime at first use, so
// this library has no link-time dependency on libcuda and loads without a driver.
void* DriverEntryPoint(const char* symbol) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult status;
  if (cudaGetDriverEntryPointByVersion(symbol, &ptr, 12000, cudaEnableDefault, &status) !=
          cudaSuccess ||
      status != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return ptr;
}

using LaunchKernelFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, unsigned, unsigned, CUstream, void**, void**);

LaunchKernelFn GetLaunchKernel() {
  static LaunchKernelFn fn = reinterpret_cast<LaunchKernelFn>(DriverEntryPoint("cuLaunchKernel"));
  return fn;
}

using GetErrorNameFn = CUresult (*)(CUresult, const char**);

std::string ErrorName(CUresult result) {
  static GetErrorNameFn fn = reinterpret_cast<GetErrorNameFn>(DriverEntryPoint("cuGetErrorName"));
  const char* name = nullptr;
  if (fn != nullptr && fn(result, &name) == CUDA_SUCCESS && name != nullptr) return name;
  return "CUresult " + std::to_string(static_cast<int>(result));
}

// ---------------------------------------------------------------------------
// Kernel table
// ---------------------------------------------------------------------------

// A CUkernel (from cuLibraryLoadData) is context-independent: the driver loads
// it into whichever context is current at launch, so one entry serves every
// device of the same architecture.
//
// Ids are chosen by Python when a kernel is first traced (they must be baked
// into HLO even where no GPU exists to load the kernel); the handle is added
// when the kernel is loaded. A kernel whose Python object was collected stays
// as a tombstone (null handle) so the handler can say what happened.
struct KernelEntry {
  CUkernel handle = nullptr;
  std::string name;
};

std::mutex table_mutex;
std::unordered_map<int64_t, KernelEntry> kernel_table;

void RegisterKernel(int64_t id, uintptr_t handle, const std::string& name) {
  if (id <= 0) throw std::invalid_argument("kernel id must be positive");
  if (handle == 0) throw std::invalid_argument("kernel handle must not be null");
  std::lock_guard<std::mutex> lock(table_mutex);
  kernel_table[id] = KernelEntry{reinterpret_cast<CUkernel>(handle), name};
}

void UnregisterKernel(int64_t id) {
  std::lock_guard<std::mutex> lock(table_mutex);
  auto it = kernel_table.find(id);
  if (it != kernel_table.end()) it->second.handle = nullptr;
}

size_t LiveKernels() {
  std::lock_guard<std::mutex> lock(table_mutex);
  size_t n = 0;
  for (const auto& [id, entry] : kernel_table) n += entry.handle != nullptr ? 1 : 0;
  return n;
}

// Sets `*kernel`, or returns an error saying why there is none. The caller
// holds table_mutex.
ffi::Error LookupKernel(int64_t id, CUkernel* kernel) {
  auto it = kernel_table.find(id);
  if (it == kernel_table.end()) {
    return ffi::Error::InvalidArgument(
        "jaxgraph_launch: kernel " + std::to_string(id) +
        " was not loaded in this process; trace the jaxgraph.Kernel's jax_call in this process "
        "on a machine with a CUDA GPU (compiled functions cannot be moved between processes)");
  }
  if (it->second.handle == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jaxgraph_launch: kernel " + std::to_string(id) + " (" + it->second.name +
                          ") was destroyed; keep the jaxgraph.Kernel alive as long as compiled "
                          "functions that call it");
  }
  *kernel = it->second.handle;
  return ffi::Error::Success();
}

// ---------------------------------------------------------------------------
// Launch
// ---------------------------------------------------------------------------

// `params` has one entry per kernel parameter, in order: an index >= 0 names a
// buffer (operands first, then results); a negative value -(k+1) names word k
// of `scalars`, where each scalar sits little-endian in its own 8-byte word.
ffi::Error LaunchImpl(cudaStream_t stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                      int64_t kernel_id, ffi::Span<const int64_t> grid,
                      ffi::Span<const int64_t> block, int64_t shared_mem,
                      ffi::Span<const int64_t> params, ffi::Span<const int64_t> scalars) {
  // Held until the launch is enqueued, so a kernel collected concurrently
  // (which unloads its library) cannot be launched after it is gone.
  std::lock_guard<std::mutex> lock(table_mutex);
  CUkernel kernel = nullptr;
  if (auto e = LookupKernel(kernel_id, &kernel); e.failure()) return e;
  if (grid.size() != 3 || block.size() != 3) {
    return ffi::Error::InvalidArgument("jaxgraph_launch: grid and block must have 3 entries");
  }
  LaunchKernelFn launch = GetLaunchKernel();
  if (launch == nullptr) {
    return ffi::Error::Internal("jaxgraph_launch: cuLaunchKernel not found in the CUDA driver");
  }
  const size_t num_buffers = args.size() + rets.size();
  std::vector<void*> pointers(num_buffers, nullptr);
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    pointers[i] = buffer->untyped_data();
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    pointers[args.size() + i] = (*buffer)->untyped_data();
  }
  std::vector<void*> kernel_params(params.size());
  for (size_t p = 0; p < params.size(); ++p) {
    int64_t code = params[p];
    if (code >= 0) {
      if (code >= static_cast<int64_t>(num_buffers)) {
        return ffi::Error::InvalidArgument("jaxgraph_launch: buffer index out of range");
      }
      kernel_params[p] = &pointers[code];
    } else {
      size_t word = static_cast<size_t>(-(code + 1));
      if (word >= scalars.size()) {
        return ffi::Error::InvalidArgument("jaxgraph_launch: scalar index out of range");
      }
      kernel_params[p] = const_cast<int64_t*>(&scalars[word]);
    }
  }
  CUresult result = launch(reinterpret_cast<CUfunction>(kernel), grid[0], grid[1], grid[2],
                           block[0], block[1], block[2], static_cast<unsigned>(shared_mem),
                           reinterpret_cast<CUstream>(stream), kernel_params.data(), nullptr);
  if (result != CUDA_SUCCESS) {
    return ffi::Error::Internal("jaxgraph_launch: cuLaunchKernel failed with " +
                                ErrorName(result) + " (grid " + std::to_string(grid[0]) + "x" +
                                std::to_string(grid[1]) + "x" + std::to_string(grid[2]) +
                                ", block " + std::to_string(block[0]) + "x" +
                                std::to_string(block[1]) + "x" + std::to_string(block[2]) +
                                ", shared_mem " + std::to_string(shared_mem) + ")");
  }
  return ffi::Error::Success();
}

}  // namespace

// Launching a kernel is a plain stream operation, so XLA may record it into
// its own command buffers.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Launch, LaunchImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .RemainingArgs()                   // operands
                                  .RemainingRets()                   // results
                                  .Attr<int64_t>("kernel")           // kernel table id
                                  .Attr<ffi::Span<const int64_t>>("grid")
                                  .Attr<ffi::Span<const int64_t>>("block")
                                  .Attr<int64_t>("shared_mem")       // dynamic bytes
                                  .Attr<ffi::Span<const int64_t>>("params")
                                  .Attr<ffi::Span<const int64_t>>("scalars"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

template <typename T>
nb::capsule EncapsulateFfiHandler(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "Encapsulated function must be an XLA FFI handler");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

// ---------------------------------------------------------------------------
// Eager launch from Python
// ---------------------------------------------------------------------------

// Kernel.launch's last step: the same driver entry point, without a Python
// binding's per-call argument marshalling (measured: the cost of an eager
// launch from Python). Returns the CUresult; Python raises on failure.
int LaunchFromPython(uintptr_t function, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                     unsigned block_x, unsigned block_y, unsigned block_z, unsigned shared_mem,
                     uintptr_t stream, uintptr_t params) {
  LaunchKernelFn launch = GetLaunchKernel();
  if (launch == nullptr) return static_cast<int>(CUDA_ERROR_NOT_FOUND);
  return static_cast<int>(launch(reinterpret_cast<CUfunction>(function), grid_x, grid_y, grid_z,
                                 block_x, block_y, block_z, shared_mem,
                                 reinterpret_cast<CUstream>(stream),
                                 reinterpret_cast<void**>(params), nullptr));
}

NB_MODULE(_launch, m) {
  m.def("registrations", []() {
    nb::dict registrations;
    registrations["jaxgraph_launch"] = EncapsulateFfiHandler(Launch);
    return registrations;
  });
  m.def("register_kernel", &RegisterKernel, nb::arg("id"), nb::arg("handle"), nb::arg("name"),
        "Enter a loaded CUkernel handle into the launch table under `id` (> 0).");
  m.def("unregister_kernel", &UnregisterKernel, nb::arg("id"),
        "Mark kernel `id` destroyed: the handler then fails with a clear error.");
  m.def("live_kernels", &LiveKernels, "Number of kernels the handler can launch.");
  m.def("launch", &LaunchFromPython, nb::arg("function"), nb::arg("grid_x"), nb::arg("grid_y"),
        nb::arg("grid_z"), nb::arg("block_x"), nb::arg("block_y"), nb::arg("block_z"),
        nb::arg("shared_mem"), nb::arg("stream"), nb::arg("params"),
        "cuLaunchKernel(function, grid, block, shared_mem, stream, params); returns the CUresult.");
}
