"""CUDA C++ to cubin through NVRTC (cuda.core's ``Program``), with a disk cache.

Compiling needs NVRTC but no GPU: with ``arch`` given (e.g. ``"sm_90"``) it
works on a CPU-only machine. Cubins are cached on disk under
``$JAXGRAPH_CACHE_DIR`` (default ``$XDG_CACHE_HOME/jaxgraph/kernels``, or
``~/.cache/jaxgraph/kernels`` without ``XDG_CACHE_HOME``), keyed by what
changes the cubin: the source and the headers it includes, the kernel name,
the options, the architecture, the NVRTC build and the CUDA headers' version.
Entries are checked against their digest, and a directory someone else can
write is not used (``_kernels/cubin_cache.py`` says how).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cubin import is_cubin
from .cubin_cache import cache_directory, cache_key, read_entry, write_entry
from .._cuda.driver import CudaUnavailableError

__all__ = ["CompiledKernel", "CompileError", "check_arch", "compile_kernel", "default_arch", "kernel_display_name",
           "nvrtc_version", "remember_display_name"]


class CompileError(RuntimeError):
    """NVRTC rejected the source; the message holds NVRTC's log."""

    __module__ = "jaxgraph"  # shown as jaxgraph.CompileError, where users import it from


@dataclass(frozen=True)
class CompiledKernel:
    """A compiled kernel, as :func:`compile_kernel` returns it: its cubin and the symbol to look up in it.

    Attributes
    ----------
    cubin : bytes
        The ELF image for ``arch``.
    name : str
        The kernel as the user named it, e.g. ``"axpy<float>"``.
    lowered_name : str
        The symbol in the cubin, e.g. ``"_Z4axpyIfEvPT_PKS0_S0_i"``.
    arch : str
        The GPU architecture it was compiled for, e.g. ``"sm_90"``.
    cache_path : pathlib.Path or None
        Where the cubin is cached, or ``None`` when caching is off.
    cache_hit : bool
        Whether it came from the disk cache instead of NVRTC.
    """

    cubin: bytes
    name: str            # as the user named it, e.g. "axpy<float>"
    lowered_name: str    # the symbol in the cubin, e.g. "_Z4axpyIfEvPT_PKS0_S0_i"
    arch: str
    cache_path: Path | None
    cache_hit: bool


def compile_kernel(source: str, name: str, options: Any = None, *, arch: str | None = None,
                   cache_dir: str | os.PathLike | None = None) -> CompiledKernel:
    """Compile kernel ``name`` of ``source`` to a cubin, or load it from the disk cache.

    Parameters
    ----------
    source : str
        CUDA C++ source.
    name : str
        Kernel name, or a template instance such as ``"axpy<float>"``.
    options : cuda.core.ProgramOptions, dict or None
        NVRTC options (``std``, ``define_macro``, ``use_fast_math``, ...), as a
        ``ProgramOptions`` or a dict of its fields. ``arch`` is filled in.
    arch : str, optional
        A real GPU architecture such as ``"sm_90"`` (:func:`check_arch`);
        default: the current device's.
    cache_dir : path, optional
        Where cubins are kept (default ``$JAXGRAPH_CACHE_DIR``, else
        ``$XDG_CACHE_HOME/jaxgraph/kernels`` or ``~/.cache/jaxgraph/kernels``);
        ``JAXGRAPH_CACHE_DIR=""`` turns the cache off. A directory owned by
        another user or writable by its group or everyone is not used (one
        ``RuntimeWarning`` names it; the kernel is compiled). Directories
        jaxgraph creates are ``0700``, its files ``0600``.

    Notes
    -----
    The cache key covers the source, the contents of every header its
    ``#include`` directives may resolve to on the include path (followed
    recursively: NVRTC cannot list the headers it opened; a computed
    ``#include MACRO`` is not followed), ``name``, every option, ``arch``,
    the NVRTC build (version and library files) and ``CUDA_VERSION`` of each
    ``cuda.h`` on the include path. A cached cubin is loaded only if it
    matches the SHA-256 stored with it; one that does not is compiled again
    (one ``RuntimeWarning``), as is an entry whose metadata is not what
    jaxgraph writes.

    Returns
    -------
    CompiledKernel
        The cubin, the symbol to load and where it is cached.

    Raises
    ------
    CompileError
        NVRTC rejected the source (the message names NVRTC's result and
        quotes its log), or returned no cubin; nothing is cached then.
    ValueError
        ``arch`` is not a GPU architecture NVRTC compiles cubins for.
    """
    from cuda.core import ProgramOptions

    if not isinstance(source, str) or not source.strip():
        raise TypeError("source must be a non-empty string of CUDA C++")
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be the kernel's name as a string, got {name!r}")
    if arch is None:
        given = options.get("arch") if isinstance(options, dict) else getattr(options, "arch", None)
        arch = given or default_arch()
    check_arch(arch)
    # ProgramOptions asks the current device for a default arch: give it ours.
    opts = _check_or_create_options(options, ProgramOptions, arch)
    directory = cache_directory(cache_dir)
    key = cache_key(source, name, opts, arch) if directory is not None else ""
    if directory is not None:
        cached = read_entry(directory, key)
        if cached is not None:
            cubin, lowered, path = cached
            return CompiledKernel(cubin, name, lowered, arch, path, True)
    cubin, lowered = _nvrtc_compile(source, name, opts)
    if not is_cubin(cubin):  # never cache (or load) what is not a cubin
        raise CompileError(f"NVRTC returned no cubin for kernel {name!r} (arch={arch!r}): {len(cubin)} bytes "
                           f"that are not an ELF image")
    path = write_entry(directory, key, cubin, lowered) if directory is not None else None
    return CompiledKernel(cubin, name, lowered, arch, path, False)


