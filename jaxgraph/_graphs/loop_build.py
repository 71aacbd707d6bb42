"""How a graphed loop is built: the loop graph, its control kernels, its adoption as a CUDAGraph.

:func:`build` finds the step's swapped twin (``swap_variant``) or falls back
to a copy after each step, has ``ffi/device_loop/device_loop.cc`` build the graph node by
node from the step's template and the control kernels compiled here, and
wraps the result in a :class:`~jaxgraph.CUDAGraph` (``keep_graph=True``) that
holds everything the graph's nodes point at. ``_jax_interop/graphed_loops.py`` is the API.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .._cuda import driver as _driver
from .._cuda.array import DeviceArray, asarray, zeros
from .._cuda.capture_registry import CaptureInputs
from .._cuda.stream import current_stream
from .handles import CaptureState, node_count
from .cuda_graph import CUDAGraph, handles_of, replay_source
from .._kernels.kernel import Kernel
from .._kernels.kernel_sets import KernelSets
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
    pdl: bool = False           # the exact stop's one-kernel step inlined, its check launched early
    snapshot: DeviceArray | None = None  # the speculative exact stop's copy of what a step may write


# The exact stop (until=, check_every=1) of a step with one fed pair of at most this many bytes: a trip
# is `A ; check` and the check kernel also copies y -> x (no twin, no IF). Else, with the swapped twin,
# `A ; check ; IF(g) { B ; check }`. On an H100, a 16 KiB pair: 4.63 us per step over the unrolled
# floor against 5.21 with the twin (benchmarks/probes/stop_probe.py); the cutoff is an estimate of where the
# copy's traffic (2 x 256 KiB, ~0.3 us at HBM speed) still costs less than the twin's IF.
FUSED_COPY_BYTES = 256 * 1024
# Which exact stops of a one-kernel step add the kernel as a node of the trip (not a child graph) and
# launch the check after it through a programmatic edge (sm_90+: griddepcontrol.wait): on an H100 it
# helped the copying check (4.63 against 4.80 us over the floor) and hurt the one-thread ones (in place
# 4.77 against 4.45, twin 5.56 against 5.21: benchmarks/probes/stop_probe.py).
PDL_CHECKS = frozenset({"fused"})
# Whether the speculative exact stop adds a one-kernel step as that kernel's node and launches its
# watch through a programmatic edge (sm_90+), so the watch's launch overlaps the step.
PDL_WATCH = True


def step_nodes(graph: CUDAGraph) -> int:
    """Top-level nodes of the step's graph (what the default unroll is sized by)."""
    source = replay_source(graph)
    _driver.ensure_context(source.device)
    return node_count(_driver.driver().CUgraph(source.template))


def build(graph: CUDAGraph, owner: Any, ins: tuple, outs: tuple, pairs: list, fixed: int,
          count: DeviceArray | None, until: DeviceArray | None, flag_bytes: int, k: int,
          swap_allowed: bool = True, preserve: tuple | None = None) -> BuiltLoop:
    """Build, adopt and instantiate the loop graph of ``graph`` (arguments checked by ``graphed_loop``).

    ``preserve`` (with ``until``): the arrays a step may write, for the speculative exact stop
    (K unguarded steps a trip behind their snapshot); ``None`` for the other layouts.
    """
    source = replay_source(graph)
    # The step's device current throughout: the counters, the snapshot and its table are allocated
    # there, and the native build reads the current context for its memcpy and conditional nodes.
    with _driver.device_current(source.device):
        return _build_on(source, owner, ins, outs, pairs, fixed, count, until, flag_bytes, k, swap_allowed,
                         preserve)


