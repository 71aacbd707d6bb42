"""What jaxgraph's internals show, for tests, benchmarks and troubleshooting.

The everyday API is ``jaxgraph.*``. This module is the one documented door
to what the layers below keep to themselves but a benchmark, a test or a
user chasing a slow or failing replay needs to read or set::

    from jaxgraph import diagnostics

    before = diagnostics.counters()
    f(x).block_until_ready()                     # a jitted function that replays graphs
    after = diagnostics.counters()
    print({k: after[k] - before[k] for k in after if after[k] != before[k]})

- :func:`counters`: the native replay handler's counters (calls per replay
  path, executables made, buffers copied, time inside the handler).
- :func:`set_capture_policy` and :class:`CapturePolicy`: how replays go into
  XLA's command buffers, process-wide (benchmarks compare the policies).
- :func:`describe_graph` / :func:`describe_bindings`: what the native table
  holds for a graph id (its replay paths, how each static buffer meets XLA's).
- :func:`native_module`: one of the three native extensions (``"replay"``,
  ``"launch"``, ``"device_loop"``), loaded on first use, for handles and
  counts they report (e.g. ``native_module("launch").live_kernels()``).

Nothing here is needed to use jaxgraph, and none of it changes what a
program computes; names may grow between releases, but existing ones keep
their meaning.
"""

from __future__ import annotations

from types import ModuleType

from . import _name_the_public_module
from ._cuda.native import native as _native
from ._jax_interop.replay_boundary import (BindingMode, BufferBinding, CapturePolicy, GraphInfo, ReplayPath, counters,
                                           describe_bindings, describe_graph, set_capture_policy)

__all__ = [
    "BindingMode",
    "BufferBinding",
    "CapturePolicy",
    "GraphInfo",
    "ReplayPath",
    "counters",
    "describe_bindings",
    "describe_graph",
    "native_module",
    "set_capture_policy",
]


def native_module(name: str) -> ModuleType:
    """The native extension ``jaxgraph._<name>`` (``"replay"``, ``"launch"`` or ``"device_loop"``).

    Raises
    ------
    ValueError
        For any other name (the message lists the three).
    """
    if name not in ("replay", "launch", "device_loop"):
        raise ValueError(f"native_module: no extension {name!r}; the extensions are 'replay', 'launch' and "
                         "'device_loop'")
    return _native(name)


_name_the_public_module(globals(), __name__)  # jaxgraph.diagnostics.CapturePolicy, as users import it
