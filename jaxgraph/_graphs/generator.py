"""Random numbers that CUDA graphs can replay: :class:`Generator` (Philox-4x32-10).

A generator's state, ``[seed, offset]``, lives in device memory. Each draw
reads it on the device and then a one-thread kernel adds 1 to the offset, on
the same stream. Captured into a graph, both kernels replay, so every replay
draws fresh numbers, exactly the sequence eager draws with the same seed
would give, and the generator stays usable eagerly and in other graphs.

Draw ``k`` (offset ``k``) fills element ``i`` from the Philox-4x32-10 block
with counter ``(i // 4, k)`` (two 64-bit halves) and key ``seed``, word
``i % 4``. Your own kernels reach the same numbers through
:attr:`Generator.CUDA_HEADER`.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from .._cuda import capture_registry as _captures, driver as _driver
from .._cuda.array import DeviceArray, asarray, empty, to_host
from .._cuda.stream import current_stream

__all__ = ["Generator"]

_BLOCK = 256  # threads per block of the built-in draw kernels

_HEADER = r"""
// jaxgraph Philox-4x32-10 (Salmon et al., SC'11): counter-based, so any element
// of any draw is computed independently. state = {seed, offset} in device memory.
#ifndef JAXGRAPH_PHILOX_H
#define JAXGRAPH_PHILOX_H

__device__ __forceinline__ uint4 jaxgraph_philox4x32_10(uint4 ctr, uint2 key) {
  #pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) { key.x += 0x9E3779B9u; key.y += 0xBB67AE85u; }
    const unsigned int hi0 = __umulhi(0xD2511F53u, ctr.x), lo0 = 0xD2511F53u * ctr.x;
    const unsigned int hi1 = __umulhi(0xCD9E8D57u, ctr.z), lo1 = 0xCD9E8D57u * ctr.z;
    ctr = make_uint4(hi1 ^ ctr.y ^ key.x, lo1, hi0 ^ ctr.w ^ key.y, lo0);
  }
  return ctr;
}

// The four 32-bit words of block `block` of the current draw.
__device__ __forceinline__ uint4 jaxgraph_philox_block(const unsigned long long* state,
                                                       unsigned long long block) {
  const unsigned long long seed = state[0], offset = state[1];
  return jaxgraph_philox4x32_10(
      make_uint4((unsigned int)block, (unsigned int)(block >> 32),
                 (unsigned int)offset, (unsigned int)(offset >> 32)),
      make_uint2((unsigned int)seed, (unsigned int)(seed >> 32)));
}

__device__ __forceinline__ unsigned int jaxgraph_philox_word(uint4 r, unsigned int c) {
  return c == 0 ? r.x : c == 1 ? r.y : c == 2 ? r.z : r.w;
}

// 24 random bits -> [0, 1), exactly representable in float.
__device__ __forceinline__ float jaxgraph_u32_to_uniform(unsigned int u) {
  return (float)(u >> 8) * 5.9604644775390625e-08f;
}

// Element `idx` of the current draw, uniform in [0, 1).
__device__ __forceinline__ float jaxgraph_philox_uniform(const unsigned long long* state,
                                                         unsigned long long idx) {
  return jaxgraph_u32_to_uniform(jaxgraph_philox_word(jaxgraph_philox_block(state, idx >> 2),
                                                      (unsigned int)(idx & 3)));
}

// Element `idx` of the current draw, standard normal (Box-Muller on words 2p, 2p+1).
__device__ __forceinline__ float jaxgraph_philox_normal(const unsigned long long* state,
                                                        unsigned long long idx) {
  const uint4 r = jaxgraph_philox_block(state, idx >> 2);
  const unsigned int c = (unsigned int)(idx & 3), pair = c >> 1;
  const unsigned int a = pair ? r.z : r.x, b = pair ? r.w : r.y;
  const float u1 = (float)((a >> 8) + 1u) * 5.9604644775390625e-08f;  // (0, 1]: log is finite
  const float u2 = (float)(b >> 8) * 5.9604644775390625e-08f;
  const float radius = sqrtf(-2.0f * logf(u1));
  float s, co;
  sincospif(2.0f * u2, &s, &co);
  return radius * ((c & 1) ? s : co);
}

