"""What an eager launch hands the driver: checked arguments and geometry, packed into bytes.

Every eager launch (``kernel[grid, block](...)``, ``kernel.launch(...)``)
checks its arguments against the kernel's parameters and packs them into one
8-byte slot each (:mod:`jaxgraph._kernels.signature` holds the checks). Most programs
launch a kernel again and again with the same *kinds* of arguments (a
DeviceArray here, a Python ``int`` there), so an :class:`ArgumentPacker`
writes, once per kernel and tuple of argument types, a small function that
runs exactly the checks those types need, inline, and packs the slots with
one precompiled ``struct.Struct``:

>>> packer = ArgumentPacker("add_one", params)      # float* y, const float* x, int n
>>> data = packer.pack((y, x, 4096), stream)        # full checks; learns the kinds
>>> data = packer.current((y, x, 4096), stream)     # the fast path for these kinds

A specialized function returns ``None`` only when the arguments are of other
kinds (before any side effect); :meth:`ArgumentPacker.pack` then takes the
reference path (:meth:`ArgumentPacker.values`). Value errors (a wrong dtype,
an integer out of range, a float overflowing ``float``) raise from the
specialized function through the same helpers, so a wrong call gives the same
message whichever path sees it. Foreign arrays (jax, CuPy, torch) are still
wrapped on every launch, ordered after their producer's stream; a launch that
a capture records needs them wrapped (:meth:`ArgumentPacker.pack_operands`).

Every array must live on the launch's device (the stream's, or the current
device for the current stream): a kernel given another device's memory would
fault on the device, so both paths raise ``ValueError`` naming the two
devices first. An array knows its device (``DeviceArray.device``, read once
when a foreign array is wrapped), so the check is one comparison per pointer.

The packed bytes are a fresh object per launch: the native launch points the
driver at them, and ``cuLaunchKernel`` copies them before returning, so
threads launching one kernel share nothing and need no lock.
"""

from __future__ import annotations

import functools
import struct
from typing import Any, Callable

import numpy as np

from .._cuda.array import HOST_JAX_ARRAY_FIX, DeviceArray, asarray, is_host_jax_array
from .._cuda.driver import thread_state
from .launch_limits import check_geometry
from .signature import (Param, check_count, check_pointer_dtype, dim3, not_an_array, pack_error,
                         scalar_value)

__all__ = ["ArgumentPacker", "device_operand", "geometry", "launch_device", "plain_ints", "unpack_geometry",
           "wrong_device"]

_MAX_KINDS = 16  # specialized functions kept per kernel (tuples of argument types seen)
_GEOMETRY = struct.Struct("<7I")  # grid x, y, z, block x, y, z, dynamic shared memory bytes


# ----------------------------------------------------------------------------
# ArgumentPacker
# ----------------------------------------------------------------------------


