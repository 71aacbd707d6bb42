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

import os
import threading
from typing import Any, Sequence

from .compile import CompiledKernel, compile_kernel
from .cubin import check_param_sizes, param_sizes
from .eager_launch import KernelLaunching
from .packer import ArgumentPacker
from .signature import Param, access_flags, check_against_source, find_signature, parse_signature

__all__ = ["Kernel"]


# ----------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------


class Kernel(KernelLaunching):
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
        when it cannot be read from ``source`` (macros, typedefs). Where the
        source's list can be read, the types must agree with it, ``const``
        included (``float* x`` for the source's ``const float* x`` is a
        ``TypeError`` naming the parameter).
    arch : str, optional
        Compile for this GPU architecture (``"sm_90"``) instead of the current
        device's; this is how to compile on a machine without a GPU. Virtual
        architectures (``"compute_90"``, PTX) are refused; the error lists
        the valid ones.
    cache_dir : path, optional
        Cubin cache directory (default ``$JAXGRAPH_CACHE_DIR``, else
        ``$XDG_CACHE_HOME/jaxgraph/kernels`` or ``~/.cache/jaxgraph/kernels``).
        Entries are keyed by everything that changes the cubin, included
        headers too, and checked against their SHA-256 when loaded; a
        directory others can write is not used (a warning says so). See
        :func:`jaxgraph.compile_kernel`.

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

    Attributes
    ----------
    name : str
        The kernel's name as given, e.g. ``"axpy<float>"``.
    params : tuple of Param
        Its parameters in order, as read from the source or ``signature``.

    Notes
    -----
    A kernel is launched as ``k[grid, block](*args)``, not called directly.
    Scalars are converted to the declared C type when they fit it: a Python
    ``bool`` is refused for an integer parameter (it is most often a flag
    in a count's place; pass ``int(flag)``), and a ``bool`` parameter takes it.
    Grid and block are checked against CUDA's limits (1024 threads per
    block, block dimensions up to (1024, 1024, 64), grid dimensions up to
    (2**31 - 1, 65535, 65535)), then at the first launch on a device against
    that device's limits and the kernel's own most threads per block
    (registers or ``__launch_bounds__`` can lower it), and dynamic shared
    memory against the device's opt-in limit: a ``ValueError`` names the
    limit and the value before the driver sees the launch. Every array
    argument must be on the launch's device (its stream's, or the current
    device for the current stream): an array of another device is a
    ``ValueError`` naming both devices, raised before the launch. A dynamic
    shared-memory size over the default 48 KiB is raised for the kernel on
    each device as a launch there first asks for it.
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
        self._packer = ArgumentPacker(name, params)
        # Checked launch configurations, as plain data (nothing in them refers back to
        # the kernel: a cycle would delay its unloading), and geometries apart from streams.
        self._launch_configs: dict[tuple, list] = {}
        self._geometries: dict[tuple, bytes] = {}
        self._library = None          # cuda.core ObjectCode; keeps the CUlibrary loaded
        self._core = None             # the cuda.core Kernel (parameter info, attributes)
        self._h_kernel = None         # CUkernel, as a CUfunction for cuLaunchKernel
        self._function_address = 0    # int(self._h_kernel)
        self._native_launch = None    # jaxgraph._launch.launch, bound at load
        self._shared_limits: dict[int, int] = {}  # device -> dynamic shared memory raised to (default: 48 KiB)
        self._functions: dict[int, int] = {}  # device -> CUfunction of the loaded kernel
        self._thread_limits: dict[int, int] = {}  # device -> most threads per block (registers, launch bounds)
        self._limits_checked: set = set()  # (device, grid, block) checked against the device's limits
        self._flags = access_flags(params)  # per parameter: r (only read), w (other pointer), s (scalar)
        self._lock = threading.Lock()  # loading

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
        return self._h_kernel if self._h_kernel is not None else self._load()

    def __repr__(self) -> str:
        sig = ", ".join(f"{p.ctype} {p.name}" for p in self.params)
        return f"<jaxgraph.Kernel {self.name}({sig}) {self.arch}>"

    # -- launching --------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        """Not a launch: raises ``TypeError`` saying to use ``kernel[grid, block](*args)``."""
        raise TypeError(f"kernel {self.name} is not called directly: launch it with a grid and a block as "
                        "kernel[grid, block](*args) (or kernel.launch(*args, grid=..., block=...)); inside "
                        "jax.jit, use kernel.jax_call(...)")

    # -- inside jax.jit -----------------------------------------------------------

    def jax_call(self, *args: Any, grid: int | Sequence[int] | None = None,
                 block: int | Sequence[int] = 256, shared_mem: int = 0,
                 inout: Sequence[str] = ()) -> Any:
        """Run this kernel on JAX arrays, inside or outside ``jax.jit``.

        The call lowers to one XLA FFI custom call (``jaxgraph_launch``) that
        launches the kernel on XLA's stream, in order with the XLA operations
        around it; XLA may record it into its command buffers.

        Once traced (on a machine with a GPU), the kernel's code stays loaded
        until the process exits, after this Kernel is collected too: a
        compiled function, or XLA's recording of it, may launch it at any
        later time without asking jaxgraph, and jaxgraph cannot see when JAX
        drops its executable. So ``f = jax.jit(lambda x: k.jax_call(...))``
        keeps working after ``k`` is rebound. What stays is the code (the
        cubin, loaded once per process), never data.

        Parameters
        ----------
        *args
            One per kernel parameter, in order:

            - a pointer the kernel only reads: a JAX array (or numpy array);
            - a pointer the kernel writes (not ``const``):
              ``jax.ShapeDtypeStruct(shape, dtype)``, which declares a new
              output (its initial contents are undefined: the kernel must
              write every element it is expected to produce). A ``const T*``
              parameter is refused as an output: the kernel cannot write it;
            - a pointer the kernel reads *and* writes: a JAX array, with the
              parameter's name in ``inout`` (a ``const T*`` parameter is
              refused there too);
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
            pointer, an array of the wrong dtype for a typed pointer, a
            :class:`jax.ShapeDtypeStruct` for a ``const`` pointer or a
            ``const`` pointer named in ``inout``, a scalar
            that does not fit its C type, or ``grid``, ``block``,
            ``shared_mem`` or ``inout`` of the wrong type.
        ValueError
            No outputs, ``inout`` names something that is not a pointer, a
            negative ``shared_mem`` or a dimension below 1, no ``grid``
            with a multi-dimensional ``block``, or a grid or block over
            CUDA's limits (where a GPU exists: over each device's, or the
            kernel's own most threads per block, or more dynamic shared
            memory than a device allows); the message names the limit.

        Examples
        --------
        >>> k = jaxgraph.Kernel(SRC, "saxpy")   # saxpy(float* y, const float* x, float a, int n)
        >>> f = jax.jit(lambda y, x: k.jax_call(y, x, 2.0, x.size, inout=("y",)))
        >>> k2 = jaxgraph.Kernel(SRC, "add_one")  # add_one(float* y, const float* x, int n)
        >>> y = k2.jax_call(jax.ShapeDtypeStruct(x.shape, x.dtype), x, x.size)
        """
        # The lowering is JAX interop, a layer above; imported on call (tests/packaging/test_architecture.py).
        from .._jax_interop.kernel_call import kernel_call

        return kernel_call(self, *args, grid=grid, block=block, shared_mem=shared_mem, inout=inout)

