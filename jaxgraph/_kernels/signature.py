"""Kernel parameter lists, and the one argument encoder every launch uses.

A kernel's parameters decide how a launch packs its arguments: pointers take
device arrays, scalars take numbers converted to the declared C type. Knowing
them before anything reaches the GPU turns a wrong call into a ``TypeError``
instead of garbage. The parameter list is read from CUDA C++ source
(:func:`find_signature`, :func:`parse_signature`) or given explicitly.

The checks and the encoding of arguments (:func:`check_count`,
:func:`check_pointer_dtype`, :func:`scalar_value`, :func:`scalar_word`,
:func:`dim3`) are shared by eager launches (``kernel[grid, block](...)``) and
by ``Kernel.jax_call`` inside ``jax.jit``, so the same mistake gives the same
message on both paths. Every scalar travels in one 8-byte slot, little-endian.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._cuda.array import is_jax_object

__all__ = [
    "Param",
    "access_flags",
    "check_against_source",
    "check_count",
    "check_pointer_dtype",
    "dim3",
    "find_signature",
    "int_range",
    "not_an_array",
    "pack_error",
    "parse_signature",
    "scalar_value",
    "scalar_word",
]


@dataclass(frozen=True)
class Param:
    """One kernel parameter.

    Attributes
    ----------
    name : str
        The parameter's name in the source (``"p3"`` when unnamed).
    ctype : str
        The C type as written, normalised (``"const float*"``).
    is_pointer : bool
        Whether it takes a device array.
    dtype : numpy.dtype or None
        The scalar type, or for pointers the element type (``None`` when the
        pointee is not a plain scalar, e.g. ``void*`` or ``float4*``).
    """

    name: str
    ctype: str
    is_pointer: bool
    dtype: np.dtype | None

    @property
    def is_const_pointer(self) -> bool:
        """Whether this is a pointer to const data (``const float*``), which the kernel only reads."""
        if not self.is_pointer or self.ctype.count("*") != 1:
            return False
        return re.search(r"\bconst\b", self.ctype.split("*")[0]) is not None

    @property
    def pack_format(self) -> str:
        """``struct`` code that writes this parameter into its 8-byte slot."""
        if self.is_pointer:
            return "Q"
        code = _STRUCT_CODES[self.dtype.name]
        pad = 8 - struct.calcsize("<" + code)
        return code + ("x" * pad if pad else "")


# C spelling -> numpy dtype name (Linux LP64: long is 64-bit).
_SCALARS = {
    "bool": "bool",
    "char": "int8", "signed char": "int8", "int8_t": "int8",
    "unsigned char": "uint8", "uint8_t": "uint8",
    "short": "int16", "short int": "int16", "signed short": "int16", "int16_t": "int16",
    "unsigned short": "uint16", "unsigned short int": "uint16", "uint16_t": "uint16",
    "int": "int32", "signed": "int32", "signed int": "int32", "int32_t": "int32",
    "unsigned": "uint32", "unsigned int": "uint32", "uint32_t": "uint32",
    "long": "int64", "long int": "int64", "long long": "int64", "long long int": "int64",
    "int64_t": "int64", "ptrdiff_t": "int64", "intptr_t": "int64",
    "unsigned long": "uint64", "unsigned long int": "uint64", "unsigned long long": "uint64",
    "unsigned long long int": "uint64", "uint64_t": "uint64", "size_t": "uint64", "uintptr_t": "uint64",
    "float": "float32", "double": "float64",
    "__half": "float16", "half": "float16",
    "__nv_bfloat16": "bfloat16", "nv_bfloat16": "bfloat16",
}

_STRUCT_CODES = {
    "bool": "?", "int8": "b", "uint8": "B", "int16": "h", "uint16": "H", "int32": "i",
    "uint32": "I", "int64": "q", "uint64": "Q", "float16": "e", "float32": "f", "float64": "d",
    "bfloat16": "H",  # packed as its bit pattern
}

_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__restrict|restrict|struct|__grid_constant__)\b")


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # a JAX dependency

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def parse_signature(text: str) -> tuple[Param, ...]:
    """Parse a C parameter list such as ``"float* y, const float* x, float a, int n"`` (``""``, ``"void"``: none).

    Raises
    ------
    ValueError
        If a parameter's type is not a pointer or a known scalar type, or an
        entry is empty (``"int* counter,, int n"``, a trailing comma).
    """
    entries = _split_top_level(text, keep_empty=True)
    if len(entries) == 1 and entries[0].strip() in ("", "void"):
        return ()
    params = []
    for index, raw in enumerate(entries):
        decl = raw.split("=")[0].strip()          # drop default values
        if not decl or decl == "void":
            what = "empty" if not decl else repr(raw.strip())
            raise ValueError(f"kernel parameter {index + 1} of {len(entries)} in {text.strip()!r} is {what}: each "
                             "entry between commas must declare one parameter, such as 'int n'")
        is_array = decl.endswith("]")
        decl = re.sub(r"\[[^\]]*\]\s*$", "", decl).strip()
        name_match = re.search(r"([A-Za-z_]\w*)\s*$", decl)
        type_text = decl
        name = f"p{index}"
        if name_match and _QUALIFIERS.sub("", decl[: name_match.start()]).strip(" *&"):
            name = name_match.group(1)
            type_text = decl[: name_match.start()]
        stars = type_text.count("*") + (1 if is_array else 0)
        if "&" in type_text:
            raise ValueError(f"kernel parameter {raw.strip()!r}: references cannot be kernel parameters")
        base = " ".join(_QUALIFIERS.sub(" ", type_text.replace("*", " ")).split())
        base_dtype = _SCALARS.get(base)
        if not base or not re.fullmatch(r"[A-Za-z_][\w:<>, ]*", base):
            raise ValueError(f"kernel parameter {index + 1} ({raw.strip()!r}) names no type that C++ spells "
                             f"that way (read {base!r}); write it as, e.g., 'const float* x' or 'int n'")
        if stars > 1:
            params.append(Param(name, _normalize_ctype(type_text), True, None))
        elif stars == 1:
            dtype = _dtype(base_dtype) if base_dtype else None
            params.append(Param(name, _normalize_ctype(type_text), True, dtype))
        elif base_dtype is None:
            raise ValueError(
                f"kernel parameter {raw.strip()!r} has type {base!r}, which jaxgraph cannot pack; "
                "use pointers or scalar types (float, int, int64_t, __half, ...), "
                "or pass signature= spelling it as one of those"
            )
        else:
            params.append(Param(name, _normalize_ctype(type_text), False, _dtype(base_dtype)))
    return tuple(params)


def find_signature(source: str, name: str) -> str:
    """Return the parameter list of ``__global__`` kernel ``name`` in ``source``.

    ``name`` may be a template instance such as ``"axpy<float, 4>"``: the
    template's parameters are substituted by its arguments.

    Raises
    ------
    ValueError
        If no ``__global__`` definition of that name is found.
    """
    base, template_args = _split_name(name)
    code = re.sub(r"__launch_bounds__\s*\([^()]*\)", " ", _strip_comments(source))  # not the parameter list
    for match in re.finditer(r"__global__", code):
        head = code[match.end():]
        call = re.match(r"[^;{()]*?\b" + re.escape(base) + r"\s*\(", head)
        if not call:
            continue
        params = _balanced(head, call.end() - 1)
        if template_args:
            params = _substitute_template(code[: match.start()], template_args, params)
        elif re.search(r"template\s*<[^>]*>\s*$", code[: match.start()]):
            raise ValueError(f"kernel {base!r} is a template: name an instance of it, such as "
                             f"{base + '<float>'!r} (the template arguments it should be compiled with)")
        return params
    raise ValueError(
        f"no __global__ kernel named {base!r} found in the source; check the name or pass signature="
    )


def check_against_source(kernel: str, given: tuple[Param, ...], source: str, name: str) -> None:
    """Raise ``TypeError`` where a ``signature=`` contradicts the parameter types the source declares.

    Where the source's list cannot be read (macros, typedefs: why
    ``signature=`` exists) nothing is compared. An untyped pointer
    (``void*``, ``float4*``) on either side matches any pointer of the same
    constness: ``const`` on the pointee must agree (``float* x`` for the
    source's ``const float* x`` is refused, and the reverse), since it says
    which buffers the kernel only reads (``jax_call`` outputs, graph binding).
    """
    try:
        declared = parse_signature(find_signature(source, name))
    except ValueError:
        return
    if len(declared) != len(given):
        return  # the compiled kernel's parameter sizes say it (_cubin.check_param_sizes)
    for g, d in zip(given, declared):
        if (g.is_pointer != d.is_pointer or (g.dtype is not None and d.dtype is not None and g.dtype != d.dtype)
                or g.is_const_pointer != d.is_const_pointer):
            raise TypeError(f"kernel {kernel}: signature= gives parameter {g.name} as {g.ctype}, but the source "
                            f"declares {d.ctype} {d.name}; pass the source's types (or leave signature= out)")


def access_flags(params: tuple[Param, ...]) -> str:
    """Per parameter, ``r`` (a pointer to const: only read), ``w`` (another pointer) or ``s`` (a scalar).

    What a capture records of each kernel it sees, so replay inside ``jax.jit``
    binds XLA's buffers only where kernels read them (``Capture.note_kernel``).
    """
    return "".join("s" if not p.is_pointer else "r" if p.is_const_pointer else "w" for p in params)


# ----------------------------------------------------------------------------
# Arguments: checks and encoding shared by every launch
# ----------------------------------------------------------------------------


def check_count(kernel: str, params: tuple[Param, ...], args: tuple) -> None:
    """Raise ``TypeError`` unless there is one argument per parameter."""
    if len(args) != len(params):
        raise TypeError(f"kernel {kernel} takes {len(params)} arguments "
                        f"({', '.join(p.name for p in params)}), got {len(args)}")


def check_pointer_dtype(kernel: str, p: Param, dtype: Any) -> None:
    """Raise ``TypeError`` if an array of ``dtype`` does not match pointer ``p``'s element type."""
    if p.dtype is not None and np.dtype(dtype) != p.dtype:
        raise TypeError(f"kernel {kernel}: parameter {p.name} is {p.ctype}, got an array of {np.dtype(dtype)}")


def not_an_array(kernel: str, p: Param, value: Any, hint: str = "") -> TypeError:
    """The error for a pointer parameter given something that is not a device array."""
    return TypeError(f"kernel {kernel}: parameter {p.name} ({p.ctype}) takes a device array, "
                     f"got {type(value).__name__}{hint}")


def scalar_value(kernel: str, p: Param, value: Any) -> Any:
    """``value`` checked for scalar parameter ``p``: a Python value that ``p.pack_format`` packs.

    Integers must fit the C type; floats are not accepted for integer
    parameters, nor bools for numeric ones (``bool`` ones take them); a numpy scalar must have exactly
    the parameter's dtype; a JAX array is refused (scalars are baked into the
    launch). ``bfloat16`` becomes its 16-bit pattern.
    """
    kind = p.dtype.kind
    t = type(value)
    if t is int and kind in "iu":          # the common cases first: no further checks
        lo, hi = int_range(p.dtype)
        if lo <= value <= hi:
            return value
        raise TypeError(f"kernel {kernel}: parameter {p.name} is {p.ctype}, "
                        f"{value} is out of its range [{lo}, {hi}]")
    if t is float and kind == "f":
        return value
    return _scalar_slow(kernel, p, value)


def scalar_word(kernel: str, p: Param, value: Any) -> int:
    """``value`` converted to ``p``'s C type, little-endian in a signed 64-bit word."""
    checked = scalar_value(kernel, p, value)
    try:
        raw = struct.pack("<" + p.pack_format, checked)
    except (struct.error, OverflowError) as exc:
        raise pack_error(kernel, p, checked, exc) from None
    return struct.unpack("<q", raw)[0]


def pack_error(kernel: str, p: Param, value: Any, exc: Exception) -> TypeError:
    """The error for a checked value that still does not fit its C type (e.g. a float overflowing ``float``)."""
    return TypeError(f"kernel {kernel}: parameter {p.name} is {p.ctype}, got {type(value).__name__} "
                     f"{value!r} ({exc})")


def dim3(value: Any, what: str) -> tuple[int, int, int]:
    """A grid or block given as an int or 1 to 3 ints, as ``(x, y, z)``."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        dims = (int(value),)
    elif isinstance(value, (tuple, list)) and 1 <= len(value) <= 3:
        dims = tuple(int(v) for v in value)
    else:
        raise TypeError(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}")
    if any(d < 1 for d in dims):
        raise ValueError(f"{what} dimensions must be >= 1, got {dims}")
    return dims + (1,) * (3 - len(dims))


def _scalar_slow(kernel: str, p: Param, value: Any) -> Any:
    """:func:`scalar_value` for everything but an in-range int or a float of the right kind."""
    dtype = p.dtype
    if is_jax_object(value):
        raise TypeError(
            f"kernel {kernel}: parameter {p.name} ({p.ctype}) is a scalar, which is baked into the "
            f"launch; got a JAX array ({type(value).__name__}). Pass a Python number, or make the "
            "parameter a pointer and pass a 1-element array")
    if isinstance(value, np.generic):
        if value.dtype != dtype:
            raise TypeError(f"kernel {kernel}: parameter {p.name} is {p.ctype} ({dtype}), got a numpy "
                            f"{value.dtype} scalar; pass {dtype}(...) or a Python number")
        return _bits(value) if dtype.kind == "V" else value.item()
    if dtype.kind in "iub":
        if not isinstance(value, (int, bool)):
            raise TypeError(f"kernel {kernel}: parameter {p.name} is {p.ctype}, got "
                            f"{type(value).__name__} {value!r}")
        if isinstance(value, bool) and dtype.kind != "b":  # most often a flag given in a count's place
            raise TypeError(f"kernel {kernel}: parameter {p.name} is {p.ctype}, got bool {value!r}; pass "
                            f"{int(value)} (an int) if you mean it, or declare the parameter bool")
        return scalar_value(kernel, p, int(value)) if dtype.kind != "b" else bool(value)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"kernel {kernel}: parameter {p.name} is {p.ctype}, got {type(value).__name__}")
    return _bits(np.asarray(value, dtype=dtype)) if dtype.kind == "V" else float(value)


def _bits(value: Any) -> int:
    """The 16-bit pattern of a bfloat16 value (how it travels: ``struct`` has no bfloat16)."""
    return int(np.asarray(value).view(np.uint16))


_INT_RANGES: dict[np.dtype, tuple[int, int]] = {}


def int_range(dtype: np.dtype) -> tuple[int, int]:
    """The smallest and largest values of integer ``dtype``, as Python ints (cached)."""
    bounds = _INT_RANGES.get(dtype)
    if bounds is None:
        info = np.iinfo(dtype)
        bounds = _INT_RANGES[dtype] = (int(info.min), int(info.max))
    return bounds


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _normalize_ctype(text: str) -> str:
    text = re.sub(r"\b(__restrict__|__restrict|restrict|__grid_constant__)\b", " ", text)
    return " ".join(text.replace("*", " * ").split()).replace(" *", "*")


def _split_top_level(text: str, keep_empty: bool = False) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if keep_empty or "".join(current).strip():
        parts.append("".join(current))
    return parts


def _split_name(name: str) -> tuple[str, list[str]]:
    if "<" not in name:
        return name.strip(), []
    base, rest = name.split("<", 1)
    return base.strip(), [a.strip() for a in _split_top_level(rest.rsplit(">", 1)[0])]


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    return re.sub(r"//[^\n]*", " ", source)


def _balanced(text: str, open_index: int) -> str:
    depth = 0
    for i in range(open_index, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[open_index + 1: i]
    raise ValueError("unbalanced parentheses in the kernel's parameter list")


def _substitute_template(before: str, args: list[str], params: str) -> str:
    match = re.search(r"template\s*<([^>]*)>\s*$", before)
    if not match:
        raise ValueError("a template argument list was given but the kernel is not a template")
    names = [re.search(r"(\w+)\s*(=.*)?$", p.strip()).group(1) for p in _split_top_level(match.group(1))]
    for tname, value in zip(names, args):
        params = re.sub(r"\b" + re.escape(tname) + r"\b", value, params)
    return params
