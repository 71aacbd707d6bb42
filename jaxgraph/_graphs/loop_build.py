"""How a graphed loop is built: the loop graph, its control kernels, its adoption as a CUDAGraph.

:func:`build` finds the step's swapped twin (``swap_variant``) or falls back
to a copy after each step, has ``ffi/device_loop.cc`` build the graph node by
node from the step's template and the control kernels compiled here, and
wraps the result in a :class:`~jaxgraph.CUDAGraph` (``keep_graph=True``) that
holds everything the graph's nodes point at. ``_jax_interop/graphed_loops.py`` is the API.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from .._cuda import driver as _driver
from .._cuda.array import DeviceArray, zeros
from .._cuda.captures import CaptureInputs
from .handles import CaptureState, node_count
from .cuda_graph import CUDAGraph, handles_of, replay_source
from .._kernels.kernel import Kernel
from .._kernels.load import node_handles
from .._cuda.native import native
from .._kernels.signature import access_flags

__all__ = ["BuiltLoop", "CONTROL_SOURCE", "build", "control_kernels", "step_nodes"]


@dataclasses.dataclass(frozen=True)
class BuiltLoop:
    """What :func:`build` made: the loop graph and the device arrays it counts with."""

    graph: CUDAGraph
    count: DeviceArray | None   # R read at each launch (the caller's array or the loop's own)
    own_count: bool             # ``count`` belongs to the loop (an input of its JAX function)
    remaining: DeviceArray      # steps left, while the loop runs
    done: DeviceArray           # steps run (``GraphedLoop.steps_run``)
    ping_pong: str


def step_nodes(graph: CUDAGraph) -> int:
    """Top-level nodes of the step's graph (what the default unroll is sized by)."""
    source = replay_source(graph)
    _driver.ensure_context(source.device)
    return node_count(_driver.driver().CUgraph(source.template))


def build(graph: CUDAGraph, owner: Any, ins: tuple, outs: tuple, pairs: list, fixed: int,
          count: DeviceArray | None, until: DeviceArray | None, flag_bytes: int, k: int,
          swap_allowed: bool = True) -> BuiltLoop:
    """Build, adopt and instantiate the loop graph of ``graph`` (arguments checked by ``graphed_loop``)."""
    source = replay_source(graph)
    device = _driver.ensure_context(source.device)
    for what, arrays in (("inputs", ins), ("outputs", outs), ("steps", (count,) if count is not None else ()),
                         ("until", (until,) if until is not None else ())):
        for a in arrays:
            if a.device != device:
                raise ValueError(f"{what}: an array is on device {a.device}, the step on device {device}")
    dl = native("device_loop")
    kernels = _control_kernels(device)
    step_kernels = dict(source.kernels)
    swap, copies, mode, ping_pong = 0, [], 0, "none"
    if pairs:
        swap, why = 0, "asked for (ping_pong='copy')"
        if swap_allowed:
            swap, why = dl.swap_variant(source.template, [(x.ptr, y.ptr, x.nbytes) for x, y in pairs], step_kernels)
        if swap:
            ping_pong = "swap"
        else:
            ping_pong, mode = f"copy: {why}", 1
            copies = [(x.ptr, y.ptr, x.nbytes) for x, y in pairs]
    own_count = count is None and fixed < 0
    if own_count:
        count = zeros((1,), np.int32)
    remaining, done = zeros((1,), np.int32), zeros((1,), np.int32)
    functions = [node_handles(kernels[name], device)[-1] for name in _KERNEL_NAMES]
    try:
        template, conditionals = dl.build_loop(
            source.template, swap, copies, k, fixed, count.ptr if count is not None else 0,
            until.ptr if until is not None else 0, flag_bytes, remaining.ptr, done.ptr, functions,
            [(x.ptr, y.ptr, x.nbytes) for x, y in pairs], mode)
    finally:
        dl.destroy_graph(swap)  # the loop's child nodes hold their own copies
    loop_graph = _adopt(template, device, source, (count, remaining, done, until, owner, *ins, *outs),
                        step_kernels, kernels, conditionals)
    return BuiltLoop(loop_graph, count, own_count, remaining, done, ping_pong)


def _adopt(template: int, device: int, source: Any, keep: tuple, step_kernels: dict, kernels: dict,
           conditionals: list) -> CUDAGraph:
    """A :class:`CUDAGraph` owning the hand-built ``template`` (``keep_graph=True``), instantiated."""
    g = CUDAGraph(keep_graph=True)
    h = handles_of(g)
    h.device = device
    h.graph = _driver.driver().CUgraph(template)
    control = {}
    for k in kernels.values():
        for handle in node_handles(k, device):
            control[int(handle)] = access_flags(k.params)
    h.inputs = CaptureInputs(keep=(*source.owners, *[a for a in keep if a is not None], *kernels.values()),
                             kernels=tuple({**step_kernels, **control}.items()),
                             conditionals=tuple((node, kind, tuple(bodies)) for node, kind, bodies in conditionals))
    h.state = CaptureState.ENDED
    g.instantiate()
    return g


# ----------------------------------------------------------------------------
# Control kernels (NVRTC, once per process and device)
# ----------------------------------------------------------------------------

_KERNEL_NAMES = ("jaxgraph_loop_init", "jaxgraph_loop_tail", "jaxgraph_loop_guard", "jaxgraph_loop_bits",
                 "jaxgraph_loop_finalize")

