"""The tests' door into jaxgraph's private replay modules: replayables and sharded graphs from specs.

The public API makes a replayable only from a captured graph
(``jaxgraph.replayable(g, ...)``), which needs a GPU. The CPU tests of
lowering, sharding, argument checks and the host-callback path build
replayables and sharded graphs from a spec instead, with no graph behind
them. What they take from jaxgraph's private modules for that comes through
here, so a rename inside jaxgraph costs one edit. ``tests/README.md`` lists
every test file that tests internals, and what for.

What tests only read or set (the native replay counters and graph table, the
capture policy, a graph's memory pool, ...) is ``jaxgraph.diagnostics``, the
documented door.
"""

__all__ = ["DeviceCapture", "ReplaySpec", "Replayable", "ShardedGraph", "replayable_of_referenced",
           "spec_replayable", "spec_sharded"]

from jaxgraph._jax_interop.replay_contract import ReplaySpec
from jaxgraph._jax_interop.replayable import Replayable, replayable_of_referenced
from jaxgraph._jax_interop.sharded import DeviceCapture, ShardedGraph


def spec_replayable(inputs, outputs, graph_id=0, *, via="ffi", uncaptured=False, **options):
    """A :class:`~jaxgraph.Replayable` of native graph ``graph_id`` with no graph behind it.

    It traces and lowers like a real one (``via="ffi"``), or runs ``host`` from
    ``jax.pure_callback`` (``via="callback"``), without a GPU. ``inputs`` and
    ``outputs`` are ``jax.ShapeDtypeStruct``s; ``options`` go to
    ``Replayable._create`` (``host``, ``backward``).
    """
    spec = ReplaySpec(tuple(inputs), tuple(outputs), graph_id, uncaptured=uncaptured)
    return Replayable._create(spec, via=via, **options)


def spec_sharded(step, devices):
    """A :class:`~jaxgraph.ShardedGraph` of ``step`` on CUDA ordinals ``devices``, none captured."""
    return ShardedGraph._create(step, {d: DeviceCapture(None, (), ()) for d in devices})
