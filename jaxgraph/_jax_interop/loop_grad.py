"""``jax.grad`` through a :class:`~jaxgraph.GraphedLoop`: its ``jax.custom_vjp``, checks and memory.

A loop whose step is a graphed callable captured with ``backward=`` is
differentiable in reverse mode (``jax.grad``, ``jax.vjp``,
``jax.value_and_grad``, inside or outside ``jax.jit``). Outside ``grad`` the
loop is its plain graph. Under ``grad``:

- the forward is one launch of a *checkpointing* loop: every C steps it copies
  the fed state into a checkpoint slot (``_graphs/checkpoint_loop.py``); the
  slots are the residual JAX keeps for the backward;
- the backward is one launch too: for each segment, last to first, the state
  is restored from its checkpoint, the segment recomputed into a ring of C
  states, and the captured backward step run from the segment's last step to
  its first. No step or segment goes back to the host.

Cotangents: a fed input gets the cotangent handed back through all R steps;
an input that is not fed (a parameter) gets the sum over the steps of what
the backward step returns for it; integer inputs (and the count) get none.
The outputs that are not fed come from the last step only, so their
cotangents enter the last step's backward only. With ``until=``, the loop runs
as usual and the checkpointed forward then reruns the ``steps_run`` steps it
ran: the gradient is that of what the loop returned.

Memory: ``slots + C`` states on the device (``slots = ceil(R / C)``, C about
sqrt(R) by default), plus the residual XLA keeps between forward and
backward (the ``slots`` checkpoints again): :func:`checkpoint_memory`.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .._cuda import driver as _driver
from .._cuda.array import zeros
from .._graphs import checkpoint_loop as _ckpt
from .graphed_callables import GraphedCallable, flat_statics

__all__ = ["LoopGradient", "RETARGET", "checkpoint_memory", "check_checkpoint_options", "differentiable",
           "loop_gradient"]

# Retargeted steps (checkpoint_loop's ``retarget=``): the full segments run clones of the step and of
# its backward pointed at the ring slots, and the forward alternates the step with its swapped twin, so
# no state is copied between steps (4 launches a step instead of 6). On since both ways passed
# tests/jax_interop/test_loop_grad_gpu.py on an H200 (2026-11-28), where it was the faster
# (benchmarks/results/nvidia-h200-grad-loop.md); a step it cannot clone runs the copying programs.
RETARGET = True


# ----------------------------------------------------------------------------
# The custom_vjp a loop's JAX function carries
# ----------------------------------------------------------------------------


def differentiable(loop: Any, primal: Any) -> Any:
    """``primal`` (the loop's replayable) wrapped in a ``jax.custom_vjp`` that runs the checkpointed loops.

    Nothing is built until ``jax.grad`` (or ``vjp``) traces the loop: then
    :func:`loop_gradient` checks the loop and builds its two graphs, before
    anything is launched.
    """
    import jax

    @jax.custom_vjp
    def fn(*args: Any) -> Any:
        return primal(*args)

    def fwd(*args: Any) -> Any:
        return loop_gradient(loop).forward(primal, args)

    def bwd(residuals: Any, cotangents: Any) -> tuple:
        return loop_gradient(loop).backward(residuals, cotangents)

    fn.defvjp(fwd, bwd)
    return fn


def loop_gradient(loop: Any) -> "LoopGradient":
    """The loop's :class:`LoopGradient`, checked and built on first use (raises what cannot be differentiated)."""
    with loop._lock:
        grad = getattr(loop, "_gradient", None)
        if grad is None:
            grad = loop._gradient = LoopGradient(loop)
        return grad


def check_checkpoint_options(checkpoint_every: Any, max_steps: Any, fixed: int) -> tuple[int | None, int | None]:
    """Check ``graphed_loop``'s ``checkpoint_every`` and ``max_steps`` (no device work)."""
    out = []
    for name, value, top in (("checkpoint_every", checkpoint_every, _ckpt.MAX_CHECKPOINT_EVERY),
                             ("max_steps", max_steps, 2**31 - 1)):
        if value is None:
            out.append(None)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if not 1 <= value <= top:
            raise ValueError(f"{name} must be in [1, {top}], got {value}")
        out.append(int(value))
    if fixed >= 0 and out[1] is not None and out[1] != fixed:
        raise ValueError(f"max_steps={out[1]} is for loops whose count is chosen per launch; this loop runs a "
                         f"fixed {fixed} steps: leave max_steps out")
    return out[0], out[1]


def checkpoint_memory(loop: Any, steps: int | None = None) -> dict:
    """What differentiating ``loop`` holds on the device (see :meth:`GraphedLoop.checkpoint_memory`)."""
    fixed = loop.steps if loop.steps is not None else -1
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise ValueError(f"steps must be an int >= 0, got {steps!r}")
        if fixed >= 0 and steps != fixed:
            raise ValueError(f"this loop runs a fixed {fixed} steps, got steps={steps}")
        fixed = int(steps)
    max_steps = fixed if fixed >= 0 else loop._max_steps
    if max_steps is None:
        raise ValueError("this loop's count is chosen per launch: pass steps= (or build it with max_steps=)")
    # As LoopGradient lays it out: with until= the steps that run are read on the device.
    layout = _ckpt.checkpoint_layout(-1 if loop._until is not None else fixed, max_steps, loop._checkpoint_every)
    state = sum(loop.inputs[i].nbytes for i in loop.feed.values())
    if max_steps == 0:
        return {"checkpoint_every": layout.every, "slots": 0, "ring": 0, "state_bytes": state,
                "device_bytes": 0, "residual_bytes": 0}
    return {"checkpoint_every": layout.every, "slots": layout.slots, "ring": layout.every, "state_bytes": state,
            "device_bytes": layout.states * state, "residual_bytes": layout.slots * state}


# ----------------------------------------------------------------------------
# LoopGradient
# ----------------------------------------------------------------------------


class LoopGradient:
    """The checkpointed forward and the backward of one loop, as replayables (built once per loop)."""

    def __init__(self, loop: Any):
        step = loop._step
        _check_differentiable(loop, step)
        self.loop = loop
        self.n_in = len(loop.inputs)
        self.own_count = bool(loop._count_is_own)
        self.until = loop._until is not None
        fixed = loop.steps if loop.steps is not None else -1
        max_steps = fixed if fixed >= 0 else loop._max_steps
        if max_steps is None:
            raise ValueError("jax.grad of a graphed_loop whose count is chosen per launch needs a bound on the "
                             "count for its checkpoint slots: build it with graphed_loop(..., max_steps=M); a "
                             "launch with more than M steps returns NaN outputs and gradients")
        # With until=, the checkpointed forward reruns the steps_run steps the loop ran: a count read
        # on the device, at most R.
        self.layout = _ckpt.checkpoint_layout(-1 if self.until else fixed, max_steps, loop._checkpoint_every)
        static_ct, static_grad, grad_slots, used = step._backward_parts
        static_in, static_out = flat_statics(step)
        self.static_in, self.static_out, self.static_ct = static_in, static_out, static_ct
        self.grad_slots = grad_slots
        fed = sorted(loop.feed.items())                       # (output o, input i)
        fed_inputs = {i for o, i in fed}
        self.fed = fed
        self.params = [i for i in range(self.n_in) if i not in fed_inputs]
        for i in self.params:
            s = grad_slots[i]
            if s is not None and np.dtype(static_in[i].dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
                raise TypeError(f"jax.grad of a graphed_loop sums each parameter's cotangent over the steps in "
                                f"float32 or float64; input {i} is {static_in[i].dtype}: make it float32/float64, "
                                "or feed it")
        n_out = len(static_out)
        fed_outputs = {o for o, i in fed}
        self.parts = _ckpt.Parts(
            fed=tuple((o, i, static_in[i].nbytes) for o, i in fed),
            params=tuple((i, grad_slots[i], static_in[i].dtype, static_in[i].nbytes) for i in self.params
                         if grad_slots[i] is not None),
            fed_grads={i: grad_slots[i] for o, i in fed},
            other_outputs=tuple((o, static_out[o].nbytes) for o in range(n_out) if o not in fed_outputs),
            outputs=tuple((o, static_out[o].dtype, static_out[o].nbytes) for o in range(n_out)),
            rerun_forward=any(used[self.n_in:self.n_in + n_out]))
        # The backward's outputs: the fed float inputs' cotangents, then the parameters' sums.
        self._lam_order = [i for o, i in fed if np.issubdtype(static_in[i].dtype, np.inexact)]
        self._acc_order = [i for i, s, dt, n in self.parts.params]
        self.mode = "not built"   # "copies", "retargeted", or "copies: why not retargeted" once built
        self._built = False
        self._lock = threading.Lock()

    # -- building (device work; no launch of the loop) ---------------------------

    def _build(self) -> None:
        with self._lock:
            if self._built:
                return
            if self.layout.max_steps == 0:
                self._built = True
                return
            # The loop's device current: every buffer below is allocated there (device 0 may be current).
            with _driver.device_current(self.loop.graph.device):
                self._build_on_device()
            self._built = True

    def _build_on_device(self) -> None:
        """:meth:`_build`'s work, with the loop's device current; the caller holds the lock."""
        from .replayable import replayable

        loop, layout, step = self.loop, self.layout, self.loop._step
        device = loop.graph.device
        every, slots = layout.every, layout.slots
        ck = {i: zeros((slots, *self.static_in[i].shape), self.static_in[i].dtype) for o, i in self.fed}
        ring = {i: zeros((every, *self.static_in[i].shape), self.static_in[i].dtype) for o, i in self.fed}
        acc = {i: zeros(self.static_in[i].shape, self.static_in[i].dtype) for i, s, dt, n in self.parts.params}
        lam = {i: zeros(self.static_in[i].shape, self.static_in[i].dtype) for i in self._lam_order}
        _, static_grad, _, _ = step._backward_parts
        buffers = {**{f"x{i}": self.static_in[i] for o, i in self.fed},
                   **{f"y{o}": a for o, a in enumerate(self.static_out)},
                   **{f"ct{o}": a for o, a in enumerate(self.static_ct)},
                   **{f"g{s}": a for s, a in enumerate(static_grad)},
                   **{f"ck{i}": a for i, a in ck.items()}, **{f"ring{i}": a for i, a in ring.items()},
                   **{f"acc{i}": a for i, a in acc.items()}, **{f"lam{i}": a for i, a in lam.items()}}
        slot_bytes = {**{f"ck{i}": self.static_in[i].nbytes for i in ck},
                      **{f"ring{i}": self.static_in[i].nbytes for i in ring}}
        plan = zeros((_ckpt.PLAN_WORDS,), np.int32)
        preds = {"full": zeros((1,), np.int32), "part": zeros((1,), np.int32)}
        r_out, r_in = zeros((1,), np.int32), zeros((1,), np.int32)
        if self.until:
            count = self._run_count = zeros((1,), np.int32)   # steps_run, copied in at each launch
        else:
            count = loop.count if layout.fixed < 0 else zeros((1,), np.int32)
        fwd_prog, bwd_prog = _ckpt.forward_program(self.parts, every), _ckpt.backward_program(self.parts, every)
        variants: dict = {}
        self.mode = "copies"
        if RETARGET and self.parts.rerun_forward:
            self.mode = "copies: the backward reads the step's outputs"
        elif RETARGET:
            programs = (_ckpt.forward_program(self.parts, every, True),
                        _ckpt.backward_program(self.parts, every, True))
            variants, why = _ckpt.make_variants(programs, buffers, slot_bytes, step.graph, step.backward_graph)
            if variants:
                (fwd_prog, bwd_prog), self.mode = programs, "retargeted"
            else:
                self.mode = f"copies: {why}"
        common = dict(buffers=buffers, slot_bytes=slot_bytes, step_graph=step.graph,
                      backward_graph=step.backward_graph, plan=plan, preds=preds, fixed=layout.fixed,
                      every=every, max_steps=layout.max_steps, device=device, variants=variants)
        try:
            fwd_graph, fwd_tables = _ckpt.capture_program(fwd_prog, count=count, r_out=r_out, **common)
            bwd_graph, bwd_tables = _ckpt.capture_program(bwd_prog, count=r_in, r_out=zeros((1,), np.int32),
                                                          **common)
        finally:
            _ckpt.destroy_variants(variants)
        fed_ck = [ck[i] for o, i in self.fed]
        count_in = [count] if self.until else [loop.count] if self.own_count else []
        # Copied, not bound: the ops kernels reach the buffers through tables in device memory.
        self._fwd = replayable(fwd_graph, inputs=[*self.static_in, *count_in],
                               outputs=[*self.static_out, *fed_ck, r_out], bind="copy")
        bwd_outputs = [lam[i] for i in self._lam_order] + [acc[i] for i in self._acc_order]
        self._bwd = replayable(bwd_graph, inputs=[*fed_ck, *[self.static_in[i] for i in self.params],
                                                  *self.static_ct, r_in],
                               outputs=bwd_outputs, bind="copy")
        self._keep = (ck, ring, acc, lam, plan, preds, r_out, r_in, count, fwd_graph, bwd_graph,
                      fwd_tables, bwd_tables)

    # -- the custom_vjp rules ----------------------------------------------------

    def forward(self, primal: Any, args: tuple) -> tuple:
        """The fwd rule: the loop's outputs (as ``primal`` returns them) and the residuals."""
        self._build()
        params = tuple(args[i] for i in self.params)
        if self.layout.max_steps == 0:
            return primal(*args), (params, (), None)
        n_out = len(self.static_out)
        if self.until:
            # The loop as it runs (its stop), then the checkpointed forward over the steps it ran: the
            # gradient is that of what the loop returned (with check_every, the steps past the flag too).
            result = primal(*args)
            out = self._fwd(*args[:self.n_in], result[-1])
            return result, (params, tuple(out[n_out:-1]), out[-1])
        out = self._fwd(*args)
        outs, ck, r = out[:n_out], tuple(out[n_out:-1]), out[-1]
        result = outs[0] if n_out == 1 else tuple(outs)
        return result, (params, ck, r)

    def backward(self, residuals: tuple, cotangents: Any) -> tuple:
        """The bwd rule: one cotangent (or ``None``) per argument of the loop's JAX function."""
        import jax
        import jax.numpy as jnp

        params, ck, r = residuals
        n_out = len(self.static_out)
        cts = list(cotangents)[:n_out] if n_out + self.until > 1 else [cotangents]  # steps_run has none
        for o, a in enumerate(self.static_out):  # integer outputs get float0 cotangents from JAX
            if cts[o].dtype == jax.dtypes.float0:
                cts[o] = jnp.zeros(a.shape, a.dtype)
        grads: list = [None] * (self.n_in + (1 if self.own_count else 0))
        if self.layout.max_steps == 0:  # R = 0: the outputs are the fed inputs
            for o, i in self.fed:
                if np.issubdtype(self.static_in[i].dtype, np.inexact):
                    grads[i] = cts[o]
            return tuple(grads)
        out = self._bwd(*ck, *params, *cts, r)
        out = (out,) if not isinstance(out, tuple) else out
        for k, i in enumerate(self._lam_order + self._acc_order):
            grads[i] = out[k]
        return tuple(grads)


# ----------------------------------------------------------------------------
# Checks (no device work)
# ----------------------------------------------------------------------------


def _check_differentiable(loop: Any, step: Any) -> None:
    if not isinstance(step, GraphedCallable):
        raise TypeError("jax.grad of a graphed_loop needs a step made by make_graphed_callables(..., backward=bwd); "
                        "this loop's step is a CUDAGraph, which has no backward")
    if step.backward_graph is None or getattr(step, "_backward_parts", None) is None:
        raise TypeError(f"jax.grad of a graphed_loop needs its step to have a backward: capture it with "
                        f"make_graphed_callables({step.__name__}, sample_args, backward=bwd), where bwd(*args, "
                        "outputs, cotangents) launches the adjoint kernels")
    if not loop.feed:
        raise ValueError("jax.grad of a graphed_loop needs feed= (the state carried from step to step); a loop "
                         "without feed reruns the step on the same inputs")
    for g in (step.graph, step.backward_graph):
        if getattr(g, "_generators", None) or "jaxgraph_philox" in g.summary():
            raise NotImplementedError(
                "jax.grad of a graphed_loop whose step draws random numbers (jaxgraph.Generator) is refused: "
                "the backward recomputes steps from checkpoints and would draw other numbers. Draw the noise "
                "outside the loop and pass it in, or derive it in your kernel from the step's state")
