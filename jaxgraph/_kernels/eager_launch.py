"""Eager launches from Python: ``kernel[grid, block, shared_mem, stream](*args)`` and ``kernel.launch(...)``.

:class:`KernelLaunching` is the part of :class:`~jaxgraph.Kernel` that launches
it from the host. Indexing a kernel checks the launch configuration (grid,
block, dynamic shared memory, stream) and returns a launcher; calling the
launcher checks and packs the arguments (:mod:`jaxgraph._kernels.packer`, specialized
per kinds of arguments) and makes one native ``cuLaunchKernel``.

Programs launch a kernel again and again with a few configurations, often
indexing it on every launch (``kernel[grid, block](y, x, n)`` in a loop). So a
kernel keeps each configuration it checked, given in plain ints, as plain data:
the packed geometry, the dynamic shared memory, and the stream's address,
device and primary context once a launch has looked them up. Indexing with
the same configuration again finds it with one dictionary lookup, and
``kernel.launch(...)`` takes the same path. The cache holds neither streams
nor the kernel: a stream is keyed by ``id`` and confirmed by a weak reference
(a new stream that reuses a dead one's ``id`` gets its own entry), and the
cache starts over past :data:`MAX_LAUNCH_CONFIGS` entries. A launcher holds
its kernel and stream, so a kept ``launch = kernel[g, b, 0, s]`` keeps both
alive; it is a bound method, the cheapest Python callable to make and to call.

>>> launch = kernel[blocks, 256, 0, s]   # checked once, reused
>>> for _ in range(100):
...     launch(y, x, n)
>>> kernel[blocks, 256](y, x, n)         # the current stream; the checked configuration found again
"""

from __future__ import annotations

import contextlib
import weakref
from types import MethodType
from typing import Any, Callable, Iterator, Sequence

from .._cuda import capture_registry as _captures, driver as _driver
from .._cuda.array import asarray
from .._cuda.capture_registry import streams_capturing
from .load import DEFAULT_SHARED_LIMIT, KernelLoading
from .packer import ArgumentPacker, geometry, plain_ints, unpack_geometry
from .._cuda.driver import thread_state
from .._cuda.stream import Stream, current_stream, thread_streams

__all__ = ["KernelLaunching", "MAX_LAUNCH_CONFIGS", "reference_checks", "stopped_before_driver"]

MAX_LAUNCH_CONFIGS = 32  # checked launch configurations kept per kernel (and geometries apart from streams)


# ----------------------------------------------------------------------------
# KernelLaunching
# ----------------------------------------------------------------------------


