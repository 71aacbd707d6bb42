"""Stand-ins for what needs a GPU, for host code run without one (``jaxgraph.diagnostics``' stand-ins).

A :class:`~jaxgraph.DeviceArray` over an address as given (memory jaxgraph did
not allocate, or no memory at all), a :class:`~jaxgraph.Stream` over a handle
the driver never made, and a device's primary context taken to be a given
address. Tests and benchmarks of jaxgraph's host code (argument checks,
packing, launch bookkeeping) use them on a machine without a GPU; tests on the
GPU use the array for views the public API does not make.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import numpy as np

from . import driver as _driver
from .array import _INTERNAL, DeviceArray
from .stream import Stream

__all__ = ["device_array_at", "primary_context_assumed", "stream_at"]


def device_array_at(address: int, shape: tuple[int, ...], dtype: np.dtype, device: int, owner: Any) -> DeviceArray:
    """A DeviceArray over ``address`` as given: nothing allocated, checked or freed; ``owner`` kept alive."""
    return DeviceArray(address, shape, dtype, device, owner, _token=_INTERNAL)


def stream_at(handle: int, device: int) -> Stream:
    """A Stream over ``handle``, made without the driver; jaxgraph never destroys it."""
    stream = Stream.__new__(Stream)
    stream._setup(handle, device, None, False)
    return stream


@contextlib.contextmanager
def primary_context_assumed(device: int, address: int) -> Iterator[None]:
    """Inside the block, ``device``'s primary context is taken to be ``address`` (no driver call retains it).

    Where the thread's current context reads as ``address`` too (``0`` with no
    driver), nothing looks for or switches a context.
    """
    addresses = _driver._primary_context_addresses
    previous = addresses.get(device)
    addresses[device] = address
    try:
        yield
    finally:
        if previous is None:
            addresses.pop(device, None)
        else:
            addresses[device] = previous
