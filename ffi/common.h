// Shared by jaxgraph's XLA FFI extensions (launch.cc, replay.cc,
// device_loop.cc): CUDA runtime error text, the table that maps the small ids
// HLO carries to native handles, and the capsule helper for FFI registration.
// The driver's entry points are in driver_api.h.

#ifndef JAXGRAPH_FFI_COMMON_H_
#define JAXGRAPH_FFI_COMMON_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "driver_api.h"
#include "nanobind/nanobind.h"
#include "xla/ffi/api/ffi.h"

namespace jaxgraph {

namespace ffi = xla::ffi;
namespace nb = nanobind;

// ---------------------------------------------------------------------------
// Error text
// ---------------------------------------------------------------------------

// "call failed with cudaErrorX: explanation" for a runtime error (driver
// results: DriverError in driver_api.h).
inline std::string RuntimeError(const char* call, cudaError_t err) {
  return std::string(call) + " failed with " + cudaGetErrorName(err) + ": " +
         cudaGetErrorString(err);
}

// ---------------------------------------------------------------------------
// Handle table
// ---------------------------------------------------------------------------

// Maps the positive ids that HLO attributes carry (never raw pointers) to
// native entries, or (graph_table.h) device ordinals to one id's graphs. A
// retired key stays as a tombstone (null entry) so a compiled function that
// still names it gets a clear error instead of a crash. Lookups
// take a shared lock, so handlers on several devices never wait for each other;
// `Find` hands out a shared_ptr, so an entry retired during a call lives until
// that call returns.
// What a key of a HandleTable names.
enum class HandleStatus { kLive, kRetired, kMissing };

template <typename Entry>
class HandleTable {
 public:
  using Status = HandleStatus;

  // Entries replaced or retired are released after the lock (their
  // destructors free CUDA objects: never under the table's lock).
  void Insert(int64_t key, std::shared_ptr<Entry> entry) {
    std::unique_lock lock(mutex_);
    std::swap(entries_[key], entry);
  }

  bool Contains(int64_t key) const {
    std::shared_lock lock(mutex_);
    return entries_.count(key) != 0;
  }

  // Inserts unless `key` is live (a tombstone is replaced); returns whether it did.
  bool InsertNew(int64_t key, std::shared_ptr<Entry> entry) {
    std::unique_lock lock(mutex_);
    std::shared_ptr<Entry>& slot = entries_[key];
    if (slot != nullptr) return false;
    slot = std::move(entry);
    return true;
  }

  // Retires `key` (idempotent; an unknown id becomes a tombstone too).
  void Retire(int64_t key) {
    std::shared_ptr<Entry> gone;  // released after the lock
    std::unique_lock lock(mutex_);
    std::swap(entries_[key], gone);
  }

  // Retires the live entries whose key `pick(key)` accepts; a key never
  // inserted stays unknown (so it is never reported as retired).
  template <typename Pick>
  void RetireLive(Pick pick) {
    std::vector<std::shared_ptr<Entry>> gone;  // released after the lock
    std::unique_lock lock(mutex_);
    for (auto& [key, entry] : entries_) {
      if (entry != nullptr && pick(key)) gone.push_back(std::move(entry));
    }
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

  size_t Live() const { return LiveEntries().size(); }

  // The live (key, entry) pairs, by key.
  std::vector<std::pair<int64_t, std::shared_ptr<Entry>>> LiveEntries() const {
    std::vector<std::pair<int64_t, std::shared_ptr<Entry>>> out;
    {
      std::shared_lock lock(mutex_);
      for (const auto& [key, entry] : entries_) {
        if (entry != nullptr) out.emplace_back(key, entry);
      }
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    return out;
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