#endif  // JAXGRAPH_PHILOX_H
"""

_KERNELS_SOURCE = _HEADER + r"""
extern "C" __global__ void jaxgraph_philox_fill_uniform(float* out, const unsigned long long* state,
                                                        unsigned long long n, float low, float high) {
  const unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = low + (high - low) * jaxgraph_philox_uniform(state, i);
}

extern "C" __global__ void jaxgraph_philox_fill_normal(float* out, const unsigned long long* state,
                                                       unsigned long long n, float mean, float stddev) {
  const unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = mean + stddev * jaxgraph_philox_normal(state, i);
}

extern "C" __global__ void jaxgraph_philox_advance(unsigned long long* state, unsigned long long draws) {
  if (blockIdx.x == 0 && threadIdx.x == 0) state[1] += draws;
}
"""


# ----------------------------------------------------------------------------
# Generator
# ----------------------------------------------------------------------------


class Generator:
    """A Philox-4x32-10 random number generator whose state lives on the device.

    Draws (:meth:`uniform`, :meth:`normal`) run on the current stream and
    advance the offset *on the device*, so a captured draw gives new numbers
    at every replay: N replays of a graph that draws once produce the same
    numbers as N eager draws from a generator with the same seed. Register
    generators used in a capture with :meth:`CUDAGraph.register_generator_state`.

    Parameters
    ----------
    seed : int
        Initial seed, 0 to 2**64 - 1.
    device : int, optional
        Device ordinal; default: the current device.

    Attributes
    ----------
    CUDA_HEADER : str
        CUDA C++ defining ``jaxgraph_philox_uniform(state, idx)``,
        ``jaxgraph_philox_normal(state, idx)`` and ``jaxgraph_philox_block``
        for your own kernels: prepend it to the source, pass
        :attr:`state` as a ``const unsigned long long*`` argument, then call
        :meth:`advance` so the next draw differs.

    Examples
    --------
    >>> gen = jaxgraph.Generator(seed=1234)
    >>> noise = jaxgraph.empty(4096)
    >>> g = jaxgraph.CUDAGraph()
    >>> g.register_generator_state(gen)
    >>> with jaxgraph.graph(g):
    ...     gen.normal(noise)
    >>> g.replay()        # fresh noise at every replay
    """

    CUDA_HEADER = _HEADER

    def __init__(self, seed: int = 0, device: int | None = None):
        seed = _check_seed(seed)
        self._device = _driver.ensure_context(device)
        self._check_not_capturing("create a Generator")
        # Load the draw kernels now: a first use inside a capture would load a library there.
        for name in ("jaxgraph_philox_fill_uniform", "jaxgraph_philox_fill_normal", "jaxgraph_philox_advance"):
            _kernel(name, self._device).handle
        self._state = empty(2, np.uint64, stream=current_stream(self._device))
        self._seed = seed
        self._write(seed, 0)

    def __repr__(self) -> str:
        return f"<jaxgraph.Generator seed={self._seed} device={self._device}>"

    @property
    def device(self) -> int:
        """The device holding the state."""
        return self._device

    @property
    def state(self) -> DeviceArray:
        """The device array ``[seed, offset]`` (2 x uint64) that draw kernels read."""
        return self._state

    # -- seeding and offsets ---------------------------------------------------

    def manual_seed(self, seed: int) -> "Generator":
        """Set the seed and rewind the offset to 0; returns the generator."""
        seed = _check_seed(seed)
        self._check_not_capturing("manual_seed")
        self._write(seed, 0)
        self._seed = seed
        return self

    def seed(self) -> int:
        """Seed from the operating system's entropy (offset 0) and return the seed."""
        seed = int.from_bytes(os.urandom(8), "little") >> 1
        self.manual_seed(seed)
        return seed

    def initial_seed(self) -> int:
        """The seed set at construction or by the last :meth:`manual_seed` / :meth:`seed`."""
        return self._seed

    def get_offset(self) -> int:
        """The number of draws so far (read from the device; waits for the current stream)."""
        self._check_not_capturing("get_offset")
        return int(to_host(self._state, stream=current_stream(self._device))[1])

    def set_offset(self, offset: int) -> "Generator":
        """Continue the sequence from draw ``offset``; returns the generator."""
        offset = _check_seed(offset, "offset")
        self._check_not_capturing("set_offset")
        self._write(self._seed, offset)
        return self

    def get_state(self) -> np.ndarray:
        """A host copy of the state ``[seed, offset]`` (uint64), for :meth:`set_state`."""
        self._check_not_capturing("get_state")
        return to_host(self._state, stream=current_stream(self._device))

    def set_state(self, state: Any) -> "Generator":
        """Restore a state from :meth:`get_state`; returns the generator."""
        values = np.asarray(state, dtype=np.uint64).reshape(-1)
        if values.size != 2:
            raise ValueError(f"set_state expects [seed, offset], got {values.size} values")
        self._check_not_capturing("set_state")
        self._write(int(values[0]), int(values[1]))
        self._seed = int(values[0])
        return self

    # -- drawing ----------------------------------------------------------------

    def uniform(self, out: Any, low: float = 0.0, high: float = 1.0) -> Any:
        """Fill float32 ``out`` with uniform numbers in ``[low, high)``; advance the offset.

        Runs on the current stream (and is captured when it captures).
        """
        self._draw("jaxgraph_philox_fill_uniform", out, float(low), float(high))
        return out

    def normal(self, out: Any, mean: float = 0.0, std: float = 1.0) -> Any:
        """Fill float32 ``out`` with normal numbers (``mean``, ``std``); advance the offset."""
        self._draw("jaxgraph_philox_fill_normal", out, float(mean), float(std))
        return out

    def advance(self, draws: int = 1) -> None:
        """Add ``draws`` to the offset on the device, on the current stream.

        Call it after your own kernel that drew through :attr:`CUDA_HEADER`.
        """
        draws = _check_seed(draws, "draws")
        stream = current_stream(self._device)
        _kernel("jaxgraph_philox_advance", self._device)[1, 1, 0, stream](self._state, draws)

    # -- internals --------------------------------------------------------------

    def _draw(self, kernel: str, out: Any, a: float, b: float) -> None:
        array = asarray(out)
        if array.dtype != np.float32:
            raise TypeError(f"Generator draws fill float32 arrays, got {array.dtype}")
        if array.device != self._device:
            raise ValueError(f"out is on device {array.device}, the generator on device {self._device}")
        n = array.size
        if n == 0:
            return
        stream = current_stream(self._device)
        _kernel(kernel, self._device)[math.ceil(n / _BLOCK), _BLOCK, 0, stream](array, self._state, n, a, b)
        self.advance(1)

    def _write(self, seed: int, offset: int) -> None:
        self._state.copy_(np.array([seed, offset], dtype=np.uint64), stream=current_stream(self._device))

    def _check_not_capturing(self, what: str) -> None:
        if _captures.capture_on(current_stream(self._device)) is not None:
            raise RuntimeError(f"cannot {what} while the current stream is capturing a graph: it reads "
                               "or writes the state from the host; do it before or after the capture")


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------

_kernels: dict[tuple[str, int], Any] = {}


def _kernel(name: str, device: int) -> Any:
    """The built-in kernel ``name``, compiled once per device."""
    from .._kernels.kernel import Kernel

    key = (name, device)
    k = _kernels.get(key)
    if k is None:
        major, minor = _driver.compute_capability(device)
        k = _kernels[key] = Kernel(_KERNELS_SOURCE, name, arch=f"sm_{major}{minor}")
    return k


def _check_seed(value: Any, what: str = "seed") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    value = int(value)
    if not 0 <= value < 2**64:
        raise ValueError(f"{what} must be in [0, 2**64), got {value}")
    return value