class ArgumentPacker:
    """Checks and packs one kernel's launch arguments, specialized per tuple of argument types.

    Parameters
    ----------
    kernel : str
        The kernel's name, as error messages say it.
    params : tuple of Param
        Its parameters, in order.

    Attributes
    ----------
    current : callable
        ``current(args, stream) -> data or None``: the function specialized
        for the kinds of arguments last seen; ``None`` means "other kinds:
        call :meth:`pack`".
    """

    def __init__(self, kernel: str, params: tuple[Param, ...]):
        self.kernel = kernel
        self.params = params
        self._struct = struct.Struct("<" + "".join(p.pack_format for p in params))
        self._by_kinds: dict[tuple[type, ...], Callable] = {}
        self.current: Callable[[tuple, Any], Any] = _no_kinds_yet

    def pack(self, args: tuple, stream: Any = None) -> bytes:
        """Check ``args`` and pack them into the launch's bytes; learn their kinds for :attr:`current`.

        ``stream`` (``None``: the current stream) is where the launch runs:
        foreign arrays are ordered after their producer's stream there.

        Raises
        ------
        TypeError
            Wrong number of arguments, something other than a device array for
            a pointer, an array of the wrong dtype, a scalar that does not fit
            its C type.
        ValueError
            An array on another device than the launch (``stream``'s device,
            or the current device when ``stream`` is ``None``).
        """
        kinds = tuple(map(type, args))
        specialized = self._by_kinds.get(kinds)
        if specialized is not None:
            self.current = specialized
            return specialized(args, stream)
        # New kinds: the reference checks first, so kinds that fail never get a function.
        data = self._pack_values(self.values(args, stream)[0])
        if len(self._by_kinds) >= _MAX_KINDS:
            self._by_kinds.clear()
        self.current = self._by_kinds[kinds] = _specialize(self, kinds)
        return data

    def pack_operands(self, args: tuple, stream: Any = None) -> tuple[bytes, tuple]:
        """As :meth:`pack`, with the operands too: ``args``, foreign arrays wrapped (what a capture records).

        The specialized function where it wraps nothing, else the reference checks.
        """
        specialized = self._by_kinds.get(tuple(map(type, args)))
        if specialized is not None and not specialized.wraps:
            return specialized(args, stream), args
        values, operands = self.values(args, stream)
        return self._pack_values(values), operands

    def values(self, args: tuple, stream: Any = None) -> tuple[list, tuple]:
        """The reference checks: ``(values, operands)``, addresses for pointers and Python scalars for the rest."""
        params, kernel = self.params, self.kernel
        if len(args) != len(params):
            check_count(kernel, params, args)
        values = []
        wrapped = None
        for i, (p, a) in enumerate(zip(params, args)):
            if p.is_pointer:
                if type(a) is not DeviceArray:
                    a = device_operand(a, p, kernel, stream)
                    wrapped = wrapped if wrapped is not None else list(args)
                    wrapped[i] = a
                if p.dtype is not None and a.dtype != p.dtype:
                    check_pointer_dtype(kernel, p, a.dtype)
                values.append(a.ptr)
            else:
                values.append(scalar_value(kernel, p, a))
        operands = args if wrapped is None else tuple(wrapped)
        _device_error(kernel, params, operands, stream)  # after the types, as the specialized functions
        return values, operands

    def pack_error(self, values: list, exc: Exception) -> TypeError:
        """The error for checked values that still do not pack (naming the first that fails)."""
        return _first_pack_error(self.kernel, self.params, values, exc)

    def kinds(self) -> list[tuple[type, ...]]:
        """The tuples of argument types this packer has specialized functions for."""
        return list(self._by_kinds)

    def _pack_values(self, values: list) -> bytes:
        try:
            return self._struct.pack(*values)
        except (struct.error, OverflowError) as exc:
            raise self.pack_error(values, exc) from None


def geometry(grid: Any, block: Any, shared_mem: Any, kernel: str = "") -> bytes:
    """Grid, block and dynamic shared memory checked and packed as the native launch takes them.

    The dimensions are checked against the limits every CUDA GPU shares
    (:func:`~jaxgraph._kernels.launch_limits.check_geometry`); the device's and the
    kernel's own are checked when a launch knows its device.

    Raises
    ------
    TypeError
        ``grid`` or ``block`` is not an int or 1 to 3 ints, or ``shared_mem`` is not an int.
    ValueError
        A dimension below 1 or over CUDA's limits (the message names the limit
        and the value), a negative ``shared_mem``, or a value that does not fit 32 bits.
    """
    packed = None
    if type(grid) is int and type(block) is int and type(shared_mem) is int and grid >= 1 and block >= 1 and (
            shared_mem >= 0):  # the usual case, without the general checks' conversions
        try:
            packed = _GEOMETRY.pack(grid, 1, 1, block, 1, 1, shared_mem)
        except struct.error:
            pass  # over 32 bits: the general checks say which
    if packed is None:
        grid, block = dim3(grid, "grid"), dim3(block, "block")
        if not isinstance(shared_mem, (int, np.integer)) or isinstance(shared_mem, bool):
            raise TypeError(f"shared_mem must be an int number of bytes, got {shared_mem!r}")
        if shared_mem < 0:
            raise ValueError(f"shared_mem must be >= 0, got {shared_mem}")
        try:
            packed = _GEOMETRY.pack(*grid, *block, int(shared_mem))
        except struct.error:
            raise ValueError(f"grid {grid}, block {block} and shared_mem {shared_mem} must each fit in "
                             "32 bits (CUDA's limits are far lower)") from None
    dims = _GEOMETRY.unpack(packed)
    check_geometry(kernel, dims[0:3], dims[3:6])
    return packed