# cudaGraphSetConditional is declared here, as <cuda_device_runtime_api.h> declares it (a cudart
# builtin: no device runtime to link), because that header includes crt/ headers that NVIDIA's
# runtime wheel lacks. With NVRTC 13 the cubin is byte-identical to the one built with the header.
CONTROL_SOURCE = r"""
typedef unsigned long long u64;
typedef u64 cudaGraphConditionalHandle;
extern "C" __device__ __attribute__((cudart_builtin)) void cudaGraphSetConditional(cudaGraphConditionalHandle handle,
                                                                                   unsigned int value);

__device__ __forceinline__ int jg_flag(const void* until, int bytes) {
  if (until == 0) return 0;
  return bytes == 1 ? (*(const volatile unsigned char*)until != 0) : (*(const volatile int*)until != 0);
}

// R into `remaining`; `done` = R (no flag: every step will run) or 0; the flag cleared; the WHILE armed.
extern "C" __global__ void jaxgraph_loop_init(int* remaining, int* done, const int* count, int fixed,
                                              void* until, int until_bytes, int unroll, u64 h, int mode) {
  int r = count ? *count : fixed;
  if (r < 0) r = 0;
  const int guarded = mode & 1;
  *remaining = r;
  *done = guarded ? 0 : r;
  if (until) { if (until_bytes == 1) *(unsigned char*)until = 0; else *(int*)until = 0; }
  if (mode & 2) cudaGraphSetConditional((cudaGraphConditionalHandle)h, guarded ? r > 0 : r >= unroll);
}

// End of a trip: another one while a full trip's steps remain (with a flag: while any remain, flag clear).
extern "C" __global__ void jaxgraph_loop_tail(int* remaining, const void* until, int until_bytes, int unroll,
                                              u64 h, int guarded) {
  if (guarded) {
    cudaGraphSetConditional((cudaGraphConditionalHandle)h, *remaining > 0 && !jg_flag(until, until_bytes));
  } else {
    int r = *remaining - unroll;
    *remaining = r;
    cudaGraphSetConditional((cudaGraphConditionalHandle)h, r >= unroll);
  }
}

// Before a guarded step: run it (and count it) only while steps remain and the flag is clear.
extern "C" __global__ void jaxgraph_loop_guard(int* remaining, int* done, const void* until, int until_bytes,
                                               u64 h) {
  int go = *remaining > 0 && !jg_flag(until, until_bytes);
  if (go) { *remaining -= 1; *done += 1; }
  cudaGraphSetConditional((cudaGraphConditionalHandle)h, go);
}

// After the trips (R read on the device): bit b of the remainder opens the IF of 2^b steps.
extern "C" __global__ void jaxgraph_loop_bits(int* remaining, u64 h0, u64 h1, u64 h2, u64 h3, u64 h4, u64 h5,
                                              u64 h6, u64 h7, int nbits) {
  const u64 hs[8] = {h0, h1, h2, h3, h4, h5, h6, h7};
  int r = *remaining;
  *remaining = 0;
  for (int b = 0; b < nbits; ++b) cudaGraphSetConditional((cudaGraphConditionalHandle)hs[b], (r >> b) & 1);
}

// After the loop, both buffers of a fed pair hold the result: mode 0 (ping-pong) copies the newer
// over the older by the parity of the steps run; mode 1 (a copy after each step) only when none ran.
extern "C" __global__ void jaxgraph_loop_finalize(unsigned char* x, unsigned char* y, u64 nbytes,
                                                  const int* done, int mode) {
  int n = *done;
  const unsigned char* src = x;
  unsigned char* dst = y;
  if (mode == 0 && (n & 1)) { src = y; dst = x; }
  if (mode == 1 && n > 0) return;
  u64 stride = (u64)gridDim.x * blockDim.x;
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if ((((u64)src | (u64)dst | nbytes) & 3) == 0) {
    const unsigned* s = (const unsigned*)src;
    unsigned* d = (unsigned*)dst;
    for (u64 w = i; w < nbytes / 4; w += stride) d[w] = s[w];
  } else {
    for (u64 b = i; b < nbytes; b += stride) dst[b] = src[b];
  }
}
"""

_SIGNATURES = {
    "jaxgraph_loop_init": "int* remaining, int* done, const int* count, int fixed, void* until, int until_bytes, "
                          "int unroll, unsigned long long h, int mode",
    "jaxgraph_loop_tail": "int* remaining, const void* until, int until_bytes, int unroll, unsigned long long h, "
                          "int guarded",
    "jaxgraph_loop_guard": "int* remaining, int* done, const void* until, int until_bytes, unsigned long long h",
    "jaxgraph_loop_bits": "int* remaining, " + ", ".join(f"unsigned long long h{b}" for b in range(8)) + ", int nbits",
    "jaxgraph_loop_finalize": "unsigned char* x, unsigned char* y, unsigned long long nbytes, const int* done, "
                              "int mode",
}

_kernels: dict[int, dict[str, Kernel]] = {}
_kernels_lock = threading.Lock()


def control_kernels(arch: str | None = None) -> dict[str, Kernel]:
    """The loop's control kernels compiled (not loaded) for ``arch``; CPU tests compile them this way."""
    # No include path: the source needs no header, so no CUDA toolkit or header wheel either.
    return {name: Kernel(CONTROL_SOURCE, name, {"include_path": []}, signature=_SIGNATURES[name], arch=arch)
            for name in _KERNEL_NAMES}


def _control_kernels(device: int) -> dict[str, Kernel]:
    """The control kernels for ``device``, compiled and loaded once (they live as long as the process)."""
    with _kernels_lock:
        ks = _kernels.get(device)
        if ks is None:
            ks = _kernels[device] = control_kernels()
            for k in ks.values():
                k.handle  # load now, in this device's context
        return ks
