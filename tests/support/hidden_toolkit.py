"""Hiding a system CUDA toolkit from a build: no ``nvcc`` on PATH, and none where CMake looks.

Dropping the PATH entries that contain "cuda" is not enough: an image may put
an ``nvcc`` wrapper in ``/usr/local/bin`` (``exec /usr/local/cuda-13.0/bin/nvcc``),
and CMake's FindCUDAToolkit finds the toolkit from it. :func:`cuda_free_path`
drops the entries that contain "cuda" and replaces each other directory
holding an ``nvcc`` by a shadow directory: links to everything in it but
``nvcc``, so its other programs stay reachable. CMake also looks in
``<prefix>/bin`` of its system prefixes (``/usr/local/bin`` among them) and in
``/usr/local/cuda/bin`` whatever PATH says, so :func:`cmake_ignore_path` lists
the directories to give it as ``CMAKE_IGNORE_PATH``: every such directory
holding an ``nvcc``, and each system toolkit's ``bin`` (with
``CMAKE_IGNORE_PREFIX_PATH`` over the toolkits' roots, as before). A toolkit
installed into ``/usr`` itself (``/usr/bin/nvcc``) cannot be hidden this way:
ignoring ``/usr/bin`` would hide the compilers too.

``.ci/run`` builds CI's environment with it (``python3
tests/support/hidden_toolkit.py path SHADOW_ROOT`` prints the PATH made from
``$PATH``, ``... cmake-ignore`` the list); ``tests/packaging/test_install.py``
builds its tests' environment with it.
"""

from __future__ import annotations

import glob
import os
import sys

__all__ = ["cmake_ignore_path", "cuda_free_path", "system_toolkits"]

CMAKE_SYSTEM_BINS = ("/usr/local/bin", "/opt/bin")  # <prefix>/bin CMake searches whatever PATH says
NEVER_IGNORED = ("/usr/bin", "/bin")  # the compilers live there: a toolkit installed into /usr cannot be hidden


def system_toolkits() -> list[str]:
    """Every place a system toolkit may live (``/usr/local/cuda*``, ``/opt/cuda*``)."""
    return sorted(set(glob.glob("/usr/local/cuda*") + glob.glob("/opt/cuda*")))


def cuda_free_path(path: str, shadow_root: str) -> str:
    """``path`` without CUDA's directories and with no ``nvcc``: shadow directories go under ``shadow_root``."""
    kept = []
    for index, directory in enumerate(p for p in path.split(os.pathsep) if p):
        if "cuda" in directory:
            continue
        if not _has_nvcc(directory):
            kept.append(directory)
            continue
        shadow = os.path.join(shadow_root, f"{index}-{os.path.basename(directory.rstrip(os.sep)) or 'root'}")
        os.makedirs(shadow, exist_ok=True)
        for name in os.listdir(directory):
            link = os.path.join(shadow, name)
            if name != "nvcc" and not os.path.lexists(link):
                os.symlink(os.path.join(directory, name), link)
        kept.append(shadow)
    return os.pathsep.join(kept)


def cmake_ignore_path(path: str) -> list[str]:
    """Directories for ``CMAKE_IGNORE_PATH``: those on ``path`` or among CMake's own that hold an ``nvcc``, and
    each system toolkit's ``bin``."""
    candidates = [p for p in path.split(os.pathsep) if p] + list(CMAKE_SYSTEM_BINS)
    found = [d for d in candidates if _has_nvcc(d)] + [os.path.join(t, "bin") for t in system_toolkits()]
    return [d for d in dict.fromkeys(os.path.normpath(d) for d in found) if d not in NEVER_IGNORED]


def _has_nvcc(directory: str) -> bool:
    nvcc = os.path.join(directory, "nvcc")
    return os.path.isfile(nvcc) and os.access(nvcc, os.X_OK)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "path":
        print(cuda_free_path(os.environ.get("PATH", ""), sys.argv[2]))
    elif len(sys.argv) == 2 and sys.argv[1] == "cmake-ignore":
        print(";".join(cmake_ignore_path(os.environ.get("PATH", ""))))
    else:
        sys.exit("usage: hidden_toolkit.py path SHADOW_ROOT  (prints $PATH without any nvcc)\n"
                 "       hidden_toolkit.py cmake-ignore       (prints CMAKE_IGNORE_PATH's list)")
