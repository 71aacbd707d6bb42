"""Custom CUDA C++ kernels: compile once, launch on the current stream.

>>> k = jaxgraph.Kernel(SRC, "axpy")            # NVRTC -> cubin (disk-cached)
>>> k[blocks, 256](y, x, 2.0, n)                 # launch on the current stream
>>> k.launch(y, x, 2.0, n, grid=blocks, block=256, shared_mem=0)

Arguments are checked against the kernel's parameter list before anything
reaches the GPU: the count, arrays for pointers (with the element type when
the pointer has one), numbers for scalars, converted to the declared C type.
A wrong call is a ``TypeError``, never a launch with garbage.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from typing import Any, Sequence

import numpy as np

from . import _captures, _driver
from ._array import HOST_JAX_ARRAY_FIX, DeviceArray, asarray, is_host_jax_array
from ._compile import CompiledKernel, compile_kernel
from ._cubin import check_param_sizes, param_sizes
from ._kernel_load import DEFAULT_SHARED_LIMIT, KernelLoading
from ._signature import (Param, access_flags, check_against_source, check_count, check_pointer_dtype, dim3,
                         find_signature, not_an_array, pack_error, parse_signature, scalar_value)
from ._stream import Stream, current_stream

__all__ = ["Kernel"]

_SLOT = 8  # bytes per parameter slot in the packed argument buffer


# ----------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------


class Kernel(KernelLoading):
    """A CUDA C++ kernel compiled with NVRTC for the current device's architecture.

    Parameters
    ----------
    source : str
        CUDA C++ source holding a ``__global__`` function.
    name : str
        The kernel's name; a template instance like ``"axpy<float>"`` works.
    options : cuda.core.ProgramOptions or dict, optional
        NVRTC options, e.g. ``{"std": "c++17", "use_fast_math": True}``.
    signature : str, optional
        The parameter list, e.g. ``"float* y, const float* x, float a, int n"``,
        when it cannot be read from ``source`` (macros, typedefs).
    arch : str, optional
        Compile for this GPU architecture (``"sm_90"``) instead of the current
        device's; this is how to compile on a machine without a GPU. Virtual
        architectures (``"compute_90"``, PTX) are refused; the error lists
        the valid ones.
    cache_dir : path, optional
        Cubin cache directory (default ``$JAXGRAPH_CACHE_DIR``, else
        ``$XDG_CACHE_HOME/jaxgraph/kernels`` or ``~/.cache/jaxgraph/kernels``).

    Raises
    ------
    TypeError
        ``source`` or ``name`` is not a non-empty string, or ``options`` is
        neither a ``ProgramOptions`` nor a dict of its fields.
    jaxgraph.CompileError
        NVRTC rejected the source, or the template arguments of ``name``; the
        message names NVRTC's result and contains its log.
    ValueError
        The parameter list could not be read (pass ``signature=``), or
        ``arch`` is not a GPU architecture NVRTC compiles cubins for.
    TypeError
        The parameter list (read or given as ``signature=``) disagrees with
        the compiled kernel's parameters.

    Notes
    -----
    A kernel is launched as ``k[grid, block](*args)``, not called directly.
    """

    def __init__(self, source: str, name: str, options: Any = None, *, signature: str | None = None,
                 arch: str | None = None, cache_dir: str | os.PathLike | None = None):
        if not isinstance(source, str) or not source.strip():
            raise TypeError(f"source must be a non-empty string of CUDA C++, got {type(source).__name__}")
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be the kernel's name as a string, got {name!r}")
        # The name is looked up first, then NVRTC instantiates it (a bad template
        # argument is its error), then the parameter types are read and checked.
        text = signature if signature is not None else find_signature(source, name)
        self._compiled: CompiledKernel = compile_kernel(source, name, options, arch=arch, cache_dir=cache_dir)
        self.name = name
        params = parse_signature(text)
        self.params: tuple[Param, ...] = params
        self._signature_origin = "given as signature=" if signature is not None else "read from the source"
        sizes = param_sizes(self._compiled.cubin, self._compiled.lowered_name)
        if sizes is not None:  # the cubin says; otherwise the driver's view is checked at load
            check_param_sizes(name, params, sizes, self._signature_origin)
        if signature is not None:  # same sizes, other types (int for float) only the source can tell
            check_against_source(name, params, source, name)
        self._fmt = "<" + "".join(p.pack_format for p in params)
        self._library = None          # cuda.core ObjectCode; keeps the CUlibrary loaded
        self._core = None             # the cuda.core Kernel (parameter info, attributes)
        self._h_kernel = None         # CUkernel, as a CUfunction for cuLaunchKernel
        self._function_address = 0    # int(self._h_kernel)
        self._native_launch = None    # jaxgraph._launch.launch, bound at load
        self._shared_limit = DEFAULT_SHARED_LIMIT
        self._functions: dict[int, int] = {}  # device -> CUfunction of the loaded kernel
        self._flags = access_flags(params)  # per parameter: r (only read), w (other pointer), s (scalar)
        self._lock = threading.Lock()
        nslots = max(len(params), 1)
        # One persistent argument buffer and the void* array pointing into it:
        # a launch packs its arguments with a single struct.pack_into call.
        self._args_buffer = ctypes.create_string_buffer(nslots * _SLOT)
        base = ctypes.addressof(self._args_buffer)
        self._param_ptrs = (ctypes.c_void_p * nslots)(*[base + i * _SLOT for i in range(nslots)])
        self._param_ptrs_addr = ctypes.addressof(self._param_ptrs)

    # -- introspection ----------------------------------------------------------

    @property
    def cubin(self) -> bytes:
        """The compiled machine code."""
        return self._compiled.cubin

    @property
    def arch(self) -> str:
        """The GPU architecture the cubin was compiled for, e.g. ``"sm_90"``."""
        return self._compiled.arch

    @property
    def lowered_name(self) -> str:
        """The kernel's symbol in the cubin (mangled unless ``extern "C"``)."""
        return self._compiled.lowered_name

    @property
    def cache_hit(self) -> bool:
        """Whether the cubin came from the disk cache instead of NVRTC."""
        return self._compiled.cache_hit

    @property
    def cache_path(self):
        """Path of the cached cubin, or ``None`` when caching is off."""
        return self._compiled.cache_path

    @property
    def handle(self) -> Any:
        """The loaded ``CUkernel`` (as a ``CUfunction``); loads the cubin on first use.

        .. caution:: A raw handle: valid while this Kernel lives.
        """
        with self._lock:
            return self._h_kernel if self._h_kernel is not None else self._load_locked()

    def __repr__(self) -> str:
        sig = ", ".join(f"{p.ctype} {p.name}" for p in self.params)
        return f"<jaxgraph.Kernel {self.name}({sig}) {self.arch}>"

    # -- launching --------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        """Not a launch: raises ``TypeError`` saying to use ``kernel[grid, block](*args)``."""
        raise TypeError(f"kernel {self.name} is not called directly: launch it with a grid and a block as "
                        "kernel[grid, block](*args) (or kernel.launch(*args, grid=..., block=...)); inside "
                        "jax.jit, use kernel.jax_call(...)")

    def __getitem__(self, config: tuple) -> "_BoundLaunch":
        """``kernel[grid, block]``, ``[grid, block, shared_mem]`` or ``[grid, block, shared_mem, stream]``."""
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise TypeError("use kernel[grid, block], kernel[grid, block, shared_mem] "
                            "or kernel[grid, block, shared_mem, stream]")
        return _BoundLaunch(self, *config)

    def launch(self, *args: Any, grid: int | Sequence[int], block: int | Sequence[int],
               shared_mem: int = 0, stream: Stream | None = None) -> None:
        """Launch on ``stream`` (default: the current stream) with checked arguments.

        Parameters
        ----------
        *args
            One per kernel parameter: device arrays (:class:`DeviceArray`,
            jax.Array, CuPy, torch) for pointers, numbers for scalars.
        grid, block : int or tuple of up to 3 ints
        shared_mem : int
            Dynamic shared memory in bytes.
        stream : Stream, optional
        """
        self._launch(dim3(grid, "grid"), dim3(block, "block"), int(shared_mem), stream, args)

    def _launch(self, grid: tuple, block: tuple, shared_mem: int, stream: Stream | None, args: tuple) -> None:
        # Every argument check happens before the driver is touched; foreign
        # arrays come back wrapped, ordered after their producer's stream.
        values, args = self._values(args, stream)
        with self._lock:  # the argument buffer is shared; cuLaunchKernel copies it
            try:
                struct.pack_into(self._fmt, self._args_buffer, 0, *values)
            except (struct.error, OverflowError) as exc:
                raise self._pack_error(values, exc) from None
            if stream is None:
                stream = current_stream()
            device = _driver.ensure_context(stream.device)
            if self._h_kernel is None:
                self._load_locked()
            if _captures.any_underway():  # tell a capture on this stream what the launch uses
                self._note_operands(stream, args)
            if shared_mem > self._shared_limit:
                self._raise_shared_limit(shared_mem, device)
            err = self._native_launch(self._function_address, grid[0], grid[1], grid[2], block[0],
                                      block[1], block[2], shared_mem, int(stream),
                                      self._param_ptrs_addr)
        if err != 0:
            drv = _driver.driver()
            raise _driver.CudaError("cuLaunchKernel", drv.CUresult(err), f"kernel {self.name}")

    def _note_operands(self, stream: Stream, args: tuple) -> None:
        """Report this launch's array operands, and which it only reads, to a graph capturing on ``stream``."""
        capture = _captures.capture_on(stream)
        if capture is None:
            return
        where = f"kernel {self.name}"
        for p, a in zip(self.params, args):
            if p.is_pointer:
                capture.note(p.name, where, asarray(a))
        capture.note_kernel(self._handles_on(stream.device), self._flags, self)

    def _values(self, args: tuple, stream: Stream | None = None) -> tuple[list, tuple]:
        """The launch's values, checked (addresses for pointers, Python scalars for the rest),
        and ``args`` with foreign arrays wrapped once, for :meth:`_note_operands`."""
        params = self.params
        if len(args) != len(params):
            check_count(self.name, params, args)
        values = []
        wrapped = None
        for i, (p, a) in enumerate(zip(params, args)):
            if p.is_pointer:
                if type(a) is not DeviceArray:
                    a = _device_operand(a, p, self.name, stream)
                    wrapped = wrapped if wrapped is not None else list(args)
                    wrapped[i] = a
                if p.dtype is not None and a.dtype != p.dtype:
                    check_pointer_dtype(self.name, p, a.dtype)
                values.append(a.ptr)
            else:
                values.append(scalar_value(self.name, p, a))
        return values, (args if wrapped is None else tuple(wrapped))

    def _pack_error(self, values: list, exc: Exception) -> TypeError:
        for p, v in zip(self.params, values):
            try:
                struct.pack("<" + p.pack_format, v)
            except (struct.error, OverflowError) as param_exc:
                return pack_error(self.name, p, v, param_exc)
        return TypeError(f"kernel {self.name}: could not pack arguments: {exc}")

    # -- inside jax.jit -----------------------------------------------------------

    def jax_call(self, *args: Any, grid: int | Sequence[int] | None = None,
                 block: int | Sequence[int] = 256, shared_mem: int = 0,
                 inout: Sequence[str] = ()) -> Any:
        """Run this kernel on JAX arrays, inside or outside ``jax.jit``.

        The call lowers to one XLA FFI custom call (``jaxgraph_launch``) that
        launches the kernel on XLA's stream, in order with the XLA operations
        around it; XLA may record it into its command buffers.

        Parameters
        ----------
        *args
            One per kernel parameter, in order:

            - a pointer the kernel only reads: a JAX array (or numpy array);
            - a pointer the kernel writes: ``jax.ShapeDtypeStruct(shape, dtype)``,
              which declares a new output (its initial contents are undefined:
              the kernel must write every element it is expected to produce);
            - a pointer the kernel reads *and* writes: a JAX array, with the
              parameter's name in ``inout``;
            - a scalar: a Python number (or numpy scalar of the exact type),
              converted to the parameter's C type and baked into the
              compiled function as an attribute. Traced values cannot be
              scalars; pass them through a pointer parameter instead.
        grid : int or tuple, optional
            Blocks per grid. Default: enough 1-D blocks for one thread per
            element of the first output, ``ceil(size / block)``.
        block : int or tuple
            Threads per block (default 256).
        shared_mem : int
            Dynamic shared memory in bytes.
        inout : sequence of str
            Names of pointer parameters updated in place. XLA aliases each
            such input with its output; donate the input
            (``jax.jit(..., donate_argnums=...)``) to avoid a copy.

        Returns
        -------
        jax.Array or tuple of jax.Array
            The outputs (``ShapeDtypeStruct`` and ``inout`` parameters) in
            parameter order; a single array when there is one.

        Raises
        ------
        TypeError
            Wrong number of arguments, something other than an array for a
            pointer, an array of the wrong dtype for a typed pointer, a scalar
            that does not fit its C type, or ``grid``, ``block``,
            ``shared_mem`` or ``inout`` of the wrong type.
        ValueError
            No outputs, ``inout`` names something that is not a pointer, a
            negative ``shared_mem`` or a dimension below 1, or no ``grid``
            with a multi-dimensional ``block``.

        Examples
        --------
        >>> k = jaxgraph.Kernel(SRC, "saxpy")   # saxpy(float* y, const float* x, float a, int n)
        >>> f = jax.jit(lambda y, x: k.jax_call(y, x, 2.0, x.size, inout=("y",)))
        >>> k2 = jaxgraph.Kernel(SRC, "add_one")  # add_one(float* y, const float* x, int n)
        >>> y = k2.jax_call(jax.ShapeDtypeStruct(x.shape, x.dtype), x, x.size)
        """
        from ._jax_launch import kernel_call

        return kernel_call(self, *args, grid=grid, block=block, shared_mem=shared_mem, inout=inout)


