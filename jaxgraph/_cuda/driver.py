"""Checked calls into the CUDA driver, devices and their primary contexts.

Every driver call in jaxgraph goes through :func:`check` (or :func:`call`),
which turns a failing ``CUresult`` into a :class:`CudaError` naming the call and
the result. A machine without a driver or without a device raises one
:class:`CudaUnavailableError` with a single clear line.

jaxgraph works in each device's *primary* context, the same one XLA (and the
CUDA runtime, PyTorch and CuPy) use, so memory and streams are shared freely.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

__all__ = [
    "CudaError",
    "CudaUnavailableError",
    "call",
    "check",
    "compute_capability",
    "context_address",
    "current_device",
    "device_count",
    "device_current",
    "driver",
    "ensure_context",
    "pointer_device",
    "set_device",
    "thread_state",
]


# ----------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------


class CudaError(RuntimeError):
    """A CUDA driver call failed.

    Attributes
    ----------
    call : str
        The driver function that failed, e.g. ``"cuGraphLaunch"``.
    result : cuda.bindings.driver.CUresult
        The result it returned; ``result.name`` is e.g. ``"CUDA_ERROR_INVALID_VALUE"``.
    """

    __module__ = "jaxgraph"  # shown as jaxgraph.CudaError, where users import it from

    def __init__(self, call: str, result: Any, detail: str = ""):
        self.call = call
        self.result = result
        name = getattr(result, "name", str(result))
        explanation = _error_string(result)
        message = f"{call} failed with {name}"
        if explanation:
            message += f": {explanation}"
        if detail:
            message += f" ({detail})"
        super().__init__(message)


class CudaUnavailableError(RuntimeError):
    """CUDA cannot be used here: no driver, no device, or no cuda-bindings."""

    __module__ = "jaxgraph"  # shown as jaxgraph.CudaUnavailableError, where users import it from


# ----------------------------------------------------------------------------
# Checked calls
# ----------------------------------------------------------------------------

_driver_module = None
_SUCCESS = None


def driver():
    """Return ``cuda.bindings.driver``, imported on first use."""
    global _driver_module, _SUCCESS
    if _driver_module is None:
        try:
            from cuda.bindings import driver as module
        except ImportError as exc:  # pragma: no cover - dependency missing
            raise CudaUnavailableError(
                "cuda-bindings is not installed: pip install cuda-bindings"
            ) from exc
        _SUCCESS = module.CUresult.CUDA_SUCCESS
        _driver_module = module
    return _driver_module


def check(result: tuple, call: str) -> Any:
    """Raise :class:`CudaError` unless ``result[0]`` is ``CUDA_SUCCESS``.

    ``result`` is what a ``cuda.bindings`` call returns, ``(err, *values)``.
    Returns ``None``, the single value, or the tuple of values.
    """
    err = result[0]
    if err != _SUCCESS:
        raise CudaError(call, err)
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return result[1:]


def call(name: str, *args: Any) -> Any:
    """Call ``cuda.bindings.driver.<name>(*args)`` after initialising CUDA, checked."""
    _init()
    return check(getattr(_driver_module, name)(*args), name)


def _error_string(result: Any) -> str:
    try:
        err, text = _driver_module.cuGetErrorString(result)
    except Exception:
        return ""
    if err != _SUCCESS or text is None:
        return ""
    return text.decode() if isinstance(text, bytes) else str(text)


# ----------------------------------------------------------------------------
# Initialisation, devices and primary contexts
# ----------------------------------------------------------------------------

_init_lock = threading.Lock()
_initialized = False
_no_driver = False
_NO_DRIVER = "no CUDA driver found: CUDA work needs an NVIDIA GPU and its driver"
_device_count = 0
_primary_contexts: dict[int, Any] = {}
_primary_context_addresses: dict[int, int] = {}  # int(context), compared with the thread's current one


class _ThreadState(threading.local):
    """Per-thread driver state."""

    device = 0  # the thread's current device until set_device (a class default: no failed lookup per call)


_local = _ThreadState()
# The same object under a public name: the eager launch reads the thread's device without a call (read only).
thread_state = _local


def _init() -> None:
    """Initialise the driver once; raise :class:`CudaUnavailableError` without one."""
    global _initialized, _device_count, _no_driver
    if _initialized:
        return
    with _init_lock:
        if _initialized:
            return
        if _no_driver:
            raise CudaUnavailableError(_NO_DRIVER)
        drv = driver()
        try:
            err, = drv.cuInit(0)
        except Exception as exc:
            if not _is_missing_driver(exc):
                raise
            # Remembered: cuda-bindings < 13.4 cannot retry a failed dlopen (its
            # second cuInit raises 'Function "cuInit" not found').
            _no_driver = True
            raise CudaUnavailableError(_NO_DRIVER) from None
        if err == drv.CUresult.CUDA_ERROR_NO_DEVICE:
            raise CudaUnavailableError("no CUDA device: the CUDA driver found no GPU")
        if err != _SUCCESS:
            raise CudaUnavailableError(f"CUDA is not available: cuInit failed with {err.name}")
        count = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
        if count == 0:
            raise CudaUnavailableError("no CUDA device: the CUDA driver found no GPU")
        _device_count = count
        _initialized = True


def _is_missing_driver(exc: Exception) -> bool:
    """Whether cuda-bindings' ``cuInit`` failed because libcuda.so is absent."""
    return (type(exc).__name__ == "DynamicLibNotFoundError"   # cuda.pathfinder (cuda-bindings >= 13.4)
            or isinstance(exc, OSError)
            or "Failed to dlopen" in str(exc))                  # cuda-bindings 13.0-13.3