def _build_on(source: Any, owner: Any, ins: tuple, outs: tuple, pairs: list, fixed: int,
              count: DeviceArray | None, until: DeviceArray | None, flag_bytes: int, k: int,
              swap_allowed: bool, preserve: tuple | None) -> BuiltLoop:
    """:func:`build`, with the step's device current."""
    device = _driver.ensure_context(source.device)
    for what, arrays in (("inputs", ins), ("outputs", outs), ("steps", (count,) if count is not None else ()),
                         ("until", (until,) if until is not None else ()), ("preserve", preserve or ())):
        for a in arrays:
            if a.device != device:
                raise ValueError(f"{what}: an array is on device {a.device}, the step on device {device}")
    dl = native("device_loop")
    kernels = _CONTROL.on(device)
    step_kernels = dict(source.kernels)
    swap, copies, mode, ping_pong, fused = 0, [], 0, "none", (0, 0, 0)
    speculative = preserve is not None
    exact = until is not None and k == 1 and not speculative
    kind = "in_place"  # of the exact stop: "fused", "twin", "in_place" (or memcpy nodes: "copy")
    if pairs and swap_allowed and exact and len(pairs) == 1 and pairs[0][0].nbytes <= FUSED_COPY_BYTES:
        # The exact stop's check kernel copies the one fed pair itself: no twin, no IF, no memcpy node.
        (x, y), = pairs
        fused, mode, kind = (x.ptr, y.ptr, x.nbytes), 1, "fused"
        ping_pong = "copy: by the stop check (exact stop)"
    elif pairs:
        swap, why = 0, "asked for (ping_pong='copy')"
        if swap_allowed:
            swap, why = dl.swap_variant(source.template, [(x.ptr, y.ptr, x.nbytes) for x, y in pairs], step_kernels)
        if swap and (k % 2 == 0 or not speculative):
            ping_pong, kind = "swap", "twin"
        else:
            if swap:  # a speculative trip of odd K cannot alternate; graphed_loop keeps K even with feed
                dl.destroy_graph(swap)
                swap, why = 0, f"an odd number of steps a trip ({k})"
            ping_pong, mode, kind = f"copy: {why}", 1, "copy"
            copies = [(x.ptr, y.ptr, x.nbytes) for x, y in pairs]
    own_count = count is None and fixed < 0
    # The counters live on the step's device, whichever device is current (the loop's kernels read them there).
    on_step = current_stream(device)
    if own_count:
        count = zeros((1,), np.int32, stream=on_step)
    remaining, done = zeros((1,), np.int32, stream=on_step), zeros((1,), np.int32, stream=on_step)
    functions = [node_handles(kernels[name], device)[-1] for name in _KERNEL_NAMES]
    watch = table = snapshot = None
    spec = (0, 0, 0, 0)
    if speculative:  # [seen0, seen1, stopped] for the watch kernels, and the snapshot of what a step writes
        watch, (snapshot, table, total) = zeros((3,), np.int32), _snapshot_table(preserve)
        spec = (watch.ptr, table.ptr, len(preserve), total)
    keep = (count, remaining, done, until, owner, *ins, *outs, watch, table, snapshot, *(preserve or ()))

    def attempt(pdl: bool) -> CUDAGraph:
        _driver.ensure_context(device)  # loading the control kernels may have switched it
        template, conditionals = dl.build_loop(
            source.template, swap, copies, k, fixed, count.ptr if count is not None else 0,
            until.ptr if until is not None else 0, flag_bytes, remaining.ptr, done.ptr, functions,
            [(x.ptr, y.ptr, x.nbytes) for x, y in pairs], mode, fused, pdl, spec)
        return _adopt(template, device, source, keep, step_kernels, kernels, conditionals)

    pdl = (exact and kind in PDL_CHECKS or speculative and PDL_WATCH) and _pdl_arch(device)
    try:
        try:
            loop_graph = attempt(pdl)
        except RuntimeError:  # CudaError too: a driver that refuses the programmatic edge gets the plain one
            if not pdl:
                raise
            pdl = False
            loop_graph = attempt(False)
    finally:
        dl.destroy_graph(swap)  # the loop's child nodes hold their own copies
    return BuiltLoop(loop_graph, count, own_count, remaining, done, ping_pong, pdl, snapshot)