class _BoundLaunch:
    """``kernel[grid, block, ...]``: a launch configuration waiting for its arguments."""

    __slots__ = ("_kernel", "_grid", "_block", "_shared_mem", "_stream")

    def __init__(self, kernel: Kernel, grid: Any, block: Any, shared_mem: int = 0, stream: Stream | None = None):
        if stream is not None and not isinstance(stream, Stream):
            raise TypeError(f"stream must be a jaxgraph.Stream, got {type(stream).__name__}")
        self._kernel = kernel
        self._grid = dim3(grid, "grid")
        self._block = dim3(block, "block")
        self._shared_mem = int(shared_mem)
        self._stream = stream

    def __call__(self, *args: Any) -> None:
        self._kernel._launch(self._grid, self._block, self._shared_mem, self._stream, args)


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------

def _device_operand(value: Any, p: Param, kernel: str, stream: Stream | None) -> DeviceArray:
    if isinstance(value, np.ndarray):
        raise not_an_array(kernel, p, value, " (host memory); copy it with jaxgraph.asarray(x) first")
    if not hasattr(value, "__cuda_array_interface__"):
        if is_host_jax_array(value):
            raise not_an_array(kernel, p, value, f" (a jax.Array on the CPU): {HOST_JAX_ARRAY_FIX}")
        raise not_an_array(kernel, p, value)
    return asarray(value, stream=stream)  # the launch's stream waits for the array's producer
