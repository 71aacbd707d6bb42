// Shared by jaxgraph's XLA FFI extensions (launch.cc, replay.cc): driver entry
// points, CUDA error text, the table that maps the small ids HLO carries to
// native handles, and the capsule helper for FFI registration.

#ifndef JAXGRAPH_FFI_COMMON_H_
#define JAXGRAPH_FFI_COMMON_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <unordered_map>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "nanobind/nanobind.h"
#include "xla/ffi/api/ffi.h"

namespace jaxgraph {

namespace ffi = xla::ffi;
namespace nb = nanobind;

// ---------------------------------------------------------------------------
// Driver entry points and error text
// ---------------------------------------------------------------------------

// Driver functions are resolved through the CUDA runtime at first use, so the
// extensions have no link-time dependency on libcuda and load without a driver.
// `version` is the CUDA version whose ABI of the symbol is wanted (12000: the
// _v2 graph-node calls); it must not predate the symbol.
inline void* DriverEntryPoint(const char* symbol, unsigned version = 12000) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult status;
  if (cudaGetDriverEntryPointByVersion(symbol, &ptr, version, cudaEnableDefault, &status) !=
          cudaSuccess ||
      status != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return ptr;
}

// The driver function `symbol` as a typed pointer (null where the driver lacks it).
template <typename Fn>
Fn Driver(const char* symbol, unsigned version = 12000) {
  return reinterpret_cast<Fn>(DriverEntryPoint(symbol, version));
}

// "call failed with CUDA_ERROR_X: explanation" for a driver result.
inline std::string DriverError(const char* call, CUresult result) {
  using NameFn = CUresult (*)(CUresult, const char**);
  static NameFn name_fn = Driver<NameFn>("cuGetErrorName");
  static NameFn text_fn = Driver<NameFn>("cuGetErrorString");
  const char* name = nullptr;
  const char* text = nullptr;
  std::string out = std::string(call) + " failed with ";
  if (name_fn != nullptr && name_fn(result, &name) == CUDA_SUCCESS && name != nullptr) {
    out += name;
  } else {
    out += "CUresult " + std::to_string(static_cast<int>(result));
  }
  if (text_fn != nullptr && text_fn(result, &text) == CUDA_SUCCESS && text != nullptr) {
    out += std::string(": ") + text;
  }
  return out;
}

// The same for a runtime error.
inline std::string RuntimeError(const char* call, cudaError_t err) {
  return std::string(call) + " failed with " + cudaGetErrorName(err) + ": " +
         cudaGetErrorString(err);
}

// ---------------------------------------------------------------------------
// Handle table
// ---------------------------------------------------------------------------

// Maps the positive ids that HLO attributes carry (never raw pointers) to
// native entries. A retired id stays as a tombstone (null entry) so a compiled
// function that still names it gets a clear error instead of a crash. Lookups
// take a shared lock, so handlers on several devices never wait for each other;
// `Find` hands out a shared_ptr, so an entry retired during a call lives until
// that call returns.
template <typename Entry>
class HandleTable {
 public:
  enum class Status { kLive, kRetired, kMissing };

  void Insert(int64_t key, std::shared_ptr<Entry> entry) {
    std::unique_lock lock(mutex_);
    entries_[key] = std::move(entry);
  }

  bool Contains(int64_t key) const {
    std::shared_lock lock(mutex_);
    return entries_.count(key) != 0;
  }

  // Retires `key` (idempotent; an unknown id becomes a tombstone too).
  void Retire(int64_t key) {
    std::unique_lock lock(mutex_);
    entries_[key] = nullptr;
  }

  std::shared_ptr<Entry> Find(int64_t key, Status* status) const {
    std::shared_lock lock(mutex_);
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      *status = Status::kMissing;
      return nullptr;
    }
    *status = it->second != nullptr ? Status::kLive : Status::kRetired;
    return it->second;
  }

  // Calls `fn(status, entry)` under the shared lock, so the entry cannot be
  // retired (and what it names unloaded) until `fn` returns.
  template <typename Fn>
  auto Visit(int64_t key, Fn fn) const {
    std::shared_lock lock(mutex_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return fn(Status::kMissing, static_cast<Entry*>(nullptr));
    return fn(it->second != nullptr ? Status::kLive : Status::kRetired, it->second.get());
  }

  size_t Live() const {
    std::shared_lock lock(mutex_);
    size_t n = 0;
    for (const auto& [key, entry] : entries_) n += entry != nullptr ? 1 : 0;
    return n;
  }

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<int64_t, std::shared_ptr<Entry>> entries_;
};

// The error for an id a handler cannot use: never registered in this process
// (compiled functions cannot move between processes) or retired.
inline ffi::Error UnusableId(const char* target, const std::string& what, bool retired,
                             const std::string& hint) {
  if (retired) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      std::string(target) + ": " + what + " was destroyed; " + hint);
  }
  return ffi::Error::InvalidArgument(
      std::string(target) + ": " + what +
      " is not registered in this process; " + hint +
      " (compiled functions cannot be moved between processes)");
}

// ---------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------

template <typename T>
nb::capsule EncapsulateFfiHandler(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "Encapsulated function must be an XLA FFI handler");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

// The body of the handler registered for JAX's CPU platform: jaxgraph runs
// only on CUDA, and this says so (instead of XLA's "no handler registered")
// when a function using it is compiled for JAX on the CPU.
inline ffi::Error NotOnCuda(const char* target, const char* cpu_alternative) {
  return ffi::Error(
      ffi::ErrorCode::kUnimplemented,
      std::string(target) +
          " runs on JAX's CUDA backend, but this computation was compiled for the CPU (JAX's "
          "devices here are CPUs): install JAX with CUDA (pip install \"jax[cuda13]\") on a "
          "machine with an NVIDIA GPU" +
          cpu_alternative);
}

}  // namespace jaxgraph

#endif  // JAXGRAPH_FFI_COMMON_H_