def default_arch() -> str:
    """``"sm_XY"`` of the current device; raises :class:`CudaUnavailableError` without one."""
    from .._cuda import driver as _driver

    try:
        major, minor = _driver.compute_capability()
    except CudaUnavailableError as exc:
        raise CudaUnavailableError(
            f"{exc}; pass arch='sm_90' (or another target) to compile without a device"
        ) from None
    return f"sm_{major}{minor}"


def check_arch(arch: Any) -> str:
    """Return ``arch`` if NVRTC compiles cubins for it, else raise ``ValueError`` saying what is valid.

    Valid: ``"sm_XY"`` for an architecture this NVRTC supports
    (``nvrtcGetSupportedArchs``), optionally with an ``a`` or ``f`` suffix
    (``"sm_90a"``, ``"sm_100f"``). Virtual architectures (``"compute_90"``)
    are refused: NVRTC gives PTX for them, and jaxgraph loads cubins.
    """
    if not isinstance(arch, str):
        raise TypeError(f"arch must be a string such as 'sm_90', got {type(arch).__name__} {arch!r}")
    supported = _supported_archs()
    match = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", arch)
    if match and match.group(1) == "sm" and (int(match.group(2)) in supported or not supported):
        return arch  # (an NVRTC that cannot list its architectures judges the name itself)
    if match and match.group(1) == "compute":
        raise _arch_error(arch, "is a virtual architecture: NVRTC would compile it to PTX, and jaxgraph "
                          f"compiles kernels to cubins for a real GPU; pass arch='sm_{match.group(2)}"
                          f"{match.group(3)}' (a GPU of compute capability X.Y is 'sm_XY')")
    raise _arch_error(arch, "is not a GPU architecture NVRTC compiles for")


def remember_display_name(symbol: str, name: str) -> None:
    """Note that the loaded cubin symbol ``symbol`` is the kernel its user called ``name``."""
    _DISPLAY_NAMES[symbol] = name


def kernel_display_name(symbol: str | None) -> str | None:
    """The name a loaded kernel was given for its cubin symbol (``symbol`` itself otherwise)."""
    return _DISPLAY_NAMES.get(symbol, symbol) if symbol is not None else None


_DISPLAY_NAMES: dict[str, str] = {}  # symbol in a loaded cubin -> the name the Kernel was given


def nvrtc_version() -> tuple[int, int]:
    """The NVRTC library's ``(major, minor)``."""
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    return int(major), int(minor)


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _check_or_create_options(options: Any, cls: type, arch: str) -> Any:
    if isinstance(options, cls):
        return dataclasses.replace(options, arch=arch)
    if options is None:
        options = {}
    if isinstance(options, dict):
        defaults = {"std": "c++17"}
        headers = _cuda_include_dir()
        if headers and "include_path" not in options:
            defaults["include_path"] = [headers]  # so <cuda_fp16.h> and friends resolve
        try:
            return cls(**{**defaults, **options, "arch": arch})
        except TypeError as exc:
            raise TypeError(f"invalid kernel option: {exc}") from None
    raise TypeError(f"options must be a cuda.core.ProgramOptions or a dict, got {type(options).__name__}")


def _cuda_include_dir() -> str | None:
    """CUDA's include directory: NVIDIA's wheel, else a toolkit (CUDA_HOME, CUDA_PATH, /usr/local/cuda)."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        return find_nvidia_header_directory("cudart")
    except Exception:
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        path = os.path.join(home, "include")
        return path if os.path.isfile(os.path.join(path, "cuda_fp16.h")) else None


_CCCL_HEADERS = ("cuda/", "cub/", "thrust/", "nv/")  # CCCL's header trees (libcu++, CUB, Thrust)


def _cccl_include_dir() -> str | None:
    """CCCL's include directory (``<cuda/std/...>``): NVIDIA's nvidia-cuda-cccl wheel, a toolkit; else ``None``."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        return find_nvidia_header_directory("cccl")
    except Exception:
        return None


