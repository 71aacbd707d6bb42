"""The native library: loading jaxgraph's C++ extensions and registering their FFI targets.

Three small extensions are built from ``ffi/`` at install time (see BUILD.md):
``jaxgraph._launch`` (``ffi/launch/launch.cc``: the ``jaxgraph_launch`` handler and the
eager launch entry point), ``jaxgraph._replay`` (``ffi/replay/replay.cc``: the
``jaxgraph_replay`` handler and its graph table) and ``jaxgraph._device_loop``
(``ffi/device_loop/device_loop.cc``: builds a device loop's graph; no FFI handler). The first
two expose ``registrations()``, a dict of FFI handler capsules registered here with
``jax.ffi.register_ffi_target(..., platform="CUDA")`` on first use, not at
import, so ``import jaxgraph`` works without the extensions or JAX's CUDA backend.
``cpu_registrations()`` holds handlers for JAX's CPU backend that fail with a
message saying jaxgraph needs JAX with CUDA (and what to install), instead of
XLA's "no FFI handler registered".
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

__all__ = ["native", "register_ffi_targets"]

_EXTENSIONS = ("launch", "replay")
_INSTALL = 'python3 -m pip install -e ".[test]"'  # README's install step, the one hint everywhere


def native(name: str) -> Any:
    """Import the native extension ``jaxgraph._<name>`` (``"launch"`` or ``"replay"``).

    Raises
    ------
    RuntimeError
        The extension is not built or does not load; the message says how to build it.
    """
    try:
        return importlib.import_module(f"jaxgraph._{name}")
    except ImportError as exc:
        raise RuntimeError(
            f"jaxgraph's native extension jaxgraph._{name} is not built or does not load ({exc}); "
            f"reinstall jaxgraph from its checkout: {_INSTALL} (BUILD.md: where the build takes "
            "CUDA from, and building without a package registry; the docs' Troubleshooting page: "
            "each build error's fix)"
        ) from None


def register_ffi_targets() -> None:
    """Register ``jaxgraph_launch`` and ``jaxgraph_replay`` with JAX for CUDA, once per process."""
    global _registered
    if _registered:
        return
    with _lock:
        if _registered:
            return
        import jax

        for name in _EXTENSIONS:
            extension = native(name)
            for target, capsule in extension.registrations().items():
                jax.ffi.register_ffi_target(target, capsule, platform="CUDA")
            # On JAX's CPU backend the targets fail saying jaxgraph needs CUDA.
            for target, capsule in extension.cpu_registrations().items():
                jax.ffi.register_ffi_target(target, capsule, platform="cpu")
        _registered = True


_registered = False
_lock = threading.Lock()