def _snapshot_table(arrays: tuple) -> tuple[DeviceArray, DeviceArray, int]:
    """One buffer holding a copy slot per array (16-byte aligned), and the (live, copy, bytes) table."""
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += -(-a.nbytes // 16) * 16
    snapshot = zeros((max(total, 16),), np.uint8)
    rows = [(a.ptr, snapshot.ptr + at, a.nbytes) for a, at in zip(arrays, offsets)]
    table = asarray(np.array(rows, np.uint64).reshape(-1))
    current_stream().synchronize()  # the table is read by launches on any stream, XLA's included
    return snapshot, table, total


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

_KERNEL_NAMES = ("jaxgraph_loop_init", "jaxgraph_loop_tail", "jaxgraph_loop_bits", "jaxgraph_loop_finalize",
                 "jaxgraph_loop_spec_init", "jaxgraph_loop_watch", "jaxgraph_loop_spec_tail", "jaxgraph_loop_restore")

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

// A word per thread where the addresses allow, else a byte per thread (grid-stride).
__device__ __forceinline__ void jg_copy(unsigned char* dst, const unsigned char* src, u64 nbytes) {
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

// R into `remaining`; `done` = R (no flag: every step will run) or 0 (counted as they run); the
// flag cleared; the WHILE armed for a first trip of `unroll` steps.
extern "C" __global__ void jaxgraph_loop_init(int* remaining, int* done, const int* count, int fixed,
                                              void* until, int until_bytes, int unroll, u64 h, int mode) {
  int r = count ? *count : fixed;
  if (r < 0) r = 0;
  *remaining = r;
  *done = (mode & 1) ? 0 : r;
  if (until) { if (until_bytes == 1) *(unsigned char*)until = 0; else *(int*)until = 0; }
  if (mode & 2) cudaGraphSetConditional((cudaGraphConditionalHandle)h, r >= unroll);
}

// After `unroll` steps of a trip: count them (with a flag) and re-arm h while a full trip remains and
// the flag is clear (unroll 0: only that test). With g, the head of an exact pair (A ; tail ; IF(g)
// { B ... }): g opens the twin B only while a step remains and the flag is clear, and B is counted
// here, as it is opened. With nbytes, the grid also copies src -> dst (the exact stop's fused feed).
extern "C" __global__ void jaxgraph_loop_tail(int* remaining, int* done, const void* until, int until_bytes,
                                              int unroll, u64 h, u64 g, unsigned char* dst,
                                              const unsigned char* src, u64 nbytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");  // launched early (programmatic edge): the step first
#endif
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const int stop = jg_flag(until, until_bytes);
    int r = *remaining - unroll;
    int ran = unroll;
    if (g) {
      int go = r >= 1 && !stop;
      r -= go;
      ran += go;
      cudaGraphSetConditional((cudaGraphConditionalHandle)g, go);
      cudaGraphSetConditional((cudaGraphConditionalHandle)h, go);  // B's tail re-arms it
    } else {
      cudaGraphSetConditional((cudaGraphConditionalHandle)h, r >= (unroll > 1 ? unroll : 1) && !stop);
    }
    *remaining = r;
    if (until) *done += ran;
  }
  if (nbytes) jg_copy(dst, src, nbytes);
}

// After the trips: bit b of the steps left opens the IF of 2^b steps (handles 0 stand for no IF).
// With a flag, none once it is set, and the steps opened are counted.
extern "C" __global__ void jaxgraph_loop_bits(int* remaining, int* done, const void* until, int until_bytes,
                                              u64 h0, u64 h1, u64 h2, u64 h3, u64 h4, u64 h5, u64 h6, u64 h7,
                                              int nbits) {
  const u64 hs[8] = {h0, h1, h2, h3, h4, h5, h6, h7};
  int r = *remaining;
  *remaining = 0;
  if (until) {
    if (r < 0 || jg_flag(until, until_bytes)) r = 0;
    *done += r;
  }
  for (int b = 0; b < nbits; ++b) {
    if (hs[b]) cudaGraphSetConditional((cudaGraphConditionalHandle)hs[b], (r >> b) & 1);
  }
}

// After the loop, both buffers of a fed pair hold the result: mode 0 (ping-pong) copies the newer
// over the older by the parity of the steps run; mode 1 (a copy after each step) only when none ran;
extern "C" __global__ void jaxgraph_loop_finalize(unsigned char* x, unsigned char* y, u64 nbytes,
                                                  const int* done, int mode) {
  int n = *done;
  if (mode == 1 && n > 0) return;
  if (mode == 0 && (n & 1)) jg_copy(x, y, nbytes);
  else jg_copy(y, x, nbytes);
}

// The speculative exact stop (see ffi/device_loop/device_loop.cc). `spec` holds int32 [seen0, seen1, stopped]:
// seen[i & 1] says whether a watch before watch i saw the flag, stopped the steps run up to and with
// the step that set it (0: none did).
// init: R into `remaining`, nothing run or seen, the flag cleared; h (the fast WHILE of `unroll`
// unguarded steps a trip, each followed by its watch) armed for R >= unroll, s (the slow WHILE, a step
// a trip) for the 0 < R < unroll steps that fill no fast trip.
extern "C" __global__ void jaxgraph_loop_spec_init(int* remaining, int* done, int* spec, const int* count,
                                                   int fixed, void* until, int until_bytes, int unroll, u64 h,
                                                   u64 s) {
  int r = count ? *count : fixed;
  if (r < 0) r = 0;
  *remaining = r;
  *done = 0;
  spec[0] = spec[1] = spec[2] = 0;
  if (until_bytes == 1) *(unsigned char*)until = 0; else *(int*)until = 0;
  cudaGraphSetConditional((cudaGraphConditionalHandle)h, r >= unroll);
  cudaGraphSetConditional((cudaGraphConditionalHandle)s, r > 0 && r < unroll);
}

// After step `index` (0-based) of a fast trip: if the flag is set and no earlier watch saw it, this
// step set it: save what a step may write (`table`: n (live, copy, bytes) triples) and the steps run.
// Launched early after a one-kernel step (a programmatic edge): griddepcontrol.wait waits for it.
extern "C" __global__ void jaxgraph_loop_watch(const u64* table, int n, const void* until, int until_bytes,
                                               int* spec, int slot, const int* done, int index) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  const int seen = spec[slot];
  const int flag = jg_flag(until, until_bytes);
  if (flag && !seen) {
    for (int e = 0; e < n; ++e) {
      jg_copy((unsigned char*)table[3 * e + 1], (const unsigned char*)table[3 * e], table[3 * e + 2]);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) spec[2] = *done + index + 1;
  }
  // The next watch reads the other slot: no block of this one reads what thread 0 writes.
  if (blockIdx.x == 0 && threadIdx.x == 0) spec[slot ^ 1] = seen | flag;
}