def _supported_archs() -> tuple[int, ...]:
    """The ``XY`` of every ``sm_XY`` this NVRTC compiles for (empty if it cannot say)."""
    archs = _listed_archs()
    if not archs:
        _listed_archs.cache_clear()  # a failed query is asked again next time, not remembered
    return archs


@functools.lru_cache(maxsize=None)
def _listed_archs() -> tuple[int, ...]:
    from cuda.bindings import nvrtc

    err, archs = nvrtc.nvrtcGetSupportedArchs()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return ()
    return tuple(int(a) for a in archs)


def _arch_error(arch: str, why: str) -> ValueError:
    """The error for an ``arch`` NVRTC cannot compile cubins for, listing the valid ones."""
    valid = ", ".join(f"sm_{n}" for n in _supported_archs())
    major, minor = nvrtc_version()
    return ValueError(f"arch={arch!r} {why}. Valid: 'sm_XY' for one of the architectures of this NVRTC "
                      f"({major}.{minor}), {valid}, optionally with an 'a' or 'f' suffix where the GPU has one "
                      "(architecture- or family-specific features, e.g. 'sm_90a')")


def _nvrtc_compile(source: str, name: str, opts: Any) -> tuple[bytes, str]:
    from cuda.core import Program

    try:
        program = Program(source, "c++", options=opts)
        obj = program.compile("cubin", name_expressions=(name,))
    except Exception as exc:
        if type(exc).__name__ == "NVRTCError" or "NVRTC" in str(exc):
            raise _compile_error(name, opts, str(exc)) from None
        raise
    mapping = obj.symbol_mapping or {}
    lowered = mapping.get(name, name)
    if isinstance(lowered, bytes):
        lowered = lowered.decode()
    return bytes(obj.code), lowered


def _compile_error(name: str, opts: Any, text: str) -> Exception:
    """NVRTC's failure as a :class:`CompileError` that names its result and what it means for ``name``."""
    text = text.replace("\x00", "").strip()
    # cuda.core's NVRTCError reads "<code>: <NVRTC_ERROR_...>, compilation log: ..." (older ones: "<code>: ...").
    head = re.match(r"(\d+):\s*(NVRTC_\w+)?,?\s*(compilation log:)?\s*", text)
    result, log = "", text
    if head:
        result, log = head.group(2) or _nvrtc_result_name(int(head.group(1))), text[head.end():]
    if "gpu-architecture" in log or "--nv_arch" in log:  # e.g. sm_75a: the right form, no such variant
        return _arch_error(getattr(opts, "arch", None), f"is not a GPU architecture NVRTC compiles for ({result}: "
                                      f"{log.strip().splitlines()[0]})")
    if "__nv_name_map" in log:  # NVRTC could not instantiate the name expression itself
        base = name.split("<", 1)[0].strip()
        what = (f"the template arguments of {name!r} are unknown or failed to instantiate {base!r}"
                if "<" in name else f"{name!r} is not a __global__ function NVRTC can find in the source")
        return CompileError(f"NVRTC could not compile kernel {name!r} ({result}): {what}. NVRTC's log:\n{log}")
    return CompileError(f"NVRTC could not compile kernel {name!r} ({result}):\n{log}{_include_hint(log)}")


def _nvrtc_result_name(code: int) -> str:
    from cuda.bindings import nvrtc

    try:
        return nvrtc.nvrtcResult(code).name
    except ValueError:
        return f"NVRTC error {code}"


def _include_hint(log: str) -> str:
    """Where CUDA's headers come from, when NVRTC could not open one."""
    if "cannot open source file" not in log:
        return ""
    missing = re.findall(r'cannot open source file "([^"]+)"', log)
    if any(m.startswith(_CCCL_HEADERS) for m in missing):
        found = _cccl_include_dir()
        where = f"found at {found}, which jaxgraph does not pass by itself" if found else "not found here"
        return ("\n\n<cuda/std/...>, <cuda/...>, <cub/...>, <thrust/...> and <nv/...> are CCCL's headers, which "
                "the nvidia-cuda-runtime wheel lacks: they come from NVIDIA's CCCL wheel (pip install "
                "\"nvidia-cuda-cccl>=13,<14\") or a CUDA toolkit's include directory (CUDA_HOME/include); "
                f"CCCL's include directory was {where}. Pass it with options={{'include_path': [...]}} (keep "
                "the CUDA runtime's directory in the list too).")
    found = _cuda_include_dir()
    where = f"jaxgraph passed {found}" if found else "jaxgraph found no CUDA include directory"
    return ("\n\nCUDA headers such as <cuda_fp16.h> come from NVIDIA's nvidia-cuda-runtime wheel "
            "(a jaxgraph dependency: pip install \"nvidia-cuda-runtime>=13.0,<14\") or a CUDA toolkit "
            f"(CUDA_HOME, /usr/local/cuda); {where}. Pass options={{'include_path': [...]}} to add "
            "your own.")
