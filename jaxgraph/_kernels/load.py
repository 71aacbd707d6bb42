"""Loading a compiled kernel: its CUlibrary, its CUkernel and per-device CUfunctions, its shared-memory limit.

:class:`KernelLoading` is the part of :class:`~jaxgraph.Kernel` that talks to
the driver about the loaded code rather than about a launch: it loads the cubin
once per process (through cuda.core's ``ObjectCode``), checks the parameter
sizes the driver reports, names the handles a graph node launching the kernel
may carry, and raises the kernel's dynamic shared-memory limit when a launch
asks for more than the default 48 KiB. :func:`node_handles` and
:func:`reserve_shared_memory` give the rest of jaxgraph (graphed loops,
conditional nodes, ``jax_call``) what it needs of a loaded kernel.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from .._cuda import driver as _driver
from .compile import CompiledKernel, remember_display_name
from .._cuda.driver import check
from .._cuda.native import native
from .cubin import check_param_sizes
from .signature import Param

__all__ = ["DEFAULT_SHARED_LIMIT", "KernelLoading", "node_handles", "reserve_shared_memory"]

DEFAULT_SHARED_LIMIT = 48 * 1024  # dynamic shared memory a kernel may use without raising its limit


# ----------------------------------------------------------------------------
# KernelLoading
# ----------------------------------------------------------------------------


class KernelLoading:
    """Loading and per-device handles of :class:`~jaxgraph.Kernel` (which owns the attributes below)."""

    name: str
    params: tuple[Param, ...]
    _compiled: CompiledKernel
    _signature_origin: str
    _lock: threading.Lock
    _library: Any
    _core: Any
    _h_kernel: Any
    _function_address: int
    _native_launch: Callable[..., int] | None
    _shared_limit: int
    _functions: dict[int, int]

    def _load(self) -> Any:
        """Load the cubin unless another thread did; return the handle."""
        with self._lock:
            return self._h_kernel if self._h_kernel is not None else self._load_locked()

    def _load_locked(self) -> Any:
        """Load the cubin (once per process); the caller holds ``self._lock``."""
        from cuda.core import ObjectCode

        _driver.ensure_context()
        c = self._compiled
        library = ObjectCode.from_cubin(c.cubin, symbol_mapping={c.name: c.lowered_name.encode()})
        core = library.get_kernel(c.name)
        check_param_sizes(self.name, self.params, [int(info.size) for info in core.arguments_info],
                          self._signature_origin)
        self._native_launch = native("launch").launch
        self._library, self._core = library, core
        remember_display_name(c.lowered_name, c.name)  # pictures of graphs say axpy<float>, not _Z4axpy...
        self._function_address = int(core.handle)
        self._h_kernel = _driver.driver().CUfunction(self._function_address)
        return self._h_kernel

    def _handles_on(self, device: int) -> tuple[int, ...]:
        """The loaded kernel's handle and its CUfunction in ``device``'s context: what a captured node may name."""
        function = self._functions.get(device)
        if function is None:
            _driver.ensure_context(device)  # the CUfunction belongs to the context current now
            drv = _driver.driver()
            err, handle = drv.cuKernelGetFunction(drv.CUkernel(self._function_address))
            # A handle that is already a CUfunction (a module-loaded kernel) has no other name.
            function = self._functions[device] = int(handle) if err == 0 and handle is not None else 0
        return (self._function_address, function) if function else (self._function_address,)

    def _raise_shared_limit(self, shared_mem: int, device: int) -> None:
        drv = _driver.driver()
        attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        dev = check(drv.cuDeviceGet(device), "cuDeviceGet")
        check(drv.cuKernelSetAttribute(attr, shared_mem, drv.CUkernel(int(self._h_kernel)), dev),
              "cuKernelSetAttribute")
        self._shared_limit = shared_mem


# ----------------------------------------------------------------------------
# For the other jaxgraph modules
# ----------------------------------------------------------------------------


def node_handles(kernel: KernelLoading, device: int) -> tuple[int, ...]:
    """The handles a graph node launching ``kernel`` (loaded) on ``device`` may name, its CUfunction last."""
    return kernel._handles_on(device)


def reserve_shared_memory(kernel: KernelLoading, shared_mem: int) -> None:
    """Let ``kernel`` (loaded) take ``shared_mem`` bytes of dynamic shared memory on every device."""
    if shared_mem > kernel._shared_limit:  # the Kernel tracks its limit for eager launches too
        for device in range(_driver.device_count()):
            kernel._raise_shared_limit(shared_mem, device)
