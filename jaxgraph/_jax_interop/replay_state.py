"""The liveness of a replayable's graph id: which devices still have its graph, and retiring them.

HLO carries only a small graph id. Resetting the CUDAGraph retires the id on
its device, closing or collecting the replayable (which holds its graphs)
retires it everywhere, and a compiled function that still refers to it fails
with a clear error instead of launching freed memory. :class:`ReplayState`
keeps that record and says what to do when a replayable is called after it.
"""

from __future__ import annotations

import threading
from typing import Callable

from . import replay_native as _replay_native

__all__ = ["ReplayState"]


class ReplayState:
    """Which devices of a graph id are live; shared with the graphs' destroy callbacks.

    It holds no reference to the replayable, so a graph's destroy callback
    (:meth:`retire_callback`) never keeps the replayable alive.
    """

    def __init__(self, graph_id: int):
        self.graph_id = graph_id
        self.devices: dict[int, bool] = {}  # device -> still registered
        self.closed = False
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        """Not closed, and its graph still live on at least one device it was registered for."""
        return not self.closed and (not self.devices or any(self.devices.values()))

    @property
    def live_devices(self) -> list[int]:
        """The devices whose graph is still registered, sorted (none once closed)."""
        return [] if self.closed else [d for d, live in sorted(self.devices.items()) if live]

    def check_alive(self) -> None:
        """Raise ``RuntimeError`` saying what to do if the replayable was closed or its graph reset."""
        if self.closed:
            raise RuntimeError("this replayable was closed; build a new one with jaxgraph.replayable(...)")
        if self.devices and not any(self.devices.values()):
            raise RuntimeError("the graph of this replayable was reset or destroyed; capture it again "
                               "and build a new function with jaxgraph.replayable(...)")

    def add(self, device: int) -> None:
        """Count ``device``'s graph as live (under the lock a destroy callback takes)."""
        with self._lock:
            self.devices[device] = True

    def drop(self, device: int) -> None:
        """Retire ``device``'s graph and forget it, so the device can be added again; never raises."""
        self.retire(device)
        with self._lock:
            self.devices.pop(device, None)

    def retire(self, device: int = -1) -> None:
        """Retire ``device`` (every device when -1, which also closes); never raises."""
        with self._lock:
            if device < 0:
                self.closed = True
            for d in self.devices:
                if device < 0 or d == device:
                    self.devices[d] = False
        if self.graph_id > 0:
            _replay_native.retire(self.graph_id, device)

    def retire_callback(self, device: int) -> Callable[[], None]:
        """A destroy callback for a graph: retires ``device`` (it holds only this state)."""
        return lambda: self.retire(device)
