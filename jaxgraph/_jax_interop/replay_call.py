"""The function a :class:`~jaxgraph.Replayable` calls: the FFI call or the host callback, maybe with a VJP.

Built from the replayable's parts (its spec, state and backward), never from
the replayable itself, so no reference cycle keeps a replayable (and its graph
id) alive after its last reference goes.
"""

from __future__ import annotations

from typing import Any, Callable

from . import replay_native as _replay_native
from .host_callback import callback_replay
from .replay_spec import ReplaySpec
from .replay_state import ReplayState

__all__ = ["replay_function", "with_vjp"]


def replay_function(spec: ReplaySpec, via: str, host: Callable[..., Any] | None, state: ReplayState,
                    backward: Callable[..., Any] | None) -> Callable[..., Any]:
    """The FFI call (``via="ffi"``) or the host callback for ``spec``, with ``backward`` as its VJP if given."""
    def host_call(*args: Any) -> Any:  # the pure_callback target refuses a reset graph
        state.check_alive()
        return host(*args)

    ffi_replay = _replay_native.jaxgraph_replay(spec) if via == "ffi" else None  # built once, not per call

    def primal(*args: Any) -> Any:
        if ffi_replay is not None:
            out = ffi_replay(*args)
        else:
            out = callback_replay(spec.outputs, host_call, *args)
        return out[0] if len(out) == 1 else tuple(out)

    if backward is None:
        return primal
    return with_vjp(primal, backward, len(spec.inputs), len(spec.outputs) == 1)


def with_vjp(primal: Callable[..., Any], backward: Callable[..., Any], n_in: int, single: bool) -> Callable[..., Any]:
    """Wrap ``primal`` in ``jax.custom_vjp`` with ``backward(*inputs, *outputs, *cotangents)``."""
    import jax

    @jax.custom_vjp
    def fn(*args):
        return primal(*args)

    def fwd(*args):
        out = primal(*args)
        return out, (args, out)

    def bwd(residuals, cotangents):
        args, out = residuals
        outs = (out,) if single else tuple(out)
        cts = (cotangents,) if single else tuple(cotangents)
        grads = backward(*args, *outs, *cts)
        if not isinstance(grads, (tuple, list)):
            grads = (grads,)
        if len(grads) != n_in:
            raise ValueError(f"backward returned {len(grads)} cotangent(s); the replayable has {n_in} "
                             "input(s) (return None for an input without a gradient)")
        return tuple(grads)

    fn.defvjp(fwd, bwd)
    return fn