def unpack_geometry(geo: bytes) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    """``(grid, block, shared_mem)`` of a packed :func:`geometry`."""
    dims = _GEOMETRY.unpack(geo)
    return dims[0:3], dims[3:6], dims[6]


def launch_device(stream: Any) -> int:
    """The device a launch on ``stream`` runs on: the stream's, or the thread's current device for ``None``."""
    return thread_state.device if stream is None else stream._device


def wrong_device(kernel: str, p: Param, array: DeviceArray, stream: Any) -> ValueError:
    """The error for an array of another device than the launch's, naming both devices."""
    device = launch_device(stream)
    where = ("the current device, whose current stream it takes" if stream is None
             else f"the device of its stream {stream!r}")
    return ValueError(
        f"kernel {kernel}: argument '{p.name}' ({p.ctype}) is on device {array.device}, but the launch runs on "
        f"device {device} ({where}); a kernel cannot read another device's memory here. Copy the array to "
        f"device {device} first, or launch on a stream of device {array.device}")


def plain_ints(key: tuple) -> bool:
    """Whether ``key`` holds only plain ints (or tuples of them): a cache key no other value equals (``16.0 == 16``)."""
    for value in key:  # loops, not all(...): this runs on every kernel[grid, block]
        if type(value) is tuple:
            for v in value:
                if type(v) is not int:
                    return False
        elif type(value) is not int:
            return False
    return True


def device_operand(value: Any, p: Param, kernel: str, stream: Any) -> DeviceArray:
    """A foreign device array for pointer ``p`` wrapped as a DeviceArray, after its producer; else ``TypeError``."""
    if isinstance(value, np.ndarray):
        raise not_an_array(kernel, p, value, " (host memory); copy it with jaxgraph.asarray(x) first")
    if not hasattr(value, "__cuda_array_interface__"):
        if is_host_jax_array(value):
            raise not_an_array(kernel, p, value, f" (a jax.Array on the CPU): {HOST_JAX_ARRAY_FIX}")
        raise not_an_array(kernel, p, value)
    return asarray(value, stream=stream)  # the launch's stream waits for the array's producer


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _first_pack_error(kernel: str, params: tuple[Param, ...], values: list, exc: Exception) -> TypeError:
    """:meth:`ArgumentPacker.pack_error`, without the packer (a specialized function must not refer back to it)."""
    for p, v in zip(params, values):
        if not p.is_pointer and type(v) is int and p.dtype.kind in "iu":
            try:  # an int out of its C type's range: the reference check's message
                scalar_value(kernel, p, v)
            except TypeError as range_error:
                return range_error
        try:
            struct.pack("<" + p.pack_format, v)
        except (struct.error, OverflowError) as param_exc:
            return pack_error(kernel, p, v, param_exc)
    return TypeError(f"kernel {kernel}: could not pack arguments: {exc}")


def _device_error(kernel: str, params: tuple[Param, ...], operands: tuple, stream: Any) -> None:
    """Raise :func:`wrong_device` for the first array of ``operands`` (wrapped) off the launch's device."""
    device = launch_device(stream)
    for p, a in zip(params, operands):
        if p.is_pointer and a.device != device:
            raise wrong_device(kernel, p, a, stream)


def _no_kinds_yet(args: tuple, stream: Any) -> None:
    """The specialized function before any launch: every call takes :meth:`ArgumentPacker.pack`."""
    return None


