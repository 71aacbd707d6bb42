"""Capturing one device's part of a :class:`~jaxgraph.ShardedGraph`: static inputs, the graph, its outputs.

:func:`capture_on` makes ``device`` current, allocates the static inputs
there, captures ``fn`` on them into a new :class:`~jaxgraph.CUDAGraph` and
restores the previous device. ``_jax_interop/sharded.py`` calls it once per device.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple

import numpy as np

from .._cuda import driver as _driver
from .._cuda.array import DeviceArray
from .._graphs.capture import graph as capture_graph
from .._graphs.cuda_graph import CUDAGraph

__all__ = ["DeviceCapture", "capture_on", "release_captures", "static_input_shapes", "static_outputs"]


class DeviceCapture(NamedTuple):
    """One device's part of a :class:`ShardedGraph`: its graph and static arrays."""

    graph: CUDAGraph | None
    inputs: tuple
    outputs: tuple


def capture_on(device: int, fn: Callable[..., Any], shapes: tuple, mode: str) -> DeviceCapture:
    """Allocate the static inputs on ``device`` and capture ``fn`` there; the previous device is restored."""
    from .._cuda.array import zeros

    previous = _driver.current_device()
    _driver.set_device(device)
    try:
        inputs = tuple(zeros(shape, dtype) for shape, dtype in shapes)
        g = CUDAGraph()
        with warnings.catch_warnings():
            # An empty capture is an error here, with a clearer message than the warning.
            warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
            with capture_graph(g, capture_error_mode=mode):
                result = fn(*inputs)
        try:
            outputs = static_outputs(result)
            if g.node_count(nested=False) == 0:
                raise RuntimeError(f"capture_per_device: fn launched nothing on device {device}; it must "
                                   "launch its kernels on the current stream (jaxgraph's default), with no "
                                   "stream= of another device")
        except BaseException:
            g.reset()
            raise
        return DeviceCapture(g, inputs, outputs)
    finally:
        _driver.set_device(previous)


def static_outputs(result: Any) -> tuple:
    """What ``fn`` returned, as a tuple of device arrays (its static outputs)."""
    if isinstance(result, DeviceArray) or hasattr(result, "__cuda_array_interface__"):
        result = (result,)
    if not isinstance(result, (list, tuple)) or not result:
        raise TypeError("fn must return its static outputs: a device array or a non-empty tuple of them, got "
                        f"{type(result).__name__}")
    return tuple(result)


def static_input_shapes(in_shapes: Any) -> tuple:
    """``in_shapes`` as ``(shape, dtype)`` pairs, checked."""
    if not isinstance(in_shapes, (list, tuple)):
        raise TypeError("in_shapes must be a list of jax.ShapeDtypeStruct (one per static input), got "
                        f"{type(in_shapes).__name__}")
    out = []
    for i, s in enumerate(in_shapes):
        if not hasattr(s, "shape") or not hasattr(s, "dtype"):
            raise TypeError(f"in_shapes[{i}] must have a shape and a dtype (jax.ShapeDtypeStruct), "
                            f"got {type(s).__name__}")
        out.append((tuple(int(n) for n in s.shape), np.dtype(s.dtype)))
    return tuple(out)


def release_captures(step: Any, parts: dict[int, DeviceCapture]) -> None:
    """Undo a partial capture: close the replayable ``step`` (if any) and reset every graph; never raises."""
    try:
        if step is not None:
            step.close()
        for part in parts.values():
            if part.graph is not None:
                part.graph.reset()
    except Exception:  # the capture's own error is the one to report
        pass
