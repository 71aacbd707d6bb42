// The address ring of a large graph's copy nodes: how each call tells the
// executable which XLA buffers to copy, with no CUDA call (copy_nodes.h builds
// the nodes that read it). Included by device_graph.h.
//
// Why: a graph launchable from the device (thousands of kernels) keeps one
// executable, and XLA alternates its buffers between calls (x = f(x)), so
// memcpy nodes pointed at each call's buffers cost two
// cudaGraphExecMemcpyNodeSetParams1D per call: 4.3-7.1 us of the handler's
// 15-22 us at 100k kernels on the H100 (benchmarks/scale.py at 7112b1b,
// tests/GPU_RESULTS.md session 5). Here the host writes the call's addresses
// into pinned host memory the device reads, and launches.
//
// The protocol: calls of one graph run on the device in the order they were
// launched (CUDA orders the launches of one executable, and XLA runs a
// device's calls on one stream). The host numbers its launches (`launched`);
// the device counts the calls it finished in `seq` (device memory). Call h's
// addresses go in entry h % slots; its copy nodes read entry seq % slots
// (seq == h while call h runs); its last node adds one to `seq` and stores it
// in `done` (pinned host memory), which tells the host which entries are free.
// With all `slots` entries in flight the host waits (counted: ring_wait).
//
// Memory: 8 bytes of pinned host memory per buffer per entry (8 KB a buffer
// at 1024 entries) and 8 bytes of device memory, per graph and device. When
// the graph goes, its ring joins the retired rings, freed by a sweep once the
// device has finished every call launched on it (`done` says so): never a
// device-wide synchronize, which under a lock or on XLA's thread can deadlock.

#ifndef JAXGRAPH_FFI_COPY_RING_H_
#define JAXGRAPH_FFI_COPY_RING_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

namespace jaxgraph {

// Entries per ring: calls of one graph in flight before the host waits. At
// thousands of kernels a call takes milliseconds, so 1024 queued calls are
// seconds of work. Process-wide, read at registration (set_copy_ring_slots).
constexpr int64_t kCopyRingSlots = 1024;
inline std::atomic<int64_t> copy_ring_slots{kCopyRingSlots};

// How long the host waits for a free entry before the call fails.
constexpr double kCopyRingWaitSeconds = 60.0;

struct CopyRing {
  uint64_t* host = nullptr;  // pinned, mapped: done, padding, then slots entries of `stride` addresses
  uint64_t* seq = nullptr;   // device memory: calls finished on the device
  uint64_t slots = 0;
  uint64_t stride = 0;       // addresses per entry: one per static buffer
  uint64_t launched = 0;     // calls launched (host side)

  static constexpr uint64_t kHeader = 8;  // done, then padding to 64 bytes

  bool live() const { return host != nullptr; }
  volatile uint64_t* done() const { return host; }
  uint64_t* entries() const { return host + kHeader; }

  // Pinned host memory for `slots` entries of `stride` addresses, a zeroed
  // device counter. Returns the failing call's error, nothing allocated.
  std::string Allocate(uint64_t want_slots, uint64_t want_stride) {
    size_t bytes = (kHeader + want_slots * want_stride) * sizeof(uint64_t);
    void* h = nullptr;
    void* d = nullptr;
    cudaError_t err = cudaHostAlloc(&h, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (err != cudaSuccess) return RuntimeError("cudaHostAlloc", err);
    err = cudaMalloc(&d, sizeof(uint64_t));
    if (err == cudaSuccess) err = cudaMemset(d, 0, sizeof(uint64_t));
    if (err != cudaSuccess) {
      std::string why = RuntimeError("cudaMalloc", err);
      if (d != nullptr) cudaFree(d);
      cudaFreeHost(h);
      return why;
    }
    std::memset(h, 0, bytes);
    host = static_cast<uint64_t*>(h), seq = static_cast<uint64_t*>(d);
    slots = want_slots, stride = want_stride, launched = 0;
    return "";
  }

  // The entry for the next launch, once the device has freed it; nullptr after
  // kCopyRingWaitSeconds (the device stopped making progress). `waited` says
  // whether the host had to wait.
  uint64_t* NextEntry(bool* waited) {
    *waited = false;
    if (launched - *done() >= slots) {
      *waited = true;
      auto start = std::chrono::steady_clock::now();
      while (launched - *done() >= slots) {
        std::this_thread::yield();
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > kCopyRingWaitSeconds) {
          return nullptr;
        }
      }
    }
    return entries() + (launched % slots) * stride;
  }

  // After a launch that took the entry NextEntry gave (never after a failed one:
  // the device would not count it, and the two counts would part).
  void Launched() { ++launched; }

  // Hands the memory to the retired rings (below), freed by a later sweep
  // once the calls launched on it have finished. No CUDA call and no wait:
  // it runs in DeviceGraph's destructor, which may run under a table's lock
  // or on XLA's handler thread (the last reference held by a call), where
  // waiting for the device can deadlock (a psum in flight on this device
  // waits for another device whose handler waits for that lock).
  void Release(int device);
};

// A ring whose graph is gone: freed once `*host` (the calls its device
// finished, published by the advance node) reaches `launched`.
struct RetiredRing {
  uint64_t* host;
  uint64_t* seq;
  uint64_t launched;
  int device;
};

inline std::mutex retired_rings_mutex;
inline std::vector<RetiredRing> retired_rings;  // at exit, what is left is the process's to reclaim

inline void CopyRing::Release(int device) {
  if (!live()) return;
  {
    std::lock_guard<std::mutex> lock(retired_rings_mutex);
    retired_rings.push_back(RetiredRing{host, seq, launched, device});
  }
  host = nullptr, seq = nullptr;
}

// Frees the retired rings whose calls have all finished on their device,
// read from pinned host memory (no CUDA call, no wait); the others stay for a
// later sweep. Returns how many stay. Call it holding no lock of the handler's
// and never from a handler: cudaFree and cudaFreeHost may wait for the device.
// Python calls it after registering or retiring a graph, and at exit.
inline size_t SweepRetiredRings() {
  std::vector<RetiredRing> finished;
  size_t left = 0;
  {
    std::lock_guard<std::mutex> lock(retired_rings_mutex);
    auto busy = std::stable_partition(retired_rings.begin(), retired_rings.end(), [](const RetiredRing& r) {
      return *static_cast<volatile uint64_t*>(r.host) >= r.launched;
    });
    finished.assign(retired_rings.begin(), busy);
    retired_rings.erase(retired_rings.begin(), busy);
    left = retired_rings.size();
  }
  if (finished.empty()) return left;
  int current = -1;
  bool restore = cudaGetDevice(&current) == cudaSuccess;
  for (const RetiredRing& r : finished) {
    cudaSetDevice(r.device);
    cudaFree(r.seq);
    cudaFreeHost(r.host);
  }
  if (restore) cudaSetDevice(current);
  cudaGetLastError();
  return left;
}

// Retired rings not freed yet, for tests.
inline size_t RetiredRings() {
  std::lock_guard<std::mutex> lock(retired_rings_mutex);
  return retired_rings.size();
}

}  // namespace jaxgraph

#endif  // JAXGRAPH_FFI_COPY_RING_H_
