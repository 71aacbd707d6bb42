"""Do two settings' results agree? Each output compared with ``np.isclose``, and where they don't, where.

A result is what a worker saved: the pytree's structure and ``(path, array)`` per
leaf. Floating and complex leaves agree when ``|x - ref| <= atol + rtol * |ref|``
everywhere (``np.allclose``, NaN equal to NaN); integer, bool and other leaves
must be equal. The first leaf that differs is reported: its path, how many
elements differ, the largest absolute difference and its index, and both values there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["Mismatch", "compare_results"]


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """Where a setting's result differs from the reference setting's.

    Attributes
    ----------
    output : str
        The differing output: ``"result"`` (a lone array), ``"result[1]"``, ``"result['u']"``.
    reason : str
        One line: what differs (shape, dtype, structure, or values).
    max_abs_diff : float or None
        The largest ``|x - ref|`` over the output (``inf`` where one side is NaN or inf and the other is not).
    index : tuple of int or None
        The index of that element.
    value, reference_value : float or None
        The two values there.
    count : int
        How many elements differ (beyond the tolerance).
    size : int
        The output's number of elements.
    """

    output: str
    reason: str
    max_abs_diff: float | None = None
    index: tuple[int, ...] | None = None
    value: Any = None
    reference_value: Any = None
    count: int = 0
    size: int = 0

    def __str__(self) -> str:
        return f"{self.output}: {self.reason}"


def compare_results(result: dict, reference: dict, rtol: float, atol: float) -> Mismatch | None:
    """The first way ``result`` differs from ``reference`` beyond the tolerance, or ``None``."""
    if result["treedef"] != reference["treedef"] or len(result["leaves"]) != len(reference["leaves"]):
        return Mismatch("(structure)", f"structure {result['treedef']} vs the reference's {reference['treedef']}")
    for (path, x), (_, ref) in zip(result["leaves"], reference["leaves"]):
        mismatch = compare_arrays(path, np.asarray(x), np.asarray(ref), rtol, atol)
        if mismatch is not None:
            return mismatch
    return None


def compare_arrays(path: str, x: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> Mismatch | None:
    """``x`` against ``ref`` (see the module's docstring)."""
    if x.shape != ref.shape:
        return Mismatch(path, f"shape {x.shape} vs the reference's {ref.shape}")
    if x.dtype != ref.dtype:
        return Mismatch(path, f"dtype {x.dtype} vs the reference's {ref.dtype}")
    inexact = _as_inexact(x)
    if inexact is None:  # integers, bools, anything else: equal or not
        differs = np.asarray(x != ref)
        if not differs.any():
            return None
        where = tuple(int(i) for i in np.argwhere(differs)[0]) if differs.ndim else ()
        diff = None
        if x.dtype.kind in "iub":
            diffs = np.abs(x.astype(np.float64) - ref.astype(np.float64))
            where = tuple(int(i) for i in np.unravel_index(np.argmax(diffs), diffs.shape)) if diffs.ndim else ()
            diff = float(diffs.max())
        return _values_mismatch(path, x, ref, differs, where, diff, "not equal")
    a, b = inexact, _as_inexact(ref)
    close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    if close.all():
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        diffs = np.abs(a - b)
    diffs = np.where(np.isnan(diffs), np.inf, diffs)  # one side NaN or inf: the worst difference
    diffs = np.where(close, 0.0, diffs)
    where = tuple(int(i) for i in np.unravel_index(np.argmax(diffs), diffs.shape)) if diffs.ndim else ()
    return _values_mismatch(path, x, ref, ~close, where, float(diffs.max()), f"not within rtol={rtol:g}, atol={atol:g}")


def _values_mismatch(path, x, ref, differs, where, diff, why) -> Mismatch:
    value, reference_value = x[where].item(), ref[where].item()
    count, size = int(np.count_nonzero(differs)), int(x.size)
    at = f" at index {where}" if where else ""
    largest = f"; max |diff| {diff:.3g}{at} ({value!r} vs {reference_value!r})" if diff is not None else \
        f"; first{at} ({value!r} vs {reference_value!r})"
    return Mismatch(path, f"{count} of {size} elements {why}{largest}", diff, where, value, reference_value,
                    count, size)


def _as_inexact(x: np.ndarray) -> np.ndarray | None:
    """``x`` as float64/complex128 when it holds floating or complex numbers (bfloat16 too), else None."""
    if x.dtype.kind == "c":
        return x.astype(np.complex128)
    if x.dtype.kind == "f":
        return x.astype(np.float64)
    if x.dtype.kind == "V" or "float" in x.dtype.name:  # ml_dtypes' bfloat16, float8_*: not kind "f"
        try:
            return x.astype(np.float64)
        except (TypeError, ValueError):
            return None
    return None
