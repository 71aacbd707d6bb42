"""JAX interop: FFI target registration, and custom kernels inside ``jax.jit``.

A :class:`~jaxgraph.Kernel` called on JAX arrays with :meth:`Kernel.jax_call
<jaxgraph.Kernel.jax_call>` lowers to one typed XLA FFI custom call,
``jaxgraph_launch``, whose handler (``ffi/launch/launch.cc``) launches the kernel on
the stream XLA runs the computation on::

    k = jaxgraph.Kernel(SRC, "saxpy")      # saxpy(float* y, const float* x, float a, int n)

    @jax.jit
    def f(x, y):
        return k.jax_call(y, x, 2.0, x.size, inout=("y",))   # y <- 2 x + y

The handler is declared command-buffer compatible, so XLA may record it into
its own CUDA graphs (``--xla_gpu_enable_command_buffer=...,CUSTOM_CALL``).

HLO never carries a raw pointer: each Kernel gets an integer id, and the
native library maps ids to loaded ``CUkernel`` handles. The id is what the
kernel is: 62 bits of the SHA-256 of its cubin and symbol, not an order of
tracing, so every process of a multi-process program lowers the same HLO for
the same function whatever it traced before; Kernels of the same code share
an id (one of them is in the table while any lives). The ids are chosen in
Python, so a function lowers for CUDA even on a machine without a GPU
(``lower(lowering_platforms=("cuda",))``); where a GPU exists, tracing also
loads the kernel into the table.

This module pairs with ``ffi/launch/launch.cc``: it encodes a call (with the
argument checks and encoding of ``_kernels/signature.py`` that eager launches use
too) into the attributes that handler decodes.
"""

from __future__ import annotations

import hashlib
import math
import threading
import weakref
from typing import Any, Sequence

import jax
import numpy as np

from .._cuda import driver as _driver
from .._kernels.launch_limits import check_geometry
from .._kernels.load import LoadedCode, check_launch_limits, reserve_shared_memory
from .._cuda.native import native, register_ffi_targets
from .._kernels.signature import check_count, check_pointer_dtype, dim3, not_an_array, scalar_word

__all__ = ["jaxgraph_launch", "kernel_call", "kernel_id"]

# ----------------------------------------------------------------------------
# Kernels inside jit
# ----------------------------------------------------------------------------


def kernel_call(kernel: Any, *args: Any, grid: int | Sequence[int] | None = None,
                block: int | Sequence[int] = 256, shared_mem: int = 0,
                inout: Sequence[str] = ()) -> Any:
    """Call ``kernel`` on JAX arrays; usable inside ``jax.jit``. See :meth:`Kernel.jax_call`."""
    params = kernel.params
    check_count(kernel.name, params, args)
    inout = _check_inout(kernel, inout)
    block3 = dim3(block, "block")
    shared_mem = _check_shared_mem(shared_mem)

    operands, results, aliases, codes, words = [], [], {}, [], []
    pending = []  # (param index, result index) of buffers that are results
    for index, (p, a) in enumerate(zip(params, args)):
        if not p.is_pointer:
            codes.append(-(len(words) + 1))
            words.append(scalar_word(kernel.name, p, a))
        elif isinstance(a, jax.ShapeDtypeStruct):
            if p.name in inout:
                raise TypeError(f"kernel {kernel.name}: parameter {p.name} is in inout=, so it "
                                "needs the array's current value, got a jax.ShapeDtypeStruct")
            if p.is_const_pointer:  # the kernel cannot write through it: the "output" would be garbage
                raise TypeError(f"kernel {kernel.name}: parameter {p.name} is {p.ctype}, which the kernel only "
                                "reads, so it cannot be a new output (a jax.ShapeDtypeStruct); pass an array "
                                "to read, or declare the parameter without const if the kernel writes it")
            check_pointer_dtype(kernel.name, p, a.dtype)
            pending.append((index, len(results)))
            results.append(jax.ShapeDtypeStruct(a.shape, a.dtype))
            codes.append(None)
        else:
            array = _operand(a, p, kernel.name)
            if p.name in inout:
                aliases[len(operands)] = len(results)
                pending.append((index, len(results)))
                results.append(jax.ShapeDtypeStruct(array.shape, array.dtype))
                codes.append(None)
            else:
                codes.append(len(operands))
            operands.append(array)
    if not results:
        raise ValueError(
            f"kernel {kernel.name}: a kernel call needs at least one output (XLA drops calls "
            "without results); pass a jax.ShapeDtypeStruct for a pointer the kernel writes, "
            "or name a read-write pointer in inout="
        )
    for index, result_index in pending:  # results follow the operands in the handler's list
        codes[index] = len(operands) + result_index
    grid3 = _derive_grid(kernel.name, grid, block3, results[0])
    check_geometry(kernel.name, grid3, block3)  # CUDA's limits, known without a device
    kid = kernel_id(kernel, shared_mem)  # where a device exists: loaded, its shared memory checked and reserved
    check_launch_limits(kernel, grid3, block3)  # each device's limits, and the kernel's own on it (none: no check)

    out = jaxgraph_launch(kid, operands, results, grid=grid3, block=block3,
                          shared_mem=shared_mem, params=codes, scalars=words,
                          input_output_aliases=aliases)
    return out[0] if len(out) == 1 else tuple(out)