class KernelLaunching(KernelLoading):
    """Eager launches of :class:`~jaxgraph.Kernel` (which owns the attributes below).

    ``_launch_configs`` maps a cache key to a configuration, a list
    ``[ready, geometry, shared_mem, stream_ref]``. ``ready`` is all a launch
    needs besides its arguments, ``(stream_ref, address, context, function,
    native_launch, geometry)``, for the stream the last launch ran on (the
    configured one, or the current stream); ``context`` is ``None`` until a
    launch has looked it up (and for ever when the launch needs more dynamic
    shared memory than the default: that is checked at every launch).
    ``stream_ref`` is a weak reference to the configured stream (for the
    current stream, a function returning ``None``). Keys: ``(grid, block,
    shared_mem, id(stream))`` for a stream, ``(grid, block, shared_mem)`` or
    ``(grid, block)`` for the current stream, always in plain ints.
    """

    _packer: ArgumentPacker
    _flags: str
    _launch_configs: dict[tuple, list]
    _geometries: dict[tuple, bytes]

    def __getitem__(self, config: tuple) -> Callable[..., None]:
        """``kernel[grid, block]``, ``[grid, block, shared_mem]`` or ``[grid, block, shared_mem, stream]``.

        Returns a launcher: call it with the kernel's arguments to launch.
        """
        # The fast path: a configuration checked before. Its key holds plain ints and
        # the stream's id; 16.0 == 16 and True == 1 hash alike, so a hit checks the
        # types, and the stream by identity (a new object may have a dead one's id).
        if type(config) is tuple:
            try:
                if len(config) == 4:
                    grid, block, shared_mem, stream = config
                    found = self._launch_configs[grid, block, shared_mem, id(stream)]
                    if found[3]() is stream and type(grid) is type(block) is type(shared_mem) is int:
                        return MethodType(launch_on_stream, (self, stream, found))
                elif len(config) == 2:
                    found = self._launch_configs[config]
                    grid, block = config
                    if type(grid) is type(block) is int:
                        return MethodType(launch_on_current, (self, found))
            except (KeyError, TypeError):  # not kept yet, or unhashable (a list for a grid)
                pass
            if len(config) == 2:
                return self._configure(config[0], config[1], 0, None, config)
            if 3 <= len(config) <= 4:
                return self._configure(*config)
        raise TypeError("use kernel[grid, block], kernel[grid, block, shared_mem] "
                        "or kernel[grid, block, shared_mem, stream]")

    def launch(self, *args: Any, grid: int | Sequence[int], block: int | Sequence[int],
               shared_mem: int = 0, stream: Stream | None = None) -> None:
        """Launch on ``stream`` (default: the current stream) with checked arguments.

        The same as ``kernel[grid, block, shared_mem, stream](*args)``.

        Parameters
        ----------
        *args
            One per kernel parameter: device arrays (:class:`DeviceArray`,
            jax.Array, CuPy, torch) for pointers, numbers for scalars.
        grid, block : int or tuple of up to 3 ints
        shared_mem : int
            Dynamic shared memory in bytes.
        stream : Stream, optional

        Raises
        ------
        TypeError
            A wrong argument (see :class:`Kernel`), a ``grid``, ``block`` or
            ``shared_mem`` of the wrong type, or a ``stream`` that is not a
            :class:`~jaxgraph.Stream`.
        ValueError
            A dimension below 1, a negative ``shared_mem``, a value over 32 bits,
            or an array on another device than ``stream`` (default: the current
            device); the message names both devices.
        jaxgraph.CudaError
            The driver refused the launch.
        """
        if type(grid) is type(block) is type(shared_mem) is int:  # the fast path, as kernel[...]
            try:
                found = self._launch_configs[(grid, block, shared_mem) if stream is None else
                                             (grid, block, shared_mem, id(stream))]
            except KeyError:
                found = None
            if found is not None and found[3]() is stream:
                return launch_with(self, stream, found, args)
        self._configure(grid, block, shared_mem, stream)(*args)

    def _configure(self, grid: Any, block: Any, shared_mem: Any = 0, stream: Any = None,
                   key: tuple | None = None) -> Callable[..., None]:
        """The launcher for a configuration the fast path did not find: checked, and kept if in plain ints.

        ``key`` is where the fast path looks for it, when not the usual key for ``stream``.
        """
        if not ((type(grid) is int and type(block) is int and type(shared_mem) is int)
                or plain_ints((grid, block, shared_mem))):
            key = None  # 16.0, True, numpy ints, lists: checked at every indexing, never kept
        elif stream is None:
            key = key or (grid, block, shared_mem)
        elif isinstance(stream, Stream):
            key = (grid, block, shared_mem, id(stream))
        else:
            key = None  # refused below
        found = None if key is None else self._launch_configs.get(key)
        if found is None or found[3]() is not stream:
            found = self._new_config(grid, block, shared_mem, stream, key is not None)
            if key is not None:
                if len(self._launch_configs) >= MAX_LAUNCH_CONFIGS:  # ever new streams or grids: start over
                    self._launch_configs.clear()
                self._launch_configs[key] = found
        if stream is None:
            return MethodType(launch_on_current, (self, found))
        return MethodType(launch_on_stream, (self, stream, found))

    def _new_config(self, grid: Any, block: Any, shared_mem: Any, stream: Any, plain: bool) -> list:
        """A checked configuration: the geometry's errors first, then the stream's (as ever)."""
        geo_key = (grid, block, shared_mem)
        geo = self._geometries.get(geo_key) if plain else None
        if geo is None:
            geo = geometry(grid, block, shared_mem, self.name)
            if plain:
                if len(self._geometries) >= MAX_LAUNCH_CONFIGS:
                    self._geometries.clear()
                self._geometries[geo_key] = geo
        if stream is None:
            return [(_no_stream, 0, None, 0, None, geo), geo, int(shared_mem), _no_stream]
        if not isinstance(stream, Stream):
            raise TypeError(f"stream must be a jaxgraph.Stream, got {type(stream).__name__}")
        return [(_no_stream, 0, None, 0, None, geo), geo, int(shared_mem), weakref.ref(stream)]

    def _note_operands(self, stream: Stream, args: tuple) -> None:
        """Report this launch's array operands, and which it only reads, to a graph capturing on ``stream``."""
        capture = _captures.capture_on(stream)
        if capture is None:
            return
        where = f"kernel {self.name}"
        for p, a in zip(self.params, args):
            if p.is_pointer:
                capture.note(p.name, where, asarray(a), written=not p.is_const_pointer)
        capture.note_kernel(self._handles_on(stream.device), self._flags, self)

    def _raise_launch_error(self, err: int) -> None:
        """A failed native launch: a negative code is ``cuCtxSetCurrent``'s CUresult, a positive one the launch's."""
        drv = _driver.driver()
        call = "cuCtxSetCurrent" if err < 0 else "cuLaunchKernel"
        raise _driver.CudaError(call, drv.CUresult(abs(err)), f"kernel {self.name}")