def device_count() -> int:
    """Number of CUDA devices; 0 where CUDA is unavailable (never raises)."""
    try:
        _init()
    except CudaUnavailableError:
        return 0
    return _device_count


def current_device() -> int:
    """The calling thread's current device ordinal (0 unless :func:`set_device` changed it)."""
    return _local.device


def set_device(device: int) -> None:
    """Make ``device`` current for the calling thread, like ``torch.cuda.set_device``."""
    _init()
    device = _check_ordinal(device)
    _local.device = device
    ensure_context(device)


@contextlib.contextmanager
def device_current(device: int) -> Iterator[int]:
    """Make ``device`` the thread's current device (and context) for a block; what was current after.

    For jaxgraph's own work on an object's device (a loop built for a graph on
    device 1 while device 0 is current): what the block allocates lands there,
    and the driver calls it makes run in that device's context. After it, the
    thread's jaxgraph device is the previous one and its CUDA context the one
    that was current before (torch's, CuPy's or XLA's, whoever set it).
    """
    previous = current_device()
    context = _current_context() if _driver_module is not None else 0
    if device != previous:
        set_device(device)
    try:
        yield device
    except BaseException:
        try:
            _restore(previous, context, device)
        except Exception:  # the block's error is the one to see
            pass
        raise
    _restore(previous, context, device)


def _restore(previous: int, context: int, device: int) -> None:
    """:func:`device_current`'s exit: ``previous`` the thread's device, ``context`` (if any) its context."""
    _local.device = previous
    if context:
        if _current_context() != context:
            check(_driver_module.cuCtxSetCurrent(_driver_module.CUcontext(context)), "cuCtxSetCurrent")
    elif device != previous:
        ensure_context(previous)


def ensure_context(device: int | None = None) -> int:
    """Make ``device``'s primary context current on this thread; return the ordinal.

    Checks the thread's actual current context every time (one native driver
    call): XLA, CuPy or torch may have switched it since jaxgraph set it, and a
    launch into another device's context reads memory it cannot reach.
    """
    if device is None:
        device = _local.device
    address = _primary_context_addresses.get(device)
    if address is not None and _current_context() == address:
        return device
    _init()
    device = _check_ordinal(device)
    ctx = _primary_contexts.get(device)
    if ctx is None:
        with _init_lock:
            ctx = _primary_contexts.get(device)
            if ctx is None:
                dev = check(_driver_module.cuDeviceGet(device), "cuDeviceGet")
                # Retained for the life of the process, as the CUDA runtime does.
                ctx = check(_driver_module.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
                _primary_contexts[device] = ctx
                _primary_context_addresses[device] = int(ctx)
    check(_driver_module.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return device


def context_address(device: int) -> int:
    """``device``'s primary context as an integer, retained (and made current) on first use.

    What the native eager launch compares with the thread's current context,
    making it current when another library switched it (as :func:`ensure_context`).
    """
    address = _primary_context_addresses.get(device)
    if address is None:
        ensure_context(device)
        address = _primary_context_addresses[device]
    return address


def _current_context() -> int:
    """``cuCtxGetCurrent()`` as an integer: natively where the extension is built."""
    global _current_context_fn
    if _current_context_fn is None:
        try:
            from ._launch import current_context as _current_context_fn  # noqa: PLW0621
        except ImportError:
            def _current_context_fn() -> int:
                err, ctx = _driver_module.cuCtxGetCurrent()
                return int(ctx) if err == _SUCCESS and ctx is not None else 0
    return _current_context_fn()


_current_context_fn: Any = None


def compute_capability(device: int | None = None) -> tuple[int, int]:
    """``(major, minor)`` of ``device`` (default: the current device)."""
    _init()
    device = _check_ordinal(current_device() if device is None else device)
    drv = _driver_module
    attr = drv.CUdevice_attribute
    dev = check(drv.cuDeviceGet(device), "cuDeviceGet")
    major = check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                  "cuDeviceGetAttribute")
    minor = check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                  "cuDeviceGetAttribute")
    return int(major), int(minor)


def pointer_device(ptr: int) -> int:
    """The ordinal of the device whose memory ``ptr`` points into."""
    drv = driver()
    ensure_context()
    attr = drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    return int(check(drv.cuPointerGetAttribute(attr, ptr), "cuPointerGetAttribute"))


def _check_ordinal(device: Any) -> int:
    if not isinstance(device, int) or isinstance(device, bool):
        raise TypeError(f"device must be an int ordinal, got {type(device).__name__}")
    if not 0 <= device < _device_count:
        raise ValueError(f"device {device} does not exist: this machine has {_device_count} CUDA device(s)")
    return device
