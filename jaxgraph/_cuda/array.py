"""Typed device arrays and zero-copy exchange with JAX, CuPy and PyTorch.

A :class:`DeviceArray` is a C-contiguous block of device memory with a shape
and a dtype. Its memory has exactly one owner, held in ``array.owner``: a
jaxgraph allocation, or the foreign array it wraps (a ``jax.Array``, CuPy
array or torch tensor), which the DeviceArray keeps alive.

Exchange works both ways without copies: ``jaxgraph.asarray(x)`` wraps any
object exposing ``__cuda_array_interface__`` (jax.Array on GPU, CuPy, torch);
DeviceArrays expose ``__cuda_array_interface__`` and ``__dlpack__`` so
``jax.dlpack.from_dlpack``, ``torch.from_dlpack`` / ``torch.as_tensor`` and
``cupy.asarray`` take them as they are.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Sequence

import numpy as np

from . import capture_registry as _captures, driver as _driver, memory as _memory
from .driver import check
from .stream import Stream, current_stream, wait_on_current

__all__ = ["DeviceArray", "HOST_JAX_ARRAY_FIX", "asarray", "empty", "is_jax_object", "is_host_jax_array", "to_host", "zeros"]

_KDLCUDA = 2  # DLPack device type of CUDA memory


# ----------------------------------------------------------------------------
# DeviceArray
# ----------------------------------------------------------------------------


class DeviceArray:
    """A typed, C-contiguous array in device memory.

    Make one with :func:`empty`, :func:`zeros` or :func:`asarray`; the
    constructor is internal.

    Attributes
    ----------
    ptr : int
        Device address of the first element.
    shape : tuple of int
        The length of each dimension.
    dtype : numpy.dtype
        The element type.
    nbytes : int
        Bytes of memory the elements take, ``size * itemsize``.
    device : int
        Device ordinal.
    owner : object
        What keeps the memory alive: a jaxgraph allocation or a wrapped foreign array.
    """

    __slots__ = ("ptr", "shape", "dtype", "nbytes", "device", "owner", "__weakref__")

    def __init__(self, ptr: int, shape: tuple, dtype: Any, device: int, owner: Any, *, _token=None):
        if _token is not _INTERNAL:
            raise RuntimeError(
                "DeviceArray cannot be constructed directly; use jaxgraph.empty, zeros or asarray"
            )
        self.ptr = ptr
        self.shape = shape
        self.dtype = dtype
        self.nbytes = math.prod(shape) * dtype.itemsize
        self.device = device
        self.owner = owner

    # -- numpy-like properties ----------------------------------------------

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        """Number of dimensions, ``len(shape)``."""
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element, ``dtype.itemsize``."""
        return self.dtype.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        """Byte strides (always C-contiguous)."""
        strides, step = [], self.dtype.itemsize
        for extent in reversed(self.shape):
            strides.append(step)
            step *= extent
        return tuple(reversed(strides))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self.shape[0]

    def __repr__(self) -> str:
        return (f"DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self.device}, "
                f"ptr={self.ptr:#x})")

    def reshape(self, *shape: int | Sequence[int]) -> "DeviceArray":
        """A view with a new shape and the same memory (and owner)."""
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = tuple(shape[0])
        shape = _normalize_shape(shape)
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape an array of size {self.size} into shape {shape}")
        return DeviceArray(self.ptr, shape, self.dtype, self.device, self.owner, _token=_INTERNAL)

    # -- copies ---------------------------------------------------------------

    def numpy(self, stream: Stream | None = None) -> np.ndarray:
        """Copy to a new host ``numpy.ndarray`` (waits for ``stream``, default current)."""
        return to_host(self, stream=stream)

    def copy_(self, src: Any, stream: Stream | None = None) -> "DeviceArray":
        """Copy ``src`` (host numpy data or a device array of the same size) into this array."""
        stream = _stream_for(self, stream)
        drv = _driver.driver()
        if isinstance(src, np.ndarray) or np.isscalar(src) or isinstance(src, (list, tuple)):
            if _captures.capture_on(stream) is not None:
                raise RuntimeError(
                    "copy_ from host memory cannot be captured in a CUDA graph (the host buffer "
                    "would have to outlive every replay); copy the data into a device array "
                    "before capture and capture a device-to-device copy_ instead")
            host = np.ascontiguousarray(src, dtype=self.dtype)
            if host.shape != self.shape and host.size != self.size:
                raise ValueError(f"copy_: source shape {host.shape} does not match {self.shape}")
            check(drv.cuMemcpyHtoDAsync(self.ptr, host.ctypes.data, self.nbytes, stream.handle),
                  "cuMemcpyHtoDAsync")
            # The host buffer must outlive the asynchronous copy.
            stream.synchronize()
            return self
        other = asarray(src, stream=stream)
        if other.nbytes != self.nbytes:
            raise ValueError(f"copy_: source has {other.nbytes} bytes, destination {self.nbytes}")
        if _captures.any_underway():
            _captures.note_operands(stream, (("self", self), ("src", other)), "DeviceArray.copy_")
        check(drv.cuMemcpyDtoDAsync(self.ptr, other.ptr, self.nbytes, stream.handle), "cuMemcpyDtoDAsync")
        return self

    def fill_(self, value: Any, stream: Stream | None = None) -> "DeviceArray":
        """Set every element to ``value`` with a memset (recorded when captured)."""
        stream = _stream_for(self, stream)
        pattern = np.asarray(value, dtype=self.dtype).reshape(1)
        drv = _driver.driver()
        n = self.size
        if _captures.any_underway():
            _captures.note_operands(stream, (("self", self),), "DeviceArray.fill_")
        if self.itemsize == 1:
            check(drv.cuMemsetD8Async(self.ptr, int(pattern.view(np.uint8)[0]), n, stream.handle),
                  "cuMemsetD8Async")
        elif self.itemsize == 2:
            check(drv.cuMemsetD16Async(self.ptr, int(pattern.view(np.uint16)[0]), n, stream.handle),
                  "cuMemsetD16Async")
        elif self.itemsize == 4:
            check(drv.cuMemsetD32Async(self.ptr, int(pattern.view(np.uint32)[0]), n, stream.handle),
                  "cuMemsetD32Async")
        elif self.itemsize == 8 and pattern.view(np.uint32)[0] == pattern.view(np.uint32)[1]:
            check(drv.cuMemsetD32Async(self.ptr, int(pattern.view(np.uint32)[0]), 2 * n, stream.handle),
                  "cuMemsetD32Async")
        else:
            raise ValueError(f"fill_ supports only values whose bytes repeat per 4-byte word for {self.dtype}")
        return self

    def record_stream(self, stream: Stream) -> None:
        """Mark this array as used by work on ``stream``, as ``torch.Tensor.record_stream``.

        jaxgraph frees memory in the order of the stream that allocated it.
        After ``record_stream(s)``, the memory is freed only once the work
        queued on ``s`` up to the free has finished too, so an array used on
        another stream can be dropped without ordering the streams by hand.

        Raises
        ------
        TypeError
            ``stream`` is not a :class:`~jaxgraph.Stream`.
        ValueError
            The array wraps memory another library owns (a ``jax.Array``, CuPy
            or torch array): that library decides when it is freed. Or the
            stream is on another device than the array.
        """
        if not isinstance(stream, Stream):
            raise TypeError(f"record_stream expects a jaxgraph.Stream, got {type(stream).__name__}")
        if not isinstance(self.owner, _memory.Allocation):
            raise ValueError("record_stream applies to memory jaxgraph allocated; this array wraps a "
                             f"{type(self.owner).__name__}, whose memory its own library frees")
        if stream.device != self.device:
            raise ValueError(f"record_stream: the stream is on device {stream.device}, the array on "
                             f"device {self.device}")
        self.owner.record_stream(stream)

    # -- interchange ------------------------------------------------------------

    @property
    def __cuda_array_interface__(self) -> dict:
        """CUDA Array Interface v3; ``stream`` is the current stream (consumers wait on it).

        While the current stream captures a graph, no stream is given: captured
        work does not run, so there is nothing to wait for (and a consumer's
        synchronization would break the capture), e.g. ``cupy.asarray(x)``
        inside ``with jaxgraph.graph(g):``.
        """
        current = current_stream(self.device)
        s = int(current)
        if s != 0 and _captures.capture_on(current) is not None:
            stream = None
        else:
            # v3: an integer stream the consumer synchronizes with; 0 is disallowed,
            # and the legacy default stream is spelled 1.
            stream = s if s != 0 else 1
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "version": 3,
            "strides": None,
            "stream": stream,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_KDLCUDA, self.device)

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple | None = None,
                   dl_device: tuple | None = None, copy: bool | None = None) -> Any:
        """Export as a DLPack capsule (zero-copy); the consumer's ``stream`` waits for ours."""
        if copy:
            raise BufferError("jaxgraph exports DLPack without copies only (copy=True unsupported)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"cannot export device {self.__dlpack_device__()} memory to {dl_device}")
        if stream != -1:
            wait_on_current(self.device, stream)
        from cuda.core import Buffer
        from cuda.core.utils import StridedMemoryView

        buffer = Buffer.from_handle(self.ptr, self.nbytes, owner=self)
        view = StridedMemoryView.from_buffer(buffer, self.shape, dtype=self.dtype)
        return view.__dlpack__(max_version=max_version)

    def to_jax(self) -> Any:
        """A ``jax.Array`` sharing this memory (through DLPack, no copy)."""
        import jax

        return jax.dlpack.from_dlpack(self)


# ----------------------------------------------------------------------------
# Construction and conversion
# ----------------------------------------------------------------------------


def empty(shape: int | Sequence[int], dtype: Any = np.float32, *, stream: Stream | None = None) -> DeviceArray:
    """An uninitialised device array, allocated in the order of ``stream`` (default current).

    During a capture, the memory comes from the capturing graph's pool.
    """
    shape = _normalize_shape(shape)
    dtype = _normalize_dtype(dtype)
    stream = current_stream() if stream is None else stream
    nbytes = math.prod(shape) * dtype.itemsize
    capture = _captures.pool_for(stream)  # during a capture: the graph's pool
    alloc = capture.allocate(nbytes, stream) if capture is not None else _memory.allocate(nbytes, stream)
    return DeviceArray(alloc.ptr, shape, dtype, alloc.device, alloc, _token=_INTERNAL)


def zeros(shape: int | Sequence[int], dtype: Any = np.float32, *, stream: Stream | None = None) -> DeviceArray:
    """A device array of zeros (memset on ``stream``, default current)."""
    out = empty(shape, dtype, stream=stream)
    s = _stream_for(out, stream)
    check(_driver.driver().cuMemsetD8Async(out.ptr, 0, out.nbytes, s.handle), "cuMemsetD8Async")
    return out


def asarray(obj: Any, dtype: Any = None, *, stream: Stream | None = None) -> DeviceArray:
    """Return ``obj`` as a :class:`DeviceArray`.

    - a DeviceArray is returned as is;
    - an object with ``__cuda_array_interface__`` (jax.Array on GPU, CuPy,
      torch CUDA tensors) is wrapped **without a copy**; the DeviceArray keeps
      it alive and has the same pointer;
    - host data (numpy arrays, lists, scalars) is copied to the device.

    ``stream`` (default: the current stream) is where the array will be used:
    host data is copied there, and work queued there comes after the work
    the foreign array's producer stream had queued (the CUDA Array Interface
    v3 ``stream``): outside captures the host waits for the producer; while a
    stream captures nothing synchronizes, and the order is kept on the device
    (an event wait, recorded into the graph when ``stream`` captures).
    """
    if isinstance(obj, DeviceArray):
        if dtype is not None and _normalize_dtype(dtype) != obj.dtype:
            raise TypeError(f"asarray: array has dtype {obj.dtype}, asked for {np.dtype(dtype)}")
        return obj
    if hasattr(obj, "__cuda_array_interface__"):
        arr = _wrap_cuda_array_interface(obj, stream)
        if dtype is not None and _normalize_dtype(dtype) != arr.dtype:
            raise TypeError(f"asarray: device array has dtype {arr.dtype}, asked for "
                            f"{np.dtype(dtype)}; zero-copy wrapping cannot convert")
        return arr
    if is_jax_object(obj):
        raise TypeError(f"asarray: a jax.Array on the CPU cannot be wrapped as device memory; {HOST_JAX_ARRAY_FIX}")
    host = np.ascontiguousarray(obj, dtype=dtype)
    if host.dtype == object:
        raise TypeError(f"asarray: cannot convert {type(obj).__name__} to a device array")
    out = empty(host.shape, host.dtype, stream=stream)
    if out.nbytes:
        out.copy_(host, stream=stream)
    return out


def to_host(array: Any, *, stream: Stream | None = None) -> np.ndarray:
    """Copy a device array to a new host ``numpy.ndarray``, waiting for ``stream``."""
    array = asarray(array, stream=stream)
    stream = _stream_for(array, stream)
    host = np.empty(array.shape, array.dtype)
    if array.nbytes:
        check(_driver.driver().cuMemcpyDtoHAsync(host.ctypes.data, array.ptr, array.nbytes, stream.handle),
              "cuMemcpyDtoHAsync")
        stream.synchronize()
    return host


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------

_INTERNAL = object()


def _normalize_shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = tuple(operator.index(v) for v in shape)
    except TypeError:
        raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    if any(v < 0 for v in shape):
        raise ValueError(f"shape must be non-negative, got {shape}")
    return shape


def _normalize_dtype(dtype: Any) -> np.dtype:
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"not a dtype: {dtype!r}") from None
    if dtype.hasobject or dtype.itemsize == 0:
        raise TypeError(f"dtype {dtype} cannot live in device memory")
    return dtype


