"""What a cubin declares, read from its ELF image without a GPU or a driver.

NVRTC's cubins are ELF files. For each kernel, the section
``.nv.info.<symbol>`` holds attributes the driver reads at load time; one
``EIATTR_KPARAM_INFO`` record per kernel parameter gives its ordinal and size.
Reading them lets a :class:`~jaxgraph.Kernel` check a ``signature=`` against the
instantiated kernel when it is compiled, on any machine, instead of when a GPU
first loads it.
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

__all__ = ["check_param_sizes", "is_cubin", "param_sizes"]

_ELF_MAGIC = b"\x7fELF"
_EIFMT_SVAL = 4          # an attribute with a 16-bit length and a payload; the others take 4 bytes
_EIATTR_KPARAM_INFO = 0x17


def is_cubin(code: bytes) -> bool:
    """Whether ``code`` looks like a cubin (a 64-bit little-endian ELF image), not empty or PTX."""
    return len(code) > 64 and code[:4] == _ELF_MAGIC and code[4] == 2 and code[5] == 1


def param_sizes(cubin: bytes, symbol: str) -> list[int] | None:
    """The byte size of each parameter of kernel ``symbol`` in ``cubin``, in order.

    ``None`` where the cubin does not say (no such section, or a layout this
    reader does not know): callers then fall back to the driver's view at load.
    """
    try:
        info = _sections(cubin).get(f".nv.info.{symbol}")
        if info is None:
            return None
        sizes: dict[int, int] = {}
        i = 0
        while i + 4 <= len(info):
            fmt, attr = info[i], info[i + 1]
            if fmt == _EIFMT_SVAL:
                (length,) = struct.unpack_from("<H", info, i + 2)
                payload, i = info[i + 4: i + 4 + length], i + 4 + length
            else:
                payload, i = b"", i + 4
            if attr == _EIATTR_KPARAM_INFO and len(payload) >= 12:
                _, ordinal, _, packed = struct.unpack_from("<IHHI", payload)
                sizes[ordinal] = (packed >> 18) & 0x3FFF
        if sorted(sizes) != list(range(len(sizes))):
            return None
        return [sizes[k] for k in range(len(sizes))]
    except (struct.error, IndexError, ValueError):
        return None


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def check_param_sizes(kernel: str, params: Sequence[Any], sizes: list[int], origin: str) -> None:
    """Raise ``TypeError`` unless ``params`` imply the parameter ``sizes`` the compiled kernel declares.

    ``params`` are the kernel's ``Param`` objects, ``sizes``
    those of :func:`param_sizes` or of the loaded kernel (the driver's view);
    ``origin`` says where the list came from (``"read from the source"``).
    """
    expected = [8 if p.is_pointer else p.dtype.itemsize for p in params]
    if sizes != expected:
        raise TypeError(
            f"kernel {kernel}: the compiled kernel's {len(sizes)} parameters have sizes {sizes} bytes, "
            f"but the signature {origin} ({', '.join(p.ctype for p in params)}) "
            f"implies {expected}; pass signature= with the real parameter types"
        )


def _sections(elf: bytes) -> dict[str, bytes]:
    """Section name -> contents of a 64-bit little-endian ELF image."""
    if not is_cubin(elf):
        return {}
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + k * shentsize) for k in range(shnum)]
    names_at = headers[shstrndx][4]

    def name(offset: int) -> str:
        start = names_at + offset
        return elf[start: elf.index(b"\0", start)].decode("ascii", "replace")

    return {name(h[0]): elf[h[4]: h[4] + h[5]] for h in headers}
