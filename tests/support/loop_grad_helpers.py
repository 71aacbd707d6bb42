"""Shared by the loop-gradient tests (no tests here): a numpy machine that runs the checkpointed loops'
programs (``_graphs/checkpoint_loop.py``) node by node, and a small differentiable step to run on it.

The machine does what the device does with a program: ``ops`` rows over byte views of named buffers
(slots, counters from ``plan``), the step and backward step as numpy functions over the same buffers,
``control_reference`` for the control kernel, and a WHILE node that tests its predicate before every trip.

Tests internals: ``_graphs.checkpoint_loop``'s programs, ``Parts`` and ``control_reference`` (the device
runs them as graphs; here they run on numpy without a GPU).
"""

import numpy as np

from jaxgraph._graphs import checkpoint_loop as ck


def run_program(prog, bufs, slot_bytes, step, backward, count, fixed, every, max_steps, trace=None):
    """Run ``prog`` on ``bufs`` (name -> numpy array); returns the R the forward records (``r_out``)."""
    plan = np.zeros(ck.PLAN_WORDS, np.int64)
    preds = {"full": 0, "part": 0}
    recorded = []

    def view(ref, k, nbytes):
        a = bufs[ref.name].reshape(-1).view(np.uint8)
        start = (ref.slot + k) * slot_bytes.get(ref.name, 0)
        assert start + nbytes <= a.size, (ref, k)
        return a[start:start + nbytes]

    def retargeted(retarget):
        """The buffers as a retargeted clone sees them: each named buffer replaced by its place."""
        if not retarget:
            return bufs
        seen = dict(bufs)
        for name, ref in retarget:
            a = bufs[ref.name]
            seen[name] = a[ref.slot] if ref.name in slot_bytes else a
        return seen

    def run(nodes):
        for node in nodes:
            if node[0] == "ops":
                for op in node[1]:
                    if op.only_if_over and not plan[ck.P_OVER]:
                        continue
                    index = op.dst.index if op.dst.index is not None else (op.src.index if op.src else None)
                    k = int(plan[index]) if index is not None else 0
                    if k < 0:
                        continue
                    d = view(op.dst, k if op.dst.index is not None else 0, op.nbytes)
                    s = view(op.src, k if op.src.index is not None else 0, op.nbytes) if op.src else None
                    if op.kind == ck.COPY:
                        d[:] = s
                    elif op.kind == ck.ZERO:
                        d[:] = 0
                    elif op.kind in (ck.ADD_F32, ck.ADD_F64):
                        t = np.float32 if op.kind == ck.ADD_F32 else np.float64
                        d.view(t)[:] += s.view(t)
                    elif op.kind in (ck.NAN_F32, ck.NAN_F64):
                        d.view(np.float32 if op.kind == ck.NAN_F32 else np.float64)[:] = np.nan
                    else:
                        d[:] = 0xFF
            elif node[0] in ("step", "backward"):
                (step if node[0] == "step" else backward)(retargeted(node[1]))
                if trace is not None:
                    trace.append(node[0])
            elif node[0] == "ctl":
                r = ck.control_reference(plan, preds, node[1], count, fixed, every, max_steps)
                if r is not None and node[1] == ck.FWD_BEGIN:
                    recorded.append(r)
            else:
                while preds[node[1]]:
                    run(node[2].nodes)

    run(prog.nodes)
    return recorded[0] if recorded else None


# A step with a fed state x, a parameter a (summed cotangent), an integer input m and an output z that
# is not fed:  y = 0.9 x + a tanh(x) * m,  z = a * x.
def step_np(x, a, m):
    return 0.9 * x + a * np.tanh(x) * m, a * x


def backward_np(x, a, m, ct_y, ct_z):
    t = np.tanh(x)
    return ct_y * (0.9 + a * (1 - t * t) * m) + ct_z * a, ct_y * t * m + ct_z * x


def loop_ref(x, a, m, steps):
    """The loop in jnp (float64): (y after ``steps`` steps, z of the last step)."""
    import jax
    import jax.numpy as jnp

    def body(carry, _):
        x, _z = carry
        y = 0.9 * x + a * jnp.tanh(x) * m
        return (y, a * x), None

    (y, z), _ = jax.lax.scan(body, (x, jnp.zeros_like(x)), None, length=steps)
    return y, z


def machine_parts(n, dtype, rerun=False):
    """The ``Parts`` of the example step: inputs (x, a, m), outputs (y, z), feed {0: 0}."""
    nb = n * np.dtype(dtype).itemsize
    return ck.Parts(fed=((0, 0, nb),), params=((1, 1, np.dtype(dtype), nb),), fed_grads={0: 0},
                    other_outputs=((1, nb),), outputs=((0, np.dtype(dtype), nb), (1, np.dtype(dtype), nb)),
                    rerun_forward=rerun)


def machine_gradient(x0, a, m, ct_y, ct_z, steps, every, fixed=True, max_steps=None, rerun=False,
                     trace=None, retarget=False):
    """Forward then backward program on the numpy machine: (y, z, dx0, da)."""
    n, dtype = x0.size, x0.dtype
    parts = machine_parts(n, dtype, rerun)
    max_steps = steps if fixed else max_steps
    layout = ck.checkpoint_layout(steps if fixed else -1, max_steps, every)
    c = layout.every
    bufs = {"x0": x0.copy(), "x1": a.copy(), "x2": m.copy(), "y0": np.full(n, -7, dtype), "y1": np.full(n, -7, dtype),
            "ct0": np.zeros(n, dtype), "ct1": np.zeros(n, dtype), "g0": np.zeros(n, dtype), "g1": np.zeros(n, dtype),
            "ck0": np.full((layout.slots, n), -3, dtype), "ring0": np.full((c, n), -5, dtype),
            "acc1": np.full(n, 99, dtype), "lam0": np.full(n, 77, dtype)}
    slot_bytes = {"ck0": x0.nbytes, "ring0": x0.nbytes}

    def step(b):
        b["y0"][:], b["y1"][:] = step_np(b["x0"], b["x1"], b["x2"])

    def backward(b):
        assert not rerun or np.array_equal(b["y1"], b["x1"] * b["x0"]), "outputs must match the inputs"
        b["g0"][:], b["g1"][:] = backward_np(b["x0"], b["x1"], b["x2"], b["ct0"], b["ct1"])

    fixed_r = steps if fixed else -1
    r = run_program(ck.forward_program(parts, c, retarget), bufs, slot_bytes, step, backward, steps, fixed_r, c, max_steps,
                    trace)
    y, z = bufs["y0"].copy(), bufs["y1"].copy()
    # The backward starts from fresh inputs, as after a replay's copy-in; the step's x is stale.
    bufs["x0"][:] = -11
    bufs["ct0"][:], bufs["ct1"][:] = ct_y, ct_z
    run_program(ck.backward_program(parts, c, retarget), bufs, slot_bytes, step, backward, r, fixed_r, c, max_steps, trace)
    return y, z, bufs["lam0"].copy(), bufs["acc1"].copy()