def _stream_for(array: DeviceArray, stream: Stream | None) -> Stream:
    _driver.ensure_context(array.device)
    return current_stream(array.device) if stream is None else stream


HOST_JAX_ARRAY_FIX = ("put it on a GPU with jax.device_put(x, jax.devices('gpu')[0]), or copy it with "
                      "jaxgraph.asarray(numpy.asarray(x))")
"""What to do with a jax.Array on the CPU where device memory is needed (every such error says it)."""


def is_host_jax_array(obj: Any) -> bool:
    """Whether ``obj`` is a JAX array without device memory to share (e.g. on JAX's CPU backend)."""
    return is_jax_object(obj) and not hasattr(obj, "__cuda_array_interface__")


def is_jax_object(obj: Any) -> bool:
    """Whether ``obj``'s type is JAX's (``jax.Array``, a tracer): its module is ``jax``, ``jax.*`` or ``jaxlib*``.

    Not ``startswith("jax")`` alone: jaxgraph's own public types say ``jaxgraph``.
    """
    module = type(obj).__module__
    return module == "jax" or module.startswith(("jax.", "jaxlib"))



def _foreign_device(obj: Any, ptr: int) -> int:
    """The CUDA ordinal of the device holding a foreign array's memory.

    The array says where it can: a jax.Array its device's ``local_hardware_id``,
    others their DLPack device (torch, CuPy). Memory an allocator maps itself
    may be attributed to the current context by the driver's pointer query
    (XLA's on device 1 answered 0 on an H200); that query is the last resort.
    """
    if is_jax_object(obj) and hasattr(obj, "devices"):
        devices = obj.devices()
        if len(devices) == 1:
            hardware_id = getattr(next(iter(devices)), "local_hardware_id", None)
            if isinstance(hardware_id, int):
                return hardware_id
    dlpack_device = getattr(obj, "__dlpack_device__", None)
    if dlpack_device is not None:
        try:
            kind, ordinal = dlpack_device()
        except Exception:  # an exporter that cannot say: ask the driver
            pass
        else:
            if int(kind) == _KDLCUDA:
                return int(ordinal)
    return _driver.pointer_device(ptr) if ptr else _driver.current_device()


def _wrap_cuda_array_interface(obj: Any, consumer: Stream | None) -> DeviceArray:
    if is_jax_object(obj):
        obj.block_until_ready()  # the pointer is only meaningful once XLA wrote it
    cai = obj.__cuda_array_interface__
    ptr = int(cai["data"][0])
    shape = tuple(int(v) for v in cai["shape"])
    dtype = _normalize_dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None:
        expected, step = [], dtype.itemsize
        for extent in reversed(shape):
            expected.append(step)
            step *= extent
        if tuple(strides) != tuple(reversed(expected)) and math.prod(shape) > 1:
            raise ValueError("asarray: only C-contiguous device arrays can be wrapped without a copy; "
                             "make it contiguous first")
    device = _foreign_device(obj, ptr)
    producer_stream = cai.get("stream")
    if producer_stream not in (None, 0):
        # CAI v3: the consumer must order itself after the producer's stream.
        _driver.ensure_context(device)
        producer = Stream.from_handle(producer_stream, device=device)
        consumer = current_stream(device) if consumer is None else consumer
        if not _captures.order_after(producer, consumer):  # no capture anywhere: wait from the host
            producer.synchronize()
    return DeviceArray(ptr, shape, dtype, device, obj, _token=_INTERNAL)
