"""Kernel parameter lists: read from CUDA C++ source, or given explicitly.

A kernel's parameters decide how a launch packs its arguments: pointers take
device arrays, scalars take numbers converted to the declared C type. Knowing
them before anything reaches the GPU turns a wrong call into a ``TypeError``
instead of garbage.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import numpy as np

__all__ = ["Param", "find_signature", "parse_signature"]


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
    """Parse a C parameter list such as ``"float* y, const float* x, float a, int n"``.

    Raises
    ------
    ValueError
        If a parameter's type is not a pointer or a known scalar type.
    """
    params = []
    for index, raw in enumerate(_split_top_level(text)):
        decl = raw.split("=")[0].strip()          # drop default values
        if not decl or decl == "void":
            continue
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
    code = _strip_comments(source)
    for match in re.finditer(r"__global__", code):
        head = code[match.end():]
        call = re.match(r"[^;{()]*?\b" + re.escape(base) + r"\s*\(", head)
        if not call:
            continue
        params = _balanced(head, call.end() - 1)
        if template_args:
            params = _substitute_template(code[: match.start()], template_args, params)
        return params
    raise ValueError(
        f"no __global__ kernel named {base!r} found in the source; check the name or pass signature="
    )


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _normalize_ctype(text: str) -> str:
    text = re.sub(r"\b(__restrict__|__restrict|restrict|__grid_constant__)\b", " ", text)
    return " ".join(text.replace("*", " * ").split()).replace(" *", "*")


def _split_top_level(text: str) -> list[str]:
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
    if "".join(current).strip():
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
