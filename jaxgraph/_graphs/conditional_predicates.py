"""Predicates of conditional nodes: the checks, the kernel that hands them to CUDA, the CUDA they need.

A region's predicate (a SWITCH's index) is a one-element device array. Just
before the conditional node, and at the end of each trip of a WHILE body, a
one-thread kernel reads it and calls ``cudaGraphSetConditional`` on the node's
handle (:func:`setter`), so the device decides, never the host. IF and WHILE
nodes need CUDA 12.4, IF/ELSE and SWITCH 12.8 (:func:`check_support`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

import numpy as np

from .._cuda import driver as _driver
from .._cuda.array import DeviceArray, asarray
from .._cuda.driver import check
from .._kernels.load import node_handles

__all__ = ["KINDS", "Kind", "SET_CONDITIONAL_SOURCE", "check_predicate", "check_support", "driver_version",
           "relaxed", "setter", "setter_name"]

# cudaGraphSetConditional is declared as <cuda_device_runtime_api.h> declares it (a
# device-runtime builtin; cudaGraphConditionalHandle is unsigned long long), which gives
# the same PTX as including the header (tests/graphs/test_conditional_errors.py compares them).
# The header is not included because it needs crt/host_defines.h, which NVIDIA's
# nvidia-cuda-runtime wheel lacks: this way the kernel compiles with no CUDA headers at all.
SET_CONDITIONAL_SOURCE = r"""
extern "C" __device__ __attribute__((cudart_builtin)) void cudaGraphSetConditional(unsigned long long handle,
                                                                                 unsigned int value);

// Sets a conditional node's value from a one-element device array. Launched with
// one thread just before the node (and at the end of a WHILE body).
extern "C" __global__ void jaxgraph_set_conditional_int32(unsigned long long handle, const int* value) {
  cudaGraphSetConditional(handle, (unsigned int)*value);
}
extern "C" __global__ void jaxgraph_set_conditional_bool(unsigned long long handle, const bool* value) {
  cudaGraphSetConditional(handle, *value ? 1u : 0u);
}
"""


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of region: its name in messages, its CUDA node type, and the CUDA it needs."""

    label: str        # "IF/ELSE"
    node_type: str    # suffix of CU_GRAPH_COND_TYPE_*: "IF", "WHILE", "SWITCH"
    min_cuda: int     # cuDriverGetVersion encoding: 12040 is CUDA 12.4
    predicate: tuple  # accepted dtypes


KINDS = {
    "if": Kind("IF", "IF", 12040, ("bool", "int32")),
    "if_else": Kind("IF/ELSE", "IF", 12080, ("bool", "int32")),
    "while": Kind("WHILE", "WHILE", 12040, ("bool", "int32")),
    "switch": Kind("SWITCH", "SWITCH", 12080, ("int32",)),
}


# ----------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------


def check_predicate(value: Any, what: str, dtypes: tuple = ("bool", "int32")) -> DeviceArray:
    """``value`` as a one-element device array of one of ``dtypes``, or a clear error (no driver call for bad input)."""
    allowed = " or ".join(dtypes)
    if not isinstance(value, DeviceArray):
        if isinstance(value, (np.ndarray, np.generic, bool, int, float, list, tuple)):
            raise TypeError(f"{what} must be a one-element {allowed} device array, got host data "
                            f"({type(value).__name__}): the device reads it at every replay, so copy it to "
                            "the GPU before the capture, e.g. jaxgraph.asarray(np.array([1], np.int32))")
        if not hasattr(value, "__cuda_array_interface__"):
            raise TypeError(f"{what} must be a one-element {allowed} device array (jaxgraph.DeviceArray, or a "
                            f"jax.Array on the GPU, CuPy or torch CUDA array), got {type(value).__name__}")
        value = asarray(value)
    if value.size != 1:
        raise ValueError(f"{what} must have exactly one element, got shape {value.shape}")
    if value.dtype.name not in dtypes:
        raise TypeError(f"{what} must be {'an' if allowed[0] in 'aeiou' else 'a'} {allowed} array, got {value.dtype}")
    return value


def driver_version() -> int:
    """``cuDriverGetVersion()``: 13000 for a CUDA 13.0 driver."""
    return int(_driver.call("cuDriverGetVersion"))


def check_support(kind_name: str) -> None:
    """Raise ``RuntimeError`` unless the driver and NVRTC support ``kind_name`` regions.

    IF and WHILE nodes need CUDA 12.4, IF/ELSE and SWITCH 12.8 (driver R570).
    """
    from .._kernels.compile import nvrtc_version

    kind = KINDS[kind_name]
    need = _version_text(kind.min_cuda)
    have = driver_version()
    if have < kind.min_cuda:
        raise RuntimeError(
            f"{kind.label} regions need a CUDA {need} driver or newer (conditional nodes), but this driver "
            f"supports CUDA {_version_text(have)} (cuDriverGetVersion() = {have}); update the NVIDIA driver "
            f"({'R570' if kind.min_cuda >= 12080 else 'R550'} or newer)")
    major, minor = nvrtc_version()
    if major * 1000 + minor * 10 < kind.min_cuda:
        raise RuntimeError(
            f"{kind.label} regions need NVRTC {need} or newer to compile the kernel that sets the condition "
            f"(cudaGraphSetConditional), but NVRTC is {major}.{minor}; pip install -U nvidia-cuda-nvrtc")


def setter_name(dtype: Any) -> str:
    """The set-conditional kernel for a predicate of ``dtype`` (bool or int32)."""
    return f"jaxgraph_set_conditional_{np.dtype(dtype).name}"


# ----------------------------------------------------------------------------
# The set-condition kernel
# ----------------------------------------------------------------------------


_setters: dict[tuple[str, int], Any] = {}


def setter(pred: DeviceArray, device: int) -> Any:
    """The set-conditional kernel for ``pred``'s dtype, compiled once and loaded in ``device``'s context."""
    from .._kernels.kernel import Kernel

    name = setter_name(pred.dtype)
    kernel = _setters.get((name, device))
    if kernel is None:
        major, minor = _driver.compute_capability(device)
        kernel = Kernel(SET_CONDITIONAL_SOURCE, name, arch=f"sm_{major}{minor}")
        with relaxed():  # loading a library may synchronize: not while the capture checks
            kernel.handle
            node_handles(kernel, device)
        _setters[(name, device)] = kernel
    return kernel


@contextlib.contextmanager
def relaxed() -> Iterator[None]:
    """This thread's capture mode relaxed for calls that may be unsafe under capture (loading, stream creation)."""
    drv = _driver.driver()
    mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    previous = check(drv.cuThreadExchangeStreamCaptureMode(mode), "cuThreadExchangeStreamCaptureMode")
    try:
        yield
    finally:
        check(drv.cuThreadExchangeStreamCaptureMode(previous), "cuThreadExchangeStreamCaptureMode")


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _version_text(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"