# ----------------------------------------------------------------------------
# The launchers: what kernel[...] binds
# ----------------------------------------------------------------------------


def launch_on_stream(launch: tuple, *args: Any) -> None:
    """``kernel[grid, block, shared_mem, stream](*args)``: ``launch`` is ``(kernel, stream, config)``.

    Every argument check runs before the driver is touched (the kernel's packer,
    specialized for the kinds of arguments the last launch had); then, unless
    something is left to do (the first launch on this stream, more shared memory
    than the default, a capture underway), the native launch alone.
    """
    kernel, stream, config = launch
    if streams_capturing:  # a capture must hear what the launch uses
        return _launch_noted(kernel, stream, config, args)
    data = kernel._packer.current(args, stream)
    if data is None:  # other kinds of arguments than last time
        data = kernel._packer.pack(args, stream)
    _, address, context, function, native, geo = config[0]
    if context is None:
        _, address, context, function, native, geo = _prepared(kernel, stream, config)
    # The native call makes the device's primary context current if another
    # library switched it, then launches; cuLaunchKernel copies the packed bytes.
    err = native(function, context, address, geo, data)
    if err != 0:
        kernel._raise_launch_error(err)


def launch_on_current(launch: tuple, *args: Any) -> None:
    """``kernel[grid, block](*args)``: :func:`launch_on_stream` on the current stream (``launch``: kernel, config)."""
    kernel, config = launch
    if streams_capturing:
        return _launch_noted(kernel, None, config, args)
    data = kernel._packer.current(args, None)
    if data is None:
        data = kernel._packer.pack(args, None)
    # current_stream() without its two calls (it makes the thread's first one).
    stream = thread_streams.streams.get(thread_state.device) or current_stream()
    ref, address, context, function, native, geo = config[0]
    if ref() is not stream or context is None:
        _, address, context, function, native, geo = _prepared(kernel, stream, config)
    err = native(function, context, address, geo, data)
    if err != 0:
        kernel._raise_launch_error(err)