def jaxgraph_launch(kernel: int, operands: Sequence[Any], results: Sequence[jax.ShapeDtypeStruct], *,
                    grid: Sequence[int], block: Sequence[int], shared_mem: int, params: Sequence[int],
                    scalars: Sequence[int], input_output_aliases: dict[int, int] | None = None) -> list:
    """Bind the ``jaxgraph_launch`` FFI call: the encoding :func:`kernel_call` produces.

    ``params`` has one code per kernel parameter: an index ``>= 0`` into
    ``operands + results``, or ``-(k + 1)`` for the 8-byte word ``scalars[k]``.
    The handler checks each code's range and their count against the
    kernel's parameter count (an ``InvalidArgument`` error at run time names
    both), so the driver never reads an argument that is not there.
    ``vmap`` runs the call once per batch element (``vmap_method="sequential"``),
    which is right for a kernel written for the unbatched shapes.
    """
    register_ffi_targets()
    call = jax.ffi.ffi_call("jaxgraph_launch", list(results), vmap_method="sequential",
                            input_output_aliases=dict(input_output_aliases or {}) or None)
    return call(*operands, kernel=np.int64(kernel), grid=np.asarray(grid, np.int64),
                block=np.asarray(block, np.int64), shared_mem=np.int64(shared_mem),
                params=np.asarray(params, np.int64), scalars=np.asarray(scalars, np.int64))


def kernel_id(kernel: Any, shared_mem: int = 0) -> int:
    """The id naming ``kernel`` in ``jaxgraph_launch`` attributes: derived from its code (cubin and symbol).

    The same in every process, whatever else it traced, and shared by Kernels
    of the same code. Where a CUDA device exists, the kernel is also loaded
    and entered into the native table (and allowed ``shared_mem`` bytes of
    dynamic shared memory on every device), so a computation traced here can
    run here.
    """
    with _ids_lock:
        kid = _kernel_ids.get(kernel)
        if kid is None:
            kid = _kernel_ids[kernel] = _code_id(kernel)
    if _driver.device_count() > 0:
        _load_kernel(kernel, kid, shared_mem)
    return kid


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------

_ids_lock = threading.Lock()
_kernel_ids: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
_codes: dict[int, bytes] = {}  # id -> the digest it was derived from (two codes never share an id)
# Kernel id -> the loaded code of the first Kernel of that code traced here (its library, not the Kernel),
# kept until the process exits: compiled functions, and XLA's recordings of them, launch the kernel after
# the user's Kernel is gone. Kernels of the same code share the id and so this one entry.
_kept_for_xla: dict[int, LoadedCode] = {}
_table_lock = threading.Lock()  # _kept_for_xla and the native launch table, changed together


