"""The disk cache of compiled cubins: a key that covers what changes the cubin, verified entries, private directories.

A cubin is loaded into the process and run, so an entry must never be stale
(compiled from other code than the one asked for) nor foreign (planted by
someone else). Each rule below exists for one of the two.

The key is the SHA-256 of everything that changes the cubin:

- the source, the kernel's name, every NVRTC option, the architecture;
- the NVRTC build: ``nvrtcVersion()``'s major.minor, and the name, size and
  modification time of the library files (``libnvrtc``, ``libnvrtc-builtins``),
  so another build of the same 13.x is another entry;
- the CUDA headers' version: ``CUDA_VERSION`` of each ``cuda.h`` on the include
  path (jaxgraph puts CUDA's include directory there by default);
- the contents of the headers the source includes. NVRTC cannot list the
  headers it opened (it has no ``-M``/``-MD``; NVRTC 13 refuses them), so
  jaxgraph follows each ``#include "..."`` and ``#include <...>`` of the source,
  recursively, and hashes every file it could resolve to: for ``"..."`` the
  including file's directory and those above it in the include chain (the
  source's own directory is the working directory, as for NVRTC), then each
  include directory; for ``<...>`` the include directories. A name found in
  none of them is recorded as absent, so a header that appears later (or
  earlier on the path, shadowing another) changes the key too. It is an
  over-approximation: ``#if`` and comments are not evaluated, every directive
  is followed. Two cases it cannot see: a computed include (``#include
  MACRO``), and NVRTC's own built-in headers (those change with the NVRTC
  build, which is in the key).

An entry is two files, ``<key>.cubin`` and ``<key>.json`` (the symbol and the
cubin's SHA-256). An entry whose JSON is not what jaxgraph writes (another
type, a field missing) is compiled again; one whose cubin does not match its
digest (altered or corrupted) is compiled again and never loaded, with one
warning per directory. Files are written to a temporary file, then renamed
(readers never see half a file); a write that fails removes its temporary
file.

The directory must be one no one else can write: a directory owned by
another user, or writable by its group or by everyone (even with the sticky
bit: anyone could still add ``<key>.cubin`` for a kernel whose key they can
compute, such as jaxgraph's own), is not used: one warning names it and why,
and kernels are compiled without the cache. Directories jaxgraph creates are
``0700``, its files ``0600``.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import json
import os
import re
import stat
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

__all__ = ["cache_directory", "cache_key", "read_entry", "write_entry"]


def cache_key(source: str, name: str, opts: Any, arch: str) -> str:
    """The entry's name: SHA-256 of the source, name, options, arch, NVRTC build, CUDA headers and included files."""
    fields = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
    include_dirs = _as_list(getattr(opts, "include_path", None))
    main_dir = os.path.dirname(os.path.abspath(getattr(opts, "name", None) or "default_program"))
    text = json.dumps({
        "source": source, "name": name, "options": fields, "arch": arch,
        "nvrtc": _nvrtc_library(),
        "cuda_headers": _cuda_headers_versions(include_dirs),
        "includes": _included_files(source, main_dir, include_dirs, _as_list(getattr(opts, "pre_include", None))),
    }, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def cache_directory(cache_dir: Any) -> Path | None:
    """The cache directory ``cache_dir`` names, else ``$JAXGRAPH_CACHE_DIR``'s or the default; ``None``: off."""
    if cache_dir is None:
        env = os.environ.get("JAXGRAPH_CACHE_DIR")
        if env == "":
            return None
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        cache_dir = env or Path(base) / "jaxgraph" / "kernels"
    return Path(cache_dir)


def read_entry(directory: Path, key: str) -> tuple[bytes, str, Path] | None:
    """``(cubin, symbol, path)`` of a verified entry in a trusted ``directory``; ``None``: compile."""
    from .cubin import is_cubin

    cubin_path = directory / f"{key}.cubin"
    if not directory.is_dir() or not _trusted(directory):
        return None
    try:
        cubin = cubin_path.read_bytes()
        meta = json.loads((directory / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(meta, dict) and isinstance(meta.get("lowered_name"), str)
            and isinstance(meta.get("sha256"), str)):
        return None  # not what jaxgraph writes (another version's, or damaged): compile again
    if hashlib.sha256(cubin).hexdigest() != meta["sha256"]:
        _warn_once(directory, "altered", f"jaxgraph's kernel cache entry {cubin_path} does not match the digest "
                   "recorded with it (the file was altered or corrupted): it was not loaded, the kernel was "
                   "compiled again and the entry rewritten (this warning is given once per directory)")
        return None
    if not is_cubin(cubin):
        return None
    return cubin, meta["lowered_name"], cubin_path


def write_entry(directory: Path, key: str, cubin: bytes, lowered: str) -> Path | None:
    """Store an entry (the cubin first, then its JSON with the digest); ``None`` where it could not be."""
    try:
        _make_private_dirs(directory)
        if not _trusted(directory):
            return None
        meta = json.dumps({"lowered_name": lowered, "sha256": hashlib.sha256(cubin).hexdigest()}).encode()
        for suffix, data in ((".cubin", cubin), (".json", meta)):
            _write_file(directory, f"{key}{suffix}", data)
    except OSError as exc:
        _warn_once(directory, "unwritable",  # it costs a recompile in every process: say so, once
                   f"jaxgraph cannot write its kernel cache at {directory} ({type(exc).__name__}: {exc}), so "
                   "every process compiles its kernels again; pass cache_dir= or set JAXGRAPH_CACHE_DIR to a "
                   "writable directory (JAXGRAPH_CACHE_DIR= turns the cache off and this warning with it)")
        return None
    return directory / f"{key}.cubin"


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        return [os.fspath(value)]
    return [os.fspath(v) for v in value]


@functools.lru_cache(maxsize=None)
def _nvrtc_library() -> dict:
    """NVRTC's version and the identity (name, size, mtime) of its library files: the build that compiles."""
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()  # also makes cuda.bindings load the library
    files = []
    library = _loaded_library("libnvrtc.so")
    if library is not None:
        real = os.path.realpath(library)
        builtins = sorted(glob.glob(os.path.join(os.path.dirname(real), "libnvrtc-builtins.so*")))
        for path in [real] + [os.path.realpath(b) for b in builtins]:
            try:
                st = os.stat(path)
            except OSError:
                continue
            files.append([os.path.basename(path), st.st_size, st.st_mtime_ns])
    return {"version": [int(major), int(minor)], "files": sorted({tuple(f): f for f in files}.values())}


def _loaded_library(prefix: str) -> str | None:
    """The path of the mapped shared library whose name starts with ``prefix`` (Linux), else where pathfinder finds it."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
                path = fields[5].strip() if len(fields) == 6 else ""
                if os.path.basename(path).startswith(prefix):
                    return path
    except OSError:
        pass
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return load_nvidia_dynamic_lib("nvrtc").abs_path
    except Exception:
        return None


def _cuda_headers_versions(include_dirs: list[str]) -> dict:
    """``CUDA_VERSION`` of the ``cuda.h`` in each include directory that has one."""
    versions = {}
    for d in include_dirs:
        header = os.path.join(d, "cuda.h")
        entry = _read_header(header)
        if entry is not None:
            found = re.search(r"^\s*#\s*define\s+CUDA_VERSION\s+(\d+)", entry[1], re.M)
            versions[os.path.abspath(d)] = int(found.group(1)) if found else None
    return versions


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include(?:_next)?[ \t]*([<"])([^>"\n]+)[>"]', re.M)


def _included_files(source: str, main_dir: str, include_dirs: list[str], pre_includes: list[str]) -> list:
    """``[path, sha256 or None]`` of every file the source's ``#include``s may resolve to, recursively."""
    found: dict[str, str | None] = {}
    include_dirs = [os.path.abspath(d) for d in include_dirs]

    def follow(text: str, chain: list[str], extra: list[tuple[str, str]] = ()) -> None:
        for quote, name in [*extra, *_INCLUDE.findall(text)]:
            name = name.strip()
            if os.path.isabs(name):
                candidates = [name]
            else:
                dirs = (list(reversed(chain)) if quote == '"' else []) + include_dirs
                candidates = [os.path.normpath(os.path.join(d, name)) for d in dict.fromkeys(dirs)]
            for path in candidates:
                if path in found:
                    continue
                entry = _read_header(path)
                found[path] = entry[0] if entry else None
                if entry is not None:
                    follow(entry[1], chain + [os.path.dirname(path)])

    follow(source, [main_dir], [('"', p) for p in pre_includes])
    return sorted([path, digest] for path, digest in found.items())


_headers: dict[tuple, tuple[str, str]] = {}  # (path, inode, size, mtime) -> (sha256, text)
_headers_lock = threading.Lock()


def _read_header(path: str) -> tuple[str, str] | None:
    """``(sha256, text)`` of a header file, ``None`` where there is none; read again only after it changed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    memo = (path, st.st_ino, st.st_size, st.st_mtime_ns)
    with _headers_lock:
        entry = _headers.get(memo)
    if entry is None:
        try:
            data = Path(path).read_bytes()
        except OSError:
            return None
        entry = (hashlib.sha256(data).hexdigest(), data.decode("utf-8", "replace"))
        with _headers_lock:
            if len(_headers) > 4096:
                _headers.clear()
            _headers[memo] = entry
    return entry


def _make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and the parents it lacks, each ``0700``."""
    missing = []
    path = directory
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue  # another process made it
        os.chmod(path, 0o700)  # whatever the umask


def _write_file(directory: Path, name: str, data: bytes) -> None:
    """Write ``name`` (``0600``) through a temporary file and a rename; never leave the temporary file."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")  # mkstemp: 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, directory / name)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _trusted(directory: Path) -> bool:
    """Whether ``directory`` is one only this user can write; warn once naming it and the reason if not."""
    try:
        st = os.stat(directory)
    except OSError:
        return False
    why = None
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    if uid is not None and st.st_uid != uid:
        why = f"it is owned by user id {st.st_uid}, not by this process's user (id {uid})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "every user" if st.st_mode & stat.S_IWOTH else "its group"
        why = f"it is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})"
    if why is None:
        return True
    _warn_once(directory, "untrusted",
               f"jaxgraph does not use the kernel cache at {directory}: {why}, so someone else could put a cubin "
               "there that this process would load and run. Kernels are compiled without the cache. Use a "
               "directory only you can write (chmod go-w, or another cache_dir= / JAXGRAPH_CACHE_DIR); "
               "JAXGRAPH_CACHE_DIR= turns the cache off and this warning with it")
    return False


_warned: set = set()
_warned_lock = threading.Lock()


def _warn_once(directory: Path, what: str, message: str) -> None:
    """Warn ``message`` unless a warning of kind ``what`` was given for ``directory`` already."""
    with _warned_lock:
        if (directory, what) in _warned:
            return
        _warned.add((directory, what))
    warnings.warn(message, RuntimeWarning, stacklevel=5)
