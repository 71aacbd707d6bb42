"""jaxgraph's own kernels (graph control, copy nodes), compiled and loaded once per device.

The device loops' control kernels (``_graphs/loop_build.py``), the gradient
loops' (``_graphs/checkpoint_loop.py``) and the copy nodes' (``_graphs/copy_ring.py``)
are each a set of NVRTC kernels that a graph on device d launches. A
:class:`KernelSets` compiles a set for d's architecture (the step's device, not
the current one) and loads it the first time d asks, outside any capture
(loading is not capturable); the set then lives as long as the process.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from .._cuda import driver as _driver

__all__ = ["KernelSets"]


class KernelSets:
    """``make(arch) -> {name: Kernel}``, called once per device and kept.

    ``make`` also serves CPU tests: called with an explicit ``arch``, it
    compiles without a device.
    """

    def __init__(self, make: Callable[[str], dict[str, Any]]):
        self._make = make
        self._sets: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def on(self, device: int) -> dict[str, Any]:
        """The set for ``device``, compiled for its architecture and loaded."""
        with self._lock:
            kernels = self._sets.get(device)
            if kernels is None:
                major, minor = _driver.compute_capability(device)
                kernels = self._sets[device] = self._make(f"sm_{major}{minor}")
                for k in kernels.values():
                    k.handle  # noqa: B018 - load now, before any capture
            return kernels
