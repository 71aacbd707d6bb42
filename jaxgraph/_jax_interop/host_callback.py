"""The host path of graph replay: ``jax.pure_callback`` around ``CUDAGraph.replay``.

``jaxgraph.replayable(g, inputs, outputs, via="callback")`` replays the graph
from a host callback: JAX hands the callback numpy copies of the arguments,
the callback copies them into the graph's static inputs, replays the graph on
a private stream, waits, and returns numpy copies of the static outputs.

It works wherever ``jax.pure_callback`` does, including JAX on the CPU
(``JAX_PLATFORMS=cpu``) with jaxgraph using the GPU, and it needs no native
extension. It costs two host round trips and a synchronization per call, so
with JAX on a GPU prefer the default ``via="ffi"``, which replays on XLA's
stream without leaving the device.

Errors: a reset graph is refused at trace time, and by the host function at
run time (a ``RuntimeError`` that JAX re-raises as its own error type). With
JAX on a GPU, an exception raised by a host callback leaves XLA's stream in
an error state, and later computations of the process fail too (JAX's
behaviour); one more reason to use ``via="ffi"`` there, whose errors are
clean.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["HostReplay", "callback_call", "callback_replay"]


# ----------------------------------------------------------------------------
# HostReplay
# ----------------------------------------------------------------------------


class HostReplay:
    """The host function of a ``via="callback"`` replayable: numpy in, replay, numpy out.

    Parameters
    ----------
    graph : jaxgraph.CUDAGraph
        A captured graph.
    inputs, outputs : sequence of jaxgraph.DeviceArray
        The graph's static input and output arrays.
    """

    def __init__(self, graph: Any, inputs: Sequence[Any], outputs: Sequence[Any]):
        from .._cuda.stream import Stream

        self._graph = graph
        self._inputs = tuple(inputs)
        self._outputs = tuple(outputs)
        # A non-blocking stream of our own: the legacy default stream would
        # wait for XLA's streams, which may be waiting for this callback.
        self._stream = Stream(graph.device)
        # Static buffers are shared by every call: one replay at a time.
        self._lock = threading.Lock()

    def __call__(self, *args: np.ndarray) -> tuple[np.ndarray, ...]:
        from .._cuda.array import to_host
        from .._cuda.stream import stream

        if len(args) != len(self._inputs):
            raise TypeError(f"replay callback expects {len(self._inputs)} arrays, got {len(args)}")
        with self._lock:
            if self._graph is None:
                raise RuntimeError("this replayable was closed; build a new one with jaxgraph.replayable(...)")
            s = self._stream
            for static, value in zip(self._inputs, args):
                if static.nbytes:
                    static.copy_(np.asarray(value), stream=s)
            with stream(s):
                self._graph.replay()
            return tuple(to_host(out, stream=s) for out in self._outputs)

    def close(self) -> None:
        """Let go of the graph and static arrays once no replay is running (each one waits for its results)."""
        with self._lock:
            self._graph, self._outputs = None, ()
            self._inputs = (None,) * len(self._inputs)  # the count stays, for the message of a later call


# ----------------------------------------------------------------------------
# The callback
# ----------------------------------------------------------------------------


def callback_call(outputs: Sequence[Any], host: Callable[..., Any], state: Any) -> Callable[..., list]:
    """The replay call of the host path: :func:`callback_replay` of ``host``, which refuses a reset graph.

    ``state`` is the replayable's ``ReplayState``: the pure_callback target
    checks it on every call, as the FFI handler checks the graph table.
    """
    def host_call(*args: Any) -> Any:
        state.check_alive()
        return host(*args)

    def call(*args: Any) -> list:
        return callback_replay(outputs, host_call, *args)

    return call


def callback_replay(outputs: Sequence[Any], host: Callable[..., Any], *args: Any) -> list:
    """``jax.pure_callback(host, outputs, *args)``, one call per batch element under ``vmap``."""
    import jax

    results = jax.pure_callback(host, tuple(outputs), *args, vmap_method="sequential")
    return list(results)
