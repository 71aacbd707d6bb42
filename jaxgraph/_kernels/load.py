"""Loading a compiled kernel: its CUlibrary, its CUkernel and per-device CUfunctions, its shared-memory limit.

:class:`KernelLoading` is the part of :class:`~jaxgraph.Kernel` that talks to
the driver about the loaded code rather than about a launch: it loads the cubin
once per process (through cuda.core's ``ObjectCode``), checks the parameter
sizes the driver reports, names the handles a graph node launching the kernel
may carry, and raises the kernel's dynamic shared-memory limit when a launch
asks for more than the default 48 KiB. That limit is an attribute of the
kernel *on one device* (``cuKernelSetAttribute`` takes the device), so it is
tracked per device: raising it on device 0 leaves device 1 at 48 KiB. :func:`node_handles` and
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
from .launch_limits import check_geometry, device_limits
from .signature import Param

__all__ = ["DEFAULT_SHARED_LIMIT", "KernelLoading", "LoadedCode", "check_launch_limits", "node_handles",
           "reserve_shared_memory"]

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
    _shared_limits: dict[int, int]
    _functions: dict[int, int]
    _thread_limits: dict[int, int]
    _limits_checked: set

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

    def _max_threads(self, device: int) -> int | None:
        """The most threads per block this kernel may have on ``device`` (registers, ``__launch_bounds__``).

        ``None`` when it was not loaded through cuda.core (nothing to ask).
        """
        most = self._thread_limits.get(device)
        if most is None and self._core is not None:
            most = self._thread_limits[device] = self._function_attribute("max_threads_per_block", device)
        return most

    def _function_attribute(self, name: str, device: int) -> int:
        """``CU_FUNC_ATTRIBUTE_<NAME>`` of the loaded kernel on ``device`` (cuKernelGetAttribute)."""
        drv = _driver.driver()
        attr = getattr(drv.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name.upper()}")
        dev = check(drv.cuDeviceGet(device), "cuDeviceGet")
        kernel = drv.CUkernel(int(self._h_kernel))
        return int(check(drv.cuKernelGetAttribute(attr, kernel, dev), "cuKernelGetAttribute"))

    def _check_limits(self, device: int, grid: tuple, block: tuple) -> None:
        """Raise ``ValueError`` naming the limit when ``grid``/``block`` exceed ``device``'s or this kernel's."""
        key = (device, grid, block)
        if key in self._limits_checked:
            return
        check_geometry(self.name, grid, block, device_limits(device)[0], self._max_threads(device))
        if len(self._limits_checked) >= 256:
            self._limits_checked.clear()
        self._limits_checked.add(key)

    def _shared_limit(self, device: int) -> int:
        """The dynamic shared memory a launch of this kernel on ``device`` may use now, in bytes."""
        return self._shared_limits.get(device, DEFAULT_SHARED_LIMIT)

    def _raise_shared_limit(self, shared_mem: int, device: int) -> None:
        """Let launches on ``device`` take ``shared_mem`` bytes (``ValueError`` over the device's opt-in limit)."""
        optin = device_limits(device)[1]
        static = self._function_attribute("shared_size_bytes", device)
        if shared_mem + static > optin:  # the driver would say only CUDA_ERROR_INVALID_VALUE
            raise ValueError(
                f"kernel {self.name}: shared_mem={shared_mem} bytes of dynamic shared memory is over what "
                f"{device_limits(device)[0].where} allows this kernel: {optin - static} bytes (the device's "
                f"opt-in limit of {optin} bytes per block, less the kernel's {static} bytes of static shared "
                "memory)")
        drv = _driver.driver()
        attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        dev = check(drv.cuDeviceGet(device), "cuDeviceGet")
        check(drv.cuKernelSetAttribute(attr, shared_mem, drv.CUkernel(int(self._h_kernel)), dev),
              "cuKernelSetAttribute")
        self._shared_limits[device] = shared_mem  # this device only: another keeps its own limit


class LoadedCode(KernelLoading):
    """A loaded kernel's code without its :class:`~jaxgraph.Kernel`: what a launch table entry keeps.

    XLA may launch a traced kernel (a compiled function, or its recording in
    a command buffer) after the user's Kernel is collected. This holds what
    that needs and nothing that refers back to the Kernel: the library (so
    the CUkernel stays loaded) and the per-device shared-memory limits, the
    same dict as the Kernel's while it lives (one CUkernel, one limit).
    """

    def __init__(self, kernel: KernelLoading):
        if kernel._h_kernel is None:
            kernel._load()
        self.name = kernel.name
        self.params = kernel.params
        self._lock = threading.Lock()
        self._library, self._core = kernel._library, kernel._core
        self._h_kernel, self._function_address = kernel._h_kernel, kernel._function_address
        self._native_launch = None
        self._shared_limits = kernel._shared_limits
        self._functions, self._thread_limits, self._limits_checked = {}, {}, set()


# ----------------------------------------------------------------------------
# For the other jaxgraph modules
# ----------------------------------------------------------------------------


def node_handles(kernel: KernelLoading, device: int) -> tuple[int, ...]:
    """The handles a graph node launching ``kernel`` (loaded) on ``device`` may name, its CUfunction last."""
    return kernel._handles_on(device)


def check_launch_limits(kernel: KernelLoading, grid: tuple, block: tuple) -> None:
    """Check ``grid``/``block`` against every device's limits and ``kernel``'s (loaded) own on each."""
    for device in range(_driver.device_count()):
        kernel._check_limits(device, tuple(grid), tuple(block))


def reserve_shared_memory(kernel: KernelLoading, shared_mem: int) -> None:
    """Let ``kernel`` (loaded) take ``shared_mem`` bytes of dynamic shared memory on every device."""
    for device in range(_driver.device_count()):
        if shared_mem > kernel._shared_limit(device):  # per device, shared with eager launches
            kernel._raise_shared_limit(shared_mem, device)