def _specialize(packer: ArgumentPacker, kinds: tuple[type, ...]) -> Callable:
    """Write and compile the check-and-pack function for arguments of types ``kinds``.

    For ``add_one(float* y, const float* x, int n)`` and ``(DeviceArray, DeviceArray, int)``::

        def pack(args, stream):
            if len(args) != 3: return None
            a0, a1, a2 = args
            if type(a0) is not K0 or type(a1) is not K1 or type(a2) is not K2: return None
            if a0.dtype is not D0 and a0.dtype != D0: check_pointer_dtype(NAME, P0, a0.dtype)
            if a1.dtype is not D1 and a1.dtype != D1: check_pointer_dtype(NAME, P1, a1.dtype)
            device = THREAD.device if stream is None else stream._device
            if a0.device != device or a1.device != device: device_error((a0, a1, a2), stream)
            try: data = STRUCT_PACK(a0.ptr, a1.ptr, a2)
            except (StructError, OverflowError) as exc: raise PACK_ERROR([a0.ptr, a1.ptr, a2], exc) from None
            return data

    Each check calls the helper the reference path calls, so it raises the same
    error; an int out of range is refused by ``struct`` (its C type's range),
    and ``PACK_ERROR`` gives the reference check's message for it. The device
    check costs a comparison per pointer; ``device_error`` (the reference
    checks, on a mismatch) names the argument.
    """
    names = [f"a{i}" for i in range(len(kinds))]
    env: dict[str, Any] = {
        "NAME": packer.kernel, "STRUCT_PACK": packer._struct.pack, "StructError": struct.error,
        "PACK_ERROR": functools.partial(_first_pack_error, packer.kernel, packer.params),
        "check_pointer_dtype": check_pointer_dtype, "scalar_value": scalar_value, "device_operand": device_operand,
        "THREAD": thread_state, "device_error": functools.partial(_device_error, packer.kernel, packer.params),
    }
    body = [f"if len(args) != {len(kinds)}: return None"]
    if kinds:
        body.append(f"{', '.join(names)}, = args")
        body.append("if " + " or ".join(f"type({a}) is not K{i}" for i, a in enumerate(names)) + ": return None")
    values, wrapped, pointers = [], False, []
    for i, (p, kind, a) in enumerate(zip(packer.params, kinds, names)):
        env[f"K{i}"], env[f"P{i}"], env[f"D{i}"] = kind, p, p.dtype
        if p.is_pointer:
            if kind is not DeviceArray:  # wrapped per launch: its producer may have queued more work
                body.append(f"{a} = device_operand({a}, P{i}, NAME, stream)")
                wrapped = True
            if p.dtype is not None:
                body.append(f"if {a}.dtype is not D{i} and {a}.dtype != D{i}: "
                            f"check_pointer_dtype(NAME, P{i}, {a}.dtype)")
            values.append(f"{a}.ptr")
            pointers.append(a)
        elif kind is int and p.dtype.kind in "iu":
            values.append(a)  # struct refuses a value out of the C type's range (a pack error: the range message)
        elif kind is float and p.dtype.kind == "f":
            values.append(a)  # float, double, __half: struct converts (an overflow is a pack error)
        else:
            body.append(f"v{i} = scalar_value(NAME, P{i}, {a})")
            values.append(f"v{i}")
    if pointers:  # every array on the launch's device (the stream's, or the thread's current one)
        body.append("device = THREAD.device if stream is None else stream._device")
        body.append("if " + " or ".join(f"{a}.device != device" for a in pointers) +
                    f": device_error(({', '.join(names)},), stream)")
    joined = ", ".join(values)
    body.append(f"try: data = STRUCT_PACK({joined})")
    body.append(f"except (StructError, OverflowError) as exc: raise PACK_ERROR([{joined}], exc) from None")
    body.append("return data")
    source = "def pack(args, stream):\n" + "".join(f"    {line}\n" for line in body)
    exec(compile(source, f"<jaxgraph: {packer.kernel} packer>", "exec"), env)
    function = env["pack"]
    function.source = source  # what runs, for a reader in a debugger
    function.wraps = wrapped  # whether its operands differ from the arguments (foreign arrays)
    return function
