"""Checkpointed device loops: the forward that stores checkpoints and the backward that replays them.

``jax.grad`` of a :class:`~jaxgraph.GraphedLoop` (``_jax_interop/loop_grad.py``)
runs two CUDA graphs built here, each one launch:

- the **forward** runs the step R times and copies the fed state into a
  checkpoint slot at the start of every segment of C steps;
- the **backward** walks the segments from the last to the first: it copies
  the segment's checkpoint into the step's inputs, recomputes the segment's
  states into a ring of C slots, then runs the captured backward step from
  the segment's last step down to its first, handing each step's input
  cotangent to the step before it and summing the parameters' cotangents.

The steps of R are split as ``R = L0 + nfull * C`` with ``L0 = R mod C``:
a partial segment of L0 steps first (checkpoint slot 0, one WHILE trip per
step, read from a device counter), then ``nfull`` full segments (one WHILE
trip per segment, its C steps unrolled at fixed addresses). R may be fixed at
build time or read on the device (a count given per call or traced): the
control kernel derives ``nfull``, ``L0`` and the slot of each segment from R
on the device, so no step or segment goes back to the host.

Both graphs are first written as a small *program* (:class:`Program`: ops
lists, step and backward nodes, control kernels, WHILE regions), which
:func:`capture_program` captures with jaxgraph's own ``graph()``,
``while_loop`` and ``replay()`` (a captured graph replayed in a capture
becomes a child-graph node). The same program runs on numpy in the CPU tests
(``tests/jax_interop/loop_grad_support.py``), with :func:`control_reference`
standing for the control kernel.

Memory: ``slots + C`` states (``slots = ceil(R / C)``, or ``ceil(max_steps / C)``
for a count chosen per call), plus one float accumulator per differentiable
parameter.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from .._kernels.kernel import Kernel
from .._kernels.kernel_sets import KernelSets

__all__ = ["CheckpointLayout", "GRAD_SOURCE", "Op", "Program", "Ref", "backward_program", "capture_program",
           "checkpoint_layout", "control_reference", "forward_program", "grad_kernels", "segments"]

# Unrolled steps per full segment are child-graph nodes of one WHILE body: bounded like unroll=.
MAX_CHECKPOINT_EVERY = 256


# ----------------------------------------------------------------------------
# Layout: how R steps split into checkpointed segments
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CheckpointLayout:
    """C and the checkpoint slots of a differentiated loop.

    Attributes
    ----------
    every : int
        C, the steps per segment (``checkpoint_every``).
    slots : int
        Checkpoint slots: ``ceil(max_steps / C)`` (at least 1).
    max_steps : int
        The most steps a launch may run (R itself for a fixed count).
    fixed : int
        R when fixed at build time, else -1 (read on the device).
    """

    every: int
    slots: int
    max_steps: int
    fixed: int

    @property
    def states(self) -> int:
        """States held: the checkpoint slots plus the recompute ring (``slots + C``)."""
        return self.slots + self.every


def checkpoint_layout(fixed: int, max_steps: int, every: int | None) -> CheckpointLayout:
    """The layout for R = ``fixed`` (or -1: read on the device, at most ``max_steps``).

    Default C: for a fixed R, the divisor of R nearest sqrt(R) within
    [sqrt(R)/2, 2 sqrt(R)] (no partial segment), else ceil(sqrt(max_steps));
    capped at :data:`MAX_CHECKPOINT_EVERY`.
    """
    if every is None:
        root = math.sqrt(max(1, max_steps))
        every = math.ceil(root)
        if fixed > 0:
            divisors = [c for c in range(max(1, math.ceil(root / 2)), int(2 * root) + 1) if fixed % c == 0]
            if divisors:
                every = min(divisors, key=lambda c: (abs(c - root), c))
        every = max(1, min(MAX_CHECKPOINT_EVERY, every))
    return CheckpointLayout(every, max(1, math.ceil(max_steps / every)), max_steps, fixed)


def segments(r: int, every: int) -> list[tuple[int, int, int]]:
    """``(slot, first step, length)`` of each segment of ``r`` steps, in forward order (partial first)."""
    partial, nfull = r % every, r // every
    out = [(0, 0, partial)] if partial else []
    p = 1 if partial else 0
    out += [(p + s, partial + s * every, every) for s in range(nfull)]
    return out


# ----------------------------------------------------------------------------
# Programs: what the two graphs do, before they are graphs
# ----------------------------------------------------------------------------

# Control-kernel operations (jaxgraph_grad_ctl's `op`).
FWD_BEGIN, FWD_PART_NEXT, FWD_FULL_NEXT, BWD_BEGIN, BWD_FULL_NEXT = 0, 1, 2, 3, 4
REC_PART_BEGIN, REC_PART_NEXT, BWD_PART_BEGIN, BWD_PART_NEXT = 5, 6, 7, 8
# plan[] entries the control kernel keeps (int32 on the device).
P_R, P_NFULL, P_L0, P_P, P_SEG, P_J, P_OVER = range(7)
PLAN_WORDS = 8

# Ops kinds (jaxgraph_grad_ops).
COPY, ZERO, ADD_F32, ADD_F64, NAN_F32, NAN_F64, FILL_FF = range(7)
_ADD = {np.dtype(np.float32): ADD_F32, np.dtype(np.float64): ADD_F64}


@dataclasses.dataclass(frozen=True)
class Ref:
    """A place in a named buffer: slot ``slot`` (of the buffer's leading axis for slotted buffers),
    plus the device counter ``plan[index]`` when ``index`` is set."""

    name: str
    slot: int = 0
    index: int | None = None


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation of an ops kernel: ``dst op= src`` over ``nbytes``; ``only_if_over``: only when R overflowed."""

    kind: int
    dst: Ref
    src: Ref | None
    nbytes: int
    only_if_over: bool = False


@dataclasses.dataclass
class Program:
    """A graph to be: a list of nodes, each ``("ops", [Op])``, ``("step",)``, ``("backward",)``,
    ``("ctl", op)`` or ``("while", pred_name, Program)``."""

    nodes: list = dataclasses.field(default_factory=list)

    def ops(self, ops: Sequence[Op]) -> None:
        ops = [o for o in ops if o.nbytes > 0]
        if ops:
            self.nodes.append(("ops", ops))

    def step(self, retarget: tuple = ()) -> None:
        """The step; ``retarget``: ``((buffer name, Ref), ...)``, a clone reading/writing those places instead."""
        self.nodes.append(("step", tuple(retarget)))

    def backward(self, retarget: tuple = ()) -> None:
        self.nodes.append(("backward", tuple(retarget)))

    def ctl(self, op: int) -> None:
        self.nodes.append(("ctl", op))

    def while_(self, pred: str) -> "Program":
        body = Program()
        self.nodes.append(("while", pred, body))
        return body


@dataclasses.dataclass(frozen=True)
class Parts:
    """The step's buffers as the programs name them.

    ``fed``: ``(output o, input i, nbytes)`` per fed pair; ``params``: ``(input i, grad slot s, dtype, nbytes)``
    per differentiable parameter; ``fed_grads``: input i -> grad slot (None: no cotangent);
    ``other_outputs``: ``(o, nbytes)`` of outputs not fed; ``outputs``: ``(o, dtype, nbytes)`` of all.
    """

    fed: tuple
    params: tuple
    fed_grads: dict
    other_outputs: tuple
    outputs: tuple
    rerun_forward: bool   # the backward reads the step's outputs: run the step before it


def forward_program(parts: Parts, every: int, retarget: bool = False) -> Program:
    """The forward: R steps, the fed state copied into checkpoint slot ``seg`` at each segment's start.

    ``retarget``: a full segment's steps alternate the step and its twin with X and Y swapped (no copy
    between steps; one after an odd segment), and the state is copied into Y at the end.
    """
    prog = Program()
    # Y = X first, so a launch that runs no step returns its inputs (as the plain loop does).
    prog.ops([Op(COPY, Ref(f"y{o}"), Ref(f"x{i}"), n) for o, i, n in parts.fed]
             + [Op(COPY, Ref(f"ck{i}", 0), Ref(f"x{i}"), n) for o, i, n in parts.fed])
    prog.ctl(FWD_BEGIN)
    part = prog.while_("part")
    part.step()
    part.ops(_feed_back(parts))
    part.ctl(FWD_PART_NEXT)
    full = prog.while_("full")
    full.ops([Op(COPY, Ref(f"ck{i}", 0, P_SEG), Ref(f"x{i}"), n) for o, i, n in parts.fed])
    if retarget:
        swapped = tuple(r for o, i, n in parts.fed for r in ((f"x{i}", Ref(f"y{o}")), (f"y{o}", Ref(f"x{i}"))))
        for k in range(every):
            full.step(swapped if k % 2 else ())
        if every % 2:
            full.ops(_feed_back(parts))
    else:
        for _ in range(every):
            full.step()
            full.ops(_feed_back(parts))
    full.ctl(FWD_FULL_NEXT)
    if retarget:  # the state is in X after every path; the outputs are Y
        prog.ops([Op(COPY, Ref(f"y{o}"), Ref(f"x{i}"), n) for o, i, n in parts.fed])
    prog.ops(_poison(parts.outputs, "y"))
    return prog


def backward_program(parts: Parts, every: int, retarget: bool = False) -> Program:
    """The backward: segments last to first, each recomputed from its checkpoint into the ring, then
    the backward step from the segment's last step to its first.

    ``retarget`` (a backward that does not read the step's outputs): in a full segment, step j is a
    clone that reads ring slot j and writes slot j + 1, and backward step j a clone that reads slot j,
    so no state is copied between steps.
    """
    if retarget and parts.rerun_forward:
        raise ValueError("retargeted steps need a backward that does not read the step's outputs")
    prog = Program()
    prog.ops([Op(ZERO, Ref(f"acc{i}"), None, n) for i, s, dt, n in parts.params])
    prog.ctl(BWD_BEGIN)
    full = prog.while_("full")
    if retarget:
        full.ops([Op(COPY, Ref(f"ring{i}", 0), Ref(f"ck{i}", 0, P_SEG), n) for o, i, n in parts.fed])
        for j in range(every - 1):
            full.step(tuple(r for o, i, n in parts.fed
                            for r in ((f"x{i}", Ref(f"ring{i}", j)), (f"y{o}", Ref(f"ring{i}", j + 1)))))
        for j in range(every - 1, -1, -1):
            _backward_step(full, parts, [], tuple((f"x{i}", Ref(f"ring{i}", j)) for o, i, n in parts.fed))
    else:
        full.ops([Op(COPY, Ref(f"x{i}"), Ref(f"ck{i}", 0, P_SEG), n) for o, i, n in parts.fed]
                 + [Op(COPY, Ref(f"ring{i}", 0), Ref(f"ck{i}", 0, P_SEG), n) for o, i, n in parts.fed])
        for j in range(every - 1):
            full.step()
            full.ops(_feed_back(parts)
                     + [Op(COPY, Ref(f"ring{i}", j + 1), Ref(f"y{o}"), n) for o, i, n in parts.fed])
        for j in range(every - 1, -1, -1):
            _backward_step(full, parts, [Op(COPY, Ref(f"x{i}"), Ref(f"ring{i}", j - 1), n)
                                         for o, i, n in parts.fed] if j > 0 else [])
    full.ctl(BWD_FULL_NEXT)
    # The partial segment (slot 0, L0 steps), a WHILE trip per step, ring slots read from plan[J].
    prog.ops([Op(COPY, Ref(f"x{i}"), Ref(f"ck{i}", 0), n) for o, i, n in parts.fed]
             + [Op(COPY, Ref(f"ring{i}", 0), Ref(f"ck{i}", 0), n) for o, i, n in parts.fed])
    prog.ctl(REC_PART_BEGIN)
    rec = prog.while_("part")
    rec.step()
    rec.ops(_feed_back(parts) + [Op(COPY, Ref(f"ring{i}", 1, P_J), Ref(f"y{o}"), n) for o, i, n in parts.fed])
    rec.ctl(REC_PART_NEXT)
    prog.ctl(BWD_PART_BEGIN)
    back = prog.while_("part")
    back.ops([Op(COPY, Ref(f"x{i}"), Ref(f"ring{i}", 0, P_J), n) for o, i, n in parts.fed])
    _backward_step(back, parts, [])
    back.ctl(BWD_PART_NEXT)
    # The fed inputs' cotangents: what the cotangent buffers hold now (the outputs' own when R = 0).
    prog.ops([Op(COPY, Ref(f"lam{i}"), Ref(f"ct{o}"), n) for o, i, n in parts.fed if f"lam{i}" in _lam_names(parts)])
    prog.ops(_poison([(f"lam{i}", np.dtype(dt), n) for i, dt, n in _lam_dtypes(parts)]
                     + [(f"acc{i}", np.dtype(dt), n) for i, s, dt, n in parts.params], None))
    return prog


def _feed_back(parts: Parts) -> list:
    return [Op(COPY, Ref(f"x{i}"), Ref(f"y{o}"), n) for o, i, n in parts.fed]


def _backward_step(prog: Program, parts: Parts, then: list, retarget: tuple = ()) -> None:
    """(The step again, when the backward reads its outputs,) the backward step, then its bookkeeping:
    the fed inputs' cotangents become the cotangents of the step before, parameters' are summed,
    the other outputs' cotangents (only the last step's) are cleared, and ``then`` (the next state)."""
    if parts.rerun_forward:
        prog.step()
    prog.backward(retarget)
    ops = []
    for o, i, n in parts.fed:
        s = parts.fed_grads.get(i)
        ops.append(Op(COPY, Ref(f"ct{o}"), Ref(f"g{s}"), n) if s is not None else Op(ZERO, Ref(f"ct{o}"), None, n))
    ops += [Op(_ADD[np.dtype(dt)], Ref(f"acc{i}"), Ref(f"g{s}"), n) for i, s, dt, n in parts.params]
    ops += [Op(ZERO, Ref(f"ct{o}"), None, n) for o, n in parts.other_outputs]
    prog.ops(ops + then)


def _lam_dtypes(parts: Parts) -> list:
    return [(i, dt, n) for (o, i, n), dt in zip(parts.fed, _fed_dtypes(parts)) if np.issubdtype(dt, np.inexact)]


def _fed_dtypes(parts: Parts) -> list:
    dtypes = {o: dt for o, dt, n in parts.outputs}
    return [np.dtype(dtypes[o]) for o, i, n in parts.fed]


def _lam_names(parts: Parts) -> set:
    return {f"lam{i}" for i, dt, n in _lam_dtypes(parts)}


def _poison(buffers: Sequence, prefix: str | None) -> list:
    """NaN into every float buffer, applied only when the count overflowed ``max_steps``."""
    ops = []
    for name, dt, n in buffers:
        name = f"{prefix}{name}" if prefix else name
        dt = np.dtype(dt)
        kind = {np.dtype(np.float32): NAN_F32, np.dtype(np.float64): NAN_F64}.get(
            dt, FILL_FF if np.issubdtype(dt, np.floating) else None)
        if kind is not None:
            ops.append(Op(kind, Ref(name), None, n, only_if_over=True))
    return ops


def control_reference(plan: np.ndarray, preds: dict, op: int, count: int, fixed: int, every: int,
                      max_steps: int) -> int | None:
    """What ``jaxgraph_grad_ctl`` does, in Python (the CPU tests run programs with it).

    Returns the R to record (the forward's ``r_out``) for the begin operations, else ``None``.
    """
    if op in (FWD_BEGIN, BWD_BEGIN):
        raw = fixed if fixed >= 0 else count
        over = int(raw > max_steps)
        r = 0 if over or raw < 0 else raw
        plan[P_R], plan[P_NFULL], plan[P_L0] = r, r // every, r % every
        plan[P_P], plan[P_OVER] = int(plan[P_L0] > 0), over
        preds["full"] = int(plan[P_NFULL] > 0)
        if op == FWD_BEGIN:
            plan[P_J], plan[P_SEG] = 0, plan[P_P]
            preds["part"] = int(plan[P_L0] > 0)
        else:
            plan[P_SEG] = plan[P_P] + plan[P_NFULL] - 1
        return raw if over else r
    if op == FWD_PART_NEXT:
        plan[P_J] += 1
        preds["part"] = int(plan[P_J] < plan[P_L0])
    elif op == FWD_FULL_NEXT:
        plan[P_SEG] += 1
        preds["full"] = int(plan[P_SEG] < plan[P_P] + plan[P_NFULL])
    elif op == BWD_FULL_NEXT:
        plan[P_SEG] -= 1
        preds["full"] = int(plan[P_SEG] >= plan[P_P])
    elif op == REC_PART_BEGIN:
        plan[P_J] = 0
        preds["part"] = int(plan[P_J] < plan[P_L0] - 1)
    elif op == REC_PART_NEXT:
        plan[P_J] += 1
        preds["part"] = int(plan[P_J] < plan[P_L0] - 1)
    elif op == BWD_PART_BEGIN:
        plan[P_J] = plan[P_L0] - 1
        preds["part"] = int(plan[P_J] >= 0)
    elif op == BWD_PART_NEXT:
        plan[P_J] -= 1
        preds["part"] = int(plan[P_J] >= 0)
    else:
        raise ValueError(f"unknown control op {op}")
    return None


# ----------------------------------------------------------------------------
# Kernels (NVRTC, once per process and device)
# ----------------------------------------------------------------------------

GRAD_SOURCE = r"""
typedef unsigned long long u64;

// The segment and step counters of a checkpointed loop (see checkpoint_loop.py: control_reference is this
// kernel in Python). plan: R, nfull, L0, p (1 if a partial segment), seg, j, overflow. One thread.
extern "C" __global__ void jaxgraph_grad_ctl(int* plan, int* full, int* part, const int* count, int fixed,
                                             int every, int max_steps, int op, int* r_out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  switch (op) {
    case 0: case 3: {
      int raw = fixed >= 0 ? fixed : *count;
      int over = raw > max_steps;
      int r = (over || raw < 0) ? 0 : raw;
      plan[0] = r; plan[1] = r / every; plan[2] = r % every; plan[3] = plan[2] > 0; plan[6] = over;
      *full = plan[1] > 0;
      if (op == 0) { plan[5] = 0; plan[4] = plan[3]; *part = plan[2] > 0; if (r_out) *r_out = over ? raw : r; }
      else plan[4] = plan[3] + plan[1] - 1;
      break;
    }
    case 1: plan[5] += 1; *part = plan[5] < plan[2]; break;
    case 2: plan[4] += 1; *full = plan[4] < plan[3] + plan[1]; break;
    case 4: plan[4] -= 1; *full = plan[4] >= plan[3]; break;
    case 5: plan[5] = 0; *part = plan[5] < plan[2] - 1; break;
    case 6: plan[5] += 1; *part = plan[5] < plan[2] - 1; break;
    case 7: plan[5] = plan[2] - 1; *part = plan[5] >= 0; break;
    case 8: plan[5] -= 1; *part = plan[5] >= 0; break;
  }
}

// One ops list: op blockIdx.y of `table` (8 words each: dst, src, nbytes, dst stride, src stride,
// index (int*: slot counter) or 0, overflow flag (int*) or 0, kind), grid-stride over its bytes.
// A fixed-address memcpy node cannot follow a device counter; this kernel does, and batches a step's
// bookkeeping (feed back, ring store, cotangent hand-over, parameter sums) into one launch.
extern "C" __global__ void jaxgraph_grad_ops(const u64* table) {
  const u64* t = table + 8 * blockIdx.y;
  const int* index = (const int*)t[5];
  const int* over = (const int*)t[6];
  const int kind = (int)t[7];
  if (over && *over == 0) return;
  const long long k = index ? (long long)*index : 0;
  if (k < 0) return;
  unsigned char* dst = (unsigned char*)(t[0] + k * t[3]);
  const unsigned char* src = (const unsigned char*)(t[1] + k * t[4]);
  const u64 n = t[2];
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  switch (kind) {
    case 0:
      if ((((u64)dst | (u64)src | n) & 3) == 0) {
        for (u64 w = first; w < n / 4; w += stride) ((unsigned*)dst)[w] = ((const unsigned*)src)[w];
      } else {
        for (u64 b = first; b < n; b += stride) dst[b] = src[b];
      }
      break;
    case 1: for (u64 b = first; b < n; b += stride) dst[b] = 0; break;
    case 2: for (u64 e = first; e < n / 4; e += stride) ((float*)dst)[e] += ((const float*)src)[e]; break;
    case 3: for (u64 e = first; e < n / 8; e += stride) ((double*)dst)[e] += ((const double*)src)[e]; break;
    case 4: for (u64 e = first; e < n / 4; e += stride) ((unsigned*)dst)[e] = 0x7fc00000u; break;
    case 5: for (u64 e = first; e < n / 8; e += stride) ((u64*)dst)[e] = 0x7ff8000000000000ull; break;
    case 6: for (u64 b = first; b < n; b += stride) dst[b] = 0xff; break;
  }
}
"""

_SIGNATURES = {
    "jaxgraph_grad_ctl": "int* plan, int* full, int* part, const int* count, int fixed, int every, "
                         "int max_steps, int op, int* r_out",
    "jaxgraph_grad_ops": "const unsigned long long* table",
}



def grad_kernels(arch: str | None = None) -> dict[str, Kernel]:
    """The control and ops kernels compiled (not loaded) for ``arch``; CPU tests compile them this way."""
    return {name: Kernel(GRAD_SOURCE, name, {"include_path": []}, signature=sig, arch=arch)
            for name, sig in _SIGNATURES.items()}


_GRAD = KernelSets(grad_kernels)  # compiled for the loop's device, loaded once


# ----------------------------------------------------------------------------
# Capturing a program into a CUDA graph
# ----------------------------------------------------------------------------

_THREADS = 256


def make_variants(programs: Sequence[Program], buffers: dict, slot_bytes: dict, step_graph: Any,
                  backward_graph: Any) -> tuple[dict, str]:
    """The clones the programs' retargeted nodes need: ``({(kind, retarget): CUgraph address}, "")``, or
    ``({}, why)`` where one cannot be made safely (a pointer inside a struct, a memcpy node, ...)."""
    from .._cuda.native import native
    from .cuda_graph import replay_source

    dl = native("device_loop")
    sources = {"step": replay_source(step_graph), "backward": replay_source(backward_graph)}
    made: dict = {}
    for key in _retargeted(programs):
        kind, retarget = key
        if key in made:
            continue
        pairs: list = []
        for name, ref in retarget:
            a, b = buffers[name].ptr, _address(ref, buffers, slot_bytes)[0]
            if (b, a) not in [(x, y) for x, y, _ in pairs]:  # a swap names both directions once
                pairs.append((a, b, buffers[name].nbytes))
        clone, why = dl.swap_variant(sources[kind].template, pairs, dict(sources[kind].kernels))
        if not clone:
            destroy_variants(made)
            return {}, why
        made[key] = clone
    return made, ""


def destroy_variants(variants: dict) -> None:
    """Destroy the clones (child-graph nodes hold their own copies of them)."""
    from .._cuda.native import native

    for clone in variants.values():
        native("device_loop").destroy_graph(clone)
    variants.clear()


def _retargeted(programs: Sequence[Program]) -> list:
    out = []
    for prog in programs:
        for node in prog.nodes:
            if node[0] in ("step", "backward") and node[1]:
                out.append((node[0], node[1]))
            elif node[0] == "while":
                out += _retargeted([node[2]])
    return out


def _embed_clone(clone: int) -> None:
    """Add the graph at ``clone`` as a child-graph node to the capture on the current stream."""
    from .._cuda import driver as _driver
    from .._cuda.stream import current_stream
    from .conditional_nodes import add_node

    drv = _driver.driver()
    params = drv.CUgraphNodeParams()
    params.type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_GRAPH
    params.graph.graph = drv.CUgraph(clone)
    add_node(current_stream(), params)


def capture_program(prog: Program, buffers: dict, slot_bytes: dict, step_graph: Any, backward_graph: Any,
                    plan: Any, preds: dict, count: Any, fixed: int, every: int, max_steps: int,
                    r_out: Any, device: int, variants: dict | None = None) -> tuple[Any, list]:
    """Capture ``prog`` into a new :class:`~jaxgraph.CUDAGraph`; returns it and the ops tables it reads.

    ``buffers`` maps the program's buffer names to device arrays, ``slot_bytes`` the slotted ones
    (checkpoints, ring) to their slot size; ``plan`` (int32, :data:`PLAN_WORDS`), ``preds``
    (``{"full", "part"}``, one int32 each), ``count`` (the device count, or a dummy when
    ``fixed >= 0``) and ``r_out`` (the forward's record of R, or a dummy) are the control state.
    The tables must live as long as the graph (the caller keeps them). ``variants``: the clones of
    :func:`make_variants` for the program's retargeted nodes (the graphs they clone are embedded too,
    in the partial segment, which keeps their pools and kernels alive with this graph).
    """
    from .._cuda.array import asarray
    from .capture_contexts import graph
    from .cuda_graph import CUDAGraph
    from .conditional_regions import while_loop

    ks = _GRAD.on(device)
    ctl, ops_kernel = ks["jaxgraph_grad_ctl"], ks["jaxgraph_grad_ops"]
    tables: list = []

    def table_of(ops: list) -> tuple[Any, int]:
        rows = np.zeros((len(ops), 8), np.uint64)
        widest = 0
        for r, op in enumerate(ops):
            dst, dstride = _address(op.dst, buffers, slot_bytes)
            src, sstride = _address(op.src, buffers, slot_bytes) if op.src is not None else (0, 0)
            index = op.dst.index if op.dst.index is not None else (op.src.index if op.src is not None else None)
            rows[r] = (dst, src, op.nbytes, dstride if op.dst.index is not None else 0,
                       sstride if op.src is not None and op.src.index is not None else 0,
                       plan.ptr + 4 * index if index is not None else 0,
                       plan.ptr + 4 * P_OVER if op.only_if_over else 0, op.kind)
            widest = max(widest, op.nbytes)
        t = asarray(rows)
        tables.append(t)
        return t, max(1, min(1024, -(-widest // (4 * _THREADS))))

    # Tables first: nothing allocates or copies during the capture.
    prepared = _prepare(prog, table_of)
    g = CUDAGraph()

    def emit(nodes: list) -> None:
        for node in nodes:
            if node[0] == "ops":
                t, blocks = node[1]
                ops_kernel[(blocks, node[2]), _THREADS](t)
            elif node[0] in ("step", "backward") and node[1]:
                _embed_clone(variants[(node[0], node[1])])
            elif node[0] == "step":
                step_graph.replay()
            elif node[0] == "backward":
                backward_graph.replay()
            elif node[0] == "ctl":
                ctl[1, 1](plan, preds["full"], preds["part"], count, fixed, every, max_steps, node[1], r_out)
            else:
                with while_loop(preds[node[1]]):
                    emit(node[2])

    with graph(g):
        emit(prepared)
    return g, tables


def _prepare(prog: Program, table_of: Any) -> list:
    """``prog``'s nodes with each ops list replaced by its uploaded table (and op count)."""
    out = []
    for node in prog.nodes:
        if node[0] == "ops":
            out.append(("ops", table_of(node[1]), len(node[1])))
        elif node[0] == "while":
            out.append(("while", node[1], _prepare(node[2], table_of)))
        else:
            out.append(node)
    return out


def _address(ref: Ref, buffers: dict, slot_bytes: dict) -> tuple[int, int]:
    """The address of ``ref``'s fixed slot and the bytes per slot."""
    a = buffers[ref.name]
    size = slot_bytes.get(ref.name, 0)
    if ref.slot and not size:
        raise ValueError(f"buffer {ref.name} has no slots")
    return a.ptr + ref.slot * size, size