def launch_with(kernel: KernelLaunching, stream: Stream | None, config: list, args: tuple) -> None:
    """``kernel.launch(*args, ...)``: the launchers' work, with the arguments as a tuple.

    (A launcher's function takes them one by one: that is how a bound method is
    called. Passing them on with ``f(*args)`` would cost more than this copy.)
    """
    if streams_capturing:
        return _launch_noted(kernel, stream, config, args)
    data = kernel._packer.current(args, stream)
    if data is None:
        data = kernel._packer.pack(args, stream)
    if stream is None:
        stream = thread_streams.streams.get(thread_state.device) or current_stream()
    ref, address, context, function, native, geo = config[0]
    if ref() is not stream or context is None:
        _, address, context, function, native, geo = _prepared(kernel, stream, config)
    err = native(function, context, address, geo, data)
    if err != 0:
        kernel._raise_launch_error(err)


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _no_stream() -> None:
    """The stream reference of a configuration for the current stream, or before its first launch."""
    return None


def _launch_noted(kernel: KernelLaunching, stream: Stream | None, config: list, args: tuple) -> None:
    """A launch while a capture is underway: as the others, telling a capture on its stream what it uses."""
    data, operands = kernel._packer.pack_operands(args, stream)  # foreign arrays wrapped, for the capture
    if stream is None:
        stream = current_stream()
    if kernel._h_kernel is None:
        kernel._load()
    _driver.ensure_context(stream.device)  # the kernel's CUfunction is looked up in it
    kernel._note_operands(stream, operands)
    _, address, context, function, native, geo = _prepared(kernel, stream, config)
    err = native(function, context, address, geo, data)
    if err != 0:
        kernel._raise_launch_error(err)


def _prepared(kernel: KernelLaunching, stream: Stream, config: list) -> tuple:
    """What a launch the fast path left needs, as ``config[0]``: the kernel loaded, the limit raised, the context.

    Remembers it in ``config`` (the stream's address, its device's primary
    context, the loaded kernel), so that the next launch on this stream needs
    nothing of this.
    """
    if kernel._h_kernel is None:
        kernel._load()
    address, device = int(stream), stream.device
    _, geo, shared_mem, _ = config
    grid, block, _ = unpack_geometry(geo)
    kernel._check_limits(device, grid, block)  # the device's and the kernel's own, named before CUDA refuses
    if shared_mem > kernel._shared_limit(device):  # raised per device: each device keeps its own
        kernel._raise_shared_limit(shared_mem, device)
    context = _driver.context_address(device)
    ready = (weakref.ref(stream), address, context, kernel._function_address, kernel._native_launch, geo)
    if shared_mem <= DEFAULT_SHARED_LIMIT:  # one tuple, replaced whole: a reader sees one stream's values
        config[0] = ready
    return ready


# ----------------------------------------------------------------------------
# For jaxgraph.diagnostics: the argument checks, launches that stop before the driver
# ----------------------------------------------------------------------------


def reference_checks(kernel: KernelLaunching) -> Callable[[tuple], tuple[list, tuple]]:
    """``kernel``'s reference argument checks, ``(args) -> (values, operands)`` (the packer's ``values``)."""
    return kernel._packer.values

STAND_IN_FUNCTION = 0xF00  # the "loaded" function's address while launches stop before the driver


@contextlib.contextmanager
def stopped_before_driver(kernel: KernelLaunching) -> Iterator[None]:
    """Inside the block, ``kernel`` counts as loaded and its native launch returns success untouched.

    Every launch does all of its host work (checks, packing, configurations) and
    no driver call. The kernel's loaded state is put back on exit; configurations
    prepared before or inside the block are prepared again at their next launch.
    """
    saved = kernel._h_kernel, kernel._function_address, kernel._native_launch
    _forget_prepared(kernel)
    kernel._h_kernel, kernel._function_address = 1, STAND_IN_FUNCTION
    kernel._native_launch = _launched
    try:
        yield
    finally:
        kernel._h_kernel, kernel._function_address, kernel._native_launch = saved
        _forget_prepared(kernel)


def _launched(*args: Any) -> int:
    """The native launch while it stops before the driver: success (0)."""
    return 0


def _forget_prepared(kernel: KernelLaunching) -> None:
    """Each kept configuration looks its stream, context and loaded kernel up again at its next launch."""
    for config in kernel._launch_configs.values():
        config[0] = (_no_stream, 0, None, 0, None, config[1])
