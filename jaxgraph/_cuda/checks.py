"""Argument checks shared by the public API: one place, so modules import no private names.

Each check runs before any driver call and raises the ``ValueError`` or
``TypeError`` the public docstrings promise, quoting the value it got;
:func:`fmt` spells a shape and dtype the same way in every message.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["CAPTURE_MODES", "arrays_overlap", "capture_mode", "check_choice",
           "device_arrays", "fmt", "fmt_all"]

CAPTURE_MODES = ("global", "thread_local", "relaxed")  # cudaStreamCaptureMode, by torch's names


def check_choice(what: str, value: Any, valid: tuple) -> Any:
    """``value`` if it is one of ``valid``, else a ``ValueError`` naming ``what`` and the choices."""
    if value not in valid:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, valid))}, got {value!r}")
    return value


def capture_mode(mode: Any, valid: tuple = CAPTURE_MODES) -> str:
    """Validate a ``capture_error_mode`` string."""
    return check_choice("capture_error_mode", mode, valid)


def device_arrays(arrays: Any, what: str) -> tuple:
    """``arrays`` (one device array, or a list or tuple of them) as a tuple of DeviceArrays.

    Anything with ``__cuda_array_interface__`` (CuPy, torch) is wrapped without
    a copy. Raises ``TypeError`` naming ``what[i]`` for anything else.
    """
    from .array import DeviceArray, asarray

    if isinstance(arrays, DeviceArray) or hasattr(arrays, "__cuda_array_interface__"):
        arrays = (arrays,)
    if not isinstance(arrays, (list, tuple)):
        raise TypeError(f"{what} must be a list of device arrays, got {type(arrays).__name__}")
    out = []
    for i, a in enumerate(arrays):
        if not isinstance(a, DeviceArray) and not hasattr(a, "__cuda_array_interface__"):
            raise TypeError(f"{what}[{i}] must be a device array (jaxgraph.DeviceArray), got {type(a).__name__}")
        out.append(asarray(a))
    return tuple(out)


def arrays_overlap(a: Any, b: Any) -> bool:
    """Whether two arrays (``ptr`` and ``nbytes``) share any byte of device memory."""
    return a.nbytes > 0 and b.nbytes > 0 and a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes


def fmt(s: Any) -> str:
    """``float32[4096]``: the dtype and shape of anything with ``.dtype`` and ``.shape``."""
    return f"{np.dtype(s.dtype).name}{list(s.shape)}"


def fmt_all(shapes: Sequence[Any]) -> str:
    """:func:`fmt` of each, comma-separated (``"no inputs"`` when empty)."""
    return ", ".join(fmt(s) for s in shapes) or "no inputs"
