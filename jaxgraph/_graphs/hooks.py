"""Hooks on graphs: :class:`GraphHooks`, :class:`RemovableHandle` and destroy callbacks.

A graph owns one :class:`GraphHooks`, which keeps each kind of hook in an
``OrderedDict`` keyed by handle id, so hooks fire in registration order and a
handle can remove exactly its own. The hooks object holds no reference to its
graph, so the graph's finalizer can fire the destroy callbacks after the graph
itself is gone (as torch's graphs retain callbacks without the graph).
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections import OrderedDict
from typing import Any, Callable

__all__ = ["GraphHookMethods", "GraphHooks", "RemovableHandle", "fire_destroy"]


# ----------------------------------------------------------------------------
# RemovableHandle
# ----------------------------------------------------------------------------


class RemovableHandle:
    """Returned by the ``register_*`` methods of a graph; :meth:`remove` deregisters the hook.

    ``remove()`` may be called any number of times. The handle is also a
    context manager that removes the hook on exit::

        with g.register_replay_start_hook(print):
            g.replay()

    Attributes
    ----------
    id : int
        The hook's key in its graph's hook table (unique in the process).
    """

    _ids = itertools.count()
    __slots__ = ("id", "_hooks")

    def __init__(self, hooks: OrderedDict):
        self.id = next(RemovableHandle._ids)
        # Weak: a handle kept by the user must not keep a dead graph's hooks alive.
        self._hooks = weakref.ref(hooks)

    def remove(self) -> None:
        """Deregister the hook (idempotent)."""
        hooks = self._hooks()
        if hooks is not None:
            hooks.pop(self.id, None)

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"<jaxgraph.RemovableHandle id={self.id}>"


# ----------------------------------------------------------------------------
# GraphHooks
# ----------------------------------------------------------------------------

_KINDS = ("capture_end", "post_instantiate", "replay_start", "replay_end", "destroy")


class GraphHooks:
    """The hooks of one graph, by kind: ``capture_end``, ``post_instantiate``,
    ``replay_start``, ``replay_end`` (called with the graph) and ``destroy``
    (called with no argument, each exactly once)."""

    __slots__ = _KINDS

    def __init__(self) -> None:
        for kind in _KINDS:
            setattr(self, kind, OrderedDict())

    def register(self, kind: str, hook: Any, what: str) -> RemovableHandle:
        """Add ``hook`` to ``kind``; ``what`` names the registering method in errors."""
        if not callable(hook):
            raise TypeError(f"{what} expects a callable, got {type(hook).__name__}")
        hooks = getattr(self, kind)
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        return handle

    def run(self, kind: str, graph: Any) -> None:
        """Call each hook of ``kind`` with ``graph``, in registration order (a hook may remove hooks)."""
        hooks = getattr(self, kind)
        if hooks:
            for hook in list(hooks.values()):
                hook(graph)


def fire_destroy(callbacks: OrderedDict) -> None:
    """Call and forget every destroy callback, in order; one that raises is reported as a warning."""
    pending = list(callbacks.values())
    callbacks.clear()  # each fires exactly once, even if a later one raises
    for callback in pending:
        try:
            callback()
        except Exception as exc:
            warnings.warn(f"CUDAGraph destroy callback {callback!r} raised {exc!r}", RuntimeWarning)


class GraphHookMethods:
    """The ``register_*`` methods of :class:`~jaxgraph.CUDAGraph` (which owns ``self._hooks``)."""

    _hooks: GraphHooks

    def register_capture_end_hook(self, hook: Callable[[Any], None]) -> RemovableHandle:
        """Run ``hook(graph)`` when capture ends, before the graph is finalized.

        The ``cudaGraph_t`` is live (:meth:`raw_cuda_graph`) for both ``keep_graph``
        modes. Hooks fire in registration order; ``remove()`` on the handle deregisters.
        """
        return self._hooks.register("capture_end", hook, "register_capture_end_hook")

    def register_post_instantiate_hook(self, hook: Callable[[Any], None]) -> RemovableHandle:
        """Run ``hook(graph)`` after each instantiation, re-instantiation included.

        The new executable is :meth:`raw_cuda_graph_exec`; hooks fire in registration order.
        """
        return self._hooks.register("post_instantiate", hook, "register_post_instantiate_hook")

    def register_replay_start_hook(self, hook: Callable[[Any], None]) -> RemovableHandle:
        """Run ``hook(graph)`` at each :meth:`replay`, just before the launch."""
        return self._hooks.register("replay_start", hook, "register_replay_start_hook")

    def register_replay_end_hook(self, hook: Callable[[Any], None]) -> RemovableHandle:
        """Run ``hook(graph)`` at each :meth:`replay`, after the launch, even when it raised."""
        return self._hooks.register("replay_end", hook, "register_replay_end_hook")

    def register_destroy_callback(self, callback: Callable[[], None]) -> RemovableHandle:
        """Run ``callback()`` (no argument) when the captured graph is destroyed.

        That is at the next :meth:`reset` or when this object is collected,
        whichever comes first. Callbacks fire in registration order, each
        exactly once (register again after recapturing); one that raises is
        reported as a warning. A callback must not refer to the graph itself:
        it is kept until the graph is destroyed, so it would keep the graph alive.
        """
        return self._hooks.register("destroy", callback, "register_destroy_callback")
