// XLA FFI handler that launches a jaxgraph Kernel (NVRTC-compiled CUDA C++)
// on the stream XLA gives it, so a custom kernel runs inside jax.jit as one
// typed custom call.
//
// Kernels are registered once from Python into a handle table; HLO carries
// only the small integer id, never a raw pointer.

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "nanobind/nanobind.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
namespace nb = nanobind;

namespace {

// ---------------------------------------------------------------------------
// Driver entry point
// ---------------------------------------------------------------------------

// cuLaunchKernel is resolved through the CUDA runtime at first use, so this
// library has no link-time dependency on libcuda and loads without a driver.
using LaunchKernelFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, unsigned, unsigned, CUstream, void**, void**);

LaunchKernelFn GetLaunchKernel() {
  static LaunchKernelFn fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion("cuLaunchKernel", &ptr, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      ptr = nullptr;
    }
    return reinterpret_cast<LaunchKernelFn>(ptr);
  }();
  return fn;
}

// ---------------------------------------------------------------------------
// Kernel table
// ---------------------------------------------------------------------------

// A CUkernel (from cuLibraryLoadData) is context-independent: the driver loads
// it into whichever context is current at launch, so one entry serves every
// device of the same architecture.
std::mutex table_mutex;
std::vector<CUkernel> kernel_table;

int64_t RegisterKernel(uintptr_t handle) {
  std::lock_guard<std::mutex> lock(table_mutex);
  kernel_table.push_back(reinterpret_cast<CUkernel>(handle));
  return static_cast<int64_t>(kernel_table.size() - 1);
}

CUkernel LookupKernel(int64_t id) {
  std::lock_guard<std::mutex> lock(table_mutex);
  if (id < 0 || id >= static_cast<int64_t>(kernel_table.size())) return nullptr;
  return kernel_table[id];
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
  CUkernel kernel = LookupKernel(kernel_id);
  if (kernel == nullptr) {
    return ffi::Error::InvalidArgument("jaxgraph_launch: unknown kernel id " +
                                       std::to_string(kernel_id));
  }
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
    return ffi::Error::Internal("jaxgraph_launch: cuLaunchKernel failed with CUresult " +
                                std::to_string(static_cast<int>(result)));
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

NB_MODULE(_launch, m) {
  m.def("registrations", []() {
    nb::dict registrations;
    registrations["jaxgraph_launch"] = EncapsulateFfiHandler(Launch);
    return registrations;
  });
  m.def("register_kernel", &RegisterKernel, nb::arg("handle"),
        "Add a CUkernel handle to the launch table and return its id.");
}
