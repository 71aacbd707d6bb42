"""The kernels of a large graph's copy nodes, compiled by NVRTC and loaded once per device.

A graph of thousands of kernels (``describe_graph(...).device_launchable``)
copies its static buffers to and from XLA's by kernel nodes of its executable
(``ffi/replay/copy_nodes.h``). Each call's XLA addresses reach those nodes through a
ring in pinned host memory (``ffi/replay/copy_ring.h``): the replay handler stores
them and launches, with no CUDA call to re-aim a node, even when XLA
alternates its buffers from one call to the next.

- ``jaxgraph_ring_copy`` copies one buffer: it reads the call's entry of the
  ring (the device's count of finished calls picks it), and copies between
  the static array and the XLA address found there, or does nothing where
  the entry holds 0 (the buffer is bound: its kernels use XLA's buffer).
- ``jaxgraph_ring_advance`` runs after every other node: it counts the call
  as finished on the device and publishes the count to the host, which frees
  the entry for a later call.

The source needs no header, so neither a CUDA toolkit nor a header wheel.
"""

from __future__ import annotations

from typing import Any

from .._cuda import driver as _driver
from .handles import node_count
from .._kernels.kernel import Kernel
from .._kernels.kernel_sets import KernelSets
from .._kernels.load import node_handles

__all__ = ["RING_SOURCE", "ring_kernels", "ring_functions"]

_NAMES = ("jaxgraph_ring_copy", "jaxgraph_ring_advance")

RING_SOURCE = r"""
typedef unsigned long long u64;
struct alignas(16) jg_chunk { u64 lo, hi; };

// A load that goes to memory each time: the entry was written by the host after the kernel was built.
__device__ __forceinline__ u64 jg_load_fresh(const u64* p) {
  u64 v;
  asm volatile("ld.global.cv.u64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}

// Buffer `index` of this call: XLA's address from the ring (0: bound, nothing to copy), copied
// into `array` (an input, out == 0) or out of it (an output).
extern "C" __global__ void jaxgraph_ring_copy(const u64* ring, u64 slots, u64 stride, const u64* seq, u64 index,
                                              unsigned char* array, u64 nbytes, int out) {
  const u64 call = *(const volatile u64*)seq;
  const u64 xla = jg_load_fresh(ring + (call % slots) * stride + index);
  if (xla == 0) return;
  const unsigned char* src = out ? array : (const unsigned char*)xla;
  unsigned char* dst = out ? (unsigned char*)xla : array;
  const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x, step = (u64)gridDim.x * blockDim.x;
  const u64 chunks = (((u64)src | (u64)dst) & 15) == 0 ? nbytes / 16 : 0;
  for (u64 i = first; i < chunks; i += step) ((jg_chunk*)dst)[i] = ((const jg_chunk*)src)[i];
  for (u64 i = chunks * 16 + first; i < nbytes; i += step) dst[i] = src[i];
}

// The call is finished on the device: the next call takes the next entry, and the host may reuse this one.
extern "C" __global__ void jaxgraph_ring_advance(u64* seq, u64* done) {
  const u64 next = *seq + 1;
  *seq = next;
  __threadfence_system();
  *(volatile u64*)done = next;
}
"""

_SIGNATURES = {
    "jaxgraph_ring_copy": "const unsigned long long* ring, unsigned long long slots, unsigned long long stride, "
                          "const unsigned long long* seq, unsigned long long index, unsigned char* array, "
                          "unsigned long long nbytes, int out",
    "jaxgraph_ring_advance": "unsigned long long* seq, unsigned long long* done",
}



def ring_kernels(arch: str | None = None) -> dict[str, Kernel]:
    """The copy nodes' kernels compiled (not loaded) for ``arch``; CPU tests compile them this way."""
    return {name: Kernel(RING_SOURCE, name, {"include_path": []}, signature=_SIGNATURES[name], arch=arch)
            for name in _NAMES}


_RING = KernelSets(ring_kernels)  # compiled for the graph's device, loaded once


def ring_functions(device: int, template: Any, threshold: int) -> list[int]:
    """The (copy, advance) CUfunctions on ``device`` for registering ``template``, or ``[]``.

    Only graphs of at least ``threshold`` nodes (the native replay table's
    ``device_launch_nodes``; negative: none) get device-launchable executables
    that copy by nodes; smaller ones copy on the stream and never compile these kernels.
    """
    if threshold < 0 or node_count(_driver.driver().CUgraph(int(template))) < threshold:
        return []
    kernels = _RING.on(device)
    return [node_handles(kernels[name], device)[-1] for name in _NAMES]