// After a fast trip's `unroll` steps and watches (the last wrote spec[slot]). Nothing seen: count
// them, re-arm h while a full trip remains, else open s for the steps left. Seen: the steps run are
// those up to the one that set the flag, and both WHILEs end.
extern "C" __global__ void jaxgraph_loop_spec_tail(int* remaining, int* done, const int* spec, int slot,
                                                   int unroll, u64 h, u64 s) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  if (spec[slot]) {
    *done = spec[2];
    cudaGraphSetConditional((cudaGraphConditionalHandle)h, 0);
    cudaGraphSetConditional((cudaGraphConditionalHandle)s, 0);
    return;
  }
  const int r = *remaining - unroll;
  *remaining = r;
  *done += unroll;
  cudaGraphSetConditional((cudaGraphConditionalHandle)h, r >= unroll);
  cudaGraphSetConditional((cudaGraphConditionalHandle)s, r > 0 && r < unroll);
}

// After the fast WHILE, when a watch saved the stopping step's state: put it back (copy -> live).
extern "C" __global__ void jaxgraph_loop_restore(const u64* table, int n, const int* spec) {
  if (spec[2] == 0) return;
  for (int e = 0; e < n; ++e) {
    jg_copy((unsigned char*)table[3 * e], (const unsigned char*)table[3 * e + 1], table[3 * e + 2]);
  }
}
"""

_SIGNATURES = {
    "jaxgraph_loop_init": "int* remaining, int* done, const int* count, int fixed, void* until, int until_bytes, "
                          "int unroll, unsigned long long h, int mode",
    "jaxgraph_loop_tail": "int* remaining, int* done, const void* until, int until_bytes, int unroll, "
                          "unsigned long long h, unsigned long long g, unsigned char* dst, const unsigned char* src, "
                          "unsigned long long nbytes",
    "jaxgraph_loop_bits": "int* remaining, int* done, const void* until, int until_bytes, "
                          + ", ".join(f"unsigned long long h{b}" for b in range(8)) + ", int nbits",
    "jaxgraph_loop_finalize": "unsigned char* x, unsigned char* y, unsigned long long nbytes, const int* done, "
                              "int mode",
    "jaxgraph_loop_spec_init": "int* remaining, int* done, int* spec, const int* count, int fixed, void* until, "
                               "int until_bytes, int unroll, unsigned long long h, unsigned long long s",
    "jaxgraph_loop_watch": "const unsigned long long* table, int n, const void* until, int until_bytes, int* spec, "
                           "int slot, const int* done, int index",
    "jaxgraph_loop_spec_tail": "int* remaining, int* done, const int* spec, int slot, int unroll, "
                               "unsigned long long h, unsigned long long s",
    "jaxgraph_loop_restore": "const unsigned long long* table, int n, const int* spec",
}



def control_kernels(arch: str | None = None) -> dict[str, Kernel]:
    """The loop's control kernels compiled (not loaded) for ``arch``; CPU tests compile them this way."""
    # No include path: the source needs no header, so no CUDA toolkit or header wheel either.
    return {name: Kernel(CONTROL_SOURCE, name, {"include_path": []}, signature=_SIGNATURES[name], arch=arch)
            for name in _KERNEL_NAMES}


_CONTROL = KernelSets(control_kernels)  # compiled for the step's device, loaded once


def _pdl_arch(device: int) -> bool:
    """Programmatic dependent launch needs compute capability 9.0 (griddepcontrol)."""
    return _driver.compute_capability(device) >= (9, 0)