def _code_id(kernel: Any) -> int:
    """62 bits of the SHA-256 of ``kernel``'s symbol and cubin (never 0); the caller holds ``_ids_lock``."""
    digest = hashlib.sha256(b"%s\0%s" % (kernel.lowered_name.encode(), kernel.cubin)).digest()
    kid = int.from_bytes(digest[:8], "little") & ((1 << 62) - 1) or 1
    if _codes.setdefault(kid, digest) != digest:  # 2**-62 per pair: say so rather than launch the wrong code
        raise RuntimeError(f"kernel {kernel.name}: its id {kid} (from its code's SHA-256) is already another "
                           "kernel's in this process; recompile it with any other option to change its code")
    return kid


def _load_kernel(kernel: Any, kid: int, shared_mem: int) -> None:
    """Enter ``kernel``'s code into the launch table under ``kid`` (once) and raise its shared-memory limit.

    The entry and the loaded library stay until the process exits, after the
    Kernel is collected too: a command buffer XLA recorded launches the
    kernel without calling the handler, so retiring the id would not stop it,
    and unloading the library would leave it launching unloaded code. Kernels
    of the same code share ``kid``: the table keeps the first one's loaded
    code (a :class:`LoadedCode`, which does not keep the Kernel alive), whose
    CUkernel's limit is the one raised.
    """
    # One thread at a time: two Kernels of the same code traced at once must not leave the table
    # launching one's library while the other's is the one kept.
    with _table_lock:
        kept = _kept_for_xla.get(kid)
        if kept is None:
            kept = LoadedCode(kernel)  # loads the cubin into the primary context
            native("launch").register_kernel(kid, int(kept._h_kernel), kernel.name, len(kernel.params))
            _kept_for_xla[kid] = kept
        reserve_shared_memory(kept, shared_mem)


def _check_inout(kernel: Any, inout: Any) -> frozenset:
    if isinstance(inout, str):
        inout = (inout,)
    try:
        names = frozenset(inout)
    except TypeError:
        raise TypeError(f"inout must be a sequence of parameter names, got {inout!r}") from None
    pointers = {p.name: p for p in kernel.params if p.is_pointer}
    for name in sorted(names):
        if name not in pointers:
            raise ValueError(f"kernel {kernel.name}: inout names {name!r}, which is not a pointer "
                             f"parameter (pointers: {', '.join(sorted(pointers)) or 'none'})")
        if pointers[name].is_const_pointer:  # as for a const output: XLA would get the input back as "written"
            raise TypeError(f"kernel {kernel.name}: inout names {name}, which is {pointers[name].ctype}: the kernel "
                            "only reads through it, so it cannot be an output; leave it out of inout=, or declare "
                            "the parameter without const if the kernel writes it")
    return names


def _check_shared_mem(shared_mem: Any) -> int:
    if not isinstance(shared_mem, (int, np.integer)) or isinstance(shared_mem, bool):
        raise TypeError(f"shared_mem must be an int number of bytes, got {shared_mem!r}")
    if shared_mem < 0:
        raise ValueError(f"shared_mem must be >= 0, got {shared_mem}")
    return int(shared_mem)


def _operand(value: Any, p: Any, kernel: str) -> Any:
    """A JAX array (or tracer) for pointer parameter ``p``, dtype-checked."""
    if isinstance(value, (bool, int, float, complex)) or not hasattr(value, "dtype"):
        raise not_an_array(kernel, p, value, "; for an output, pass jax.ShapeDtypeStruct(shape, dtype)")
    array = jax.numpy.asarray(value)
    check_pointer_dtype(kernel, p, array.dtype)
    return array


def _derive_grid(kernel: str, grid: Any, block: tuple, first: jax.ShapeDtypeStruct) -> tuple:
    if grid is not None:
        return dim3(grid, "grid")
    if block[1] != 1 or block[2] != 1:
        raise ValueError(f"kernel {kernel}: grid= is required with a multi-dimensional block {block}; "
                         "the derived grid covers one element per thread of a 1-D block")
    n = math.prod(first.shape)
    return (max(1, -(-n // block[0])), 1, 1)
