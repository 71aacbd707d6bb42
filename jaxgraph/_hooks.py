"""Hooks on graphs: registration, :class:`RemovableHandle`, and destroy callbacks.

A graph keeps each kind of hook in an ``OrderedDict`` keyed by handle id, so
hooks fire in registration order and a handle can remove exactly its own.
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections import OrderedDict
from typing import Any

__all__ = ["RemovableHandle", "fire_destroy_callbacks", "register_hook", "run_hooks"]


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
# Registration and firing
# ----------------------------------------------------------------------------


def register_hook(hooks: OrderedDict, hook: Any, what: str) -> RemovableHandle:
    """Add ``hook`` to ``hooks``; ``what`` names the registering method in errors."""
    if not callable(hook):
        raise TypeError(f"{what} expects a callable, got {type(hook).__name__}")
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


def run_hooks(hooks: OrderedDict, graph: Any) -> None:
    """Call each hook with ``graph``, in registration order (a hook may remove hooks)."""
    for hook in list(hooks.values()):
        hook(graph)


def fire_destroy_callbacks(callbacks: OrderedDict) -> None:
    """Call and forget every callback, in order; one that raises is reported as a warning."""
    pending = list(callbacks.values())
    callbacks.clear()  # each fires exactly once, even if a later one raises
    for callback in pending:
        try:
            callback()
        except Exception as exc:
            warnings.warn(f"CUDAGraph destroy callback {callback!r} raised {exc!r}", RuntimeWarning)
