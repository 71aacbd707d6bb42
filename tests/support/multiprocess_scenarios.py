"""One process of tests/jax_interop/test_multiprocess.py: run by benchmarks/harness/process_launcher.py, N at once.

    python tests/support/multiprocess_scenarios.py {cpu,gpu} SEED [--errors]

Every process joins ``jax.distributed`` (torchrun's variables, set by the
launcher), runs the scenarios in the same order, and prints one line
``RESULT <json>``: per scenario what it saw, or ``{"crashed": traceback}``.
The test compares the processes' results. SEED is fresh per test run: every
process draws the same global input from it, so each can check its own shard
and the cross-process sums against numpy.

``cpu`` (JAX on the CPU, collectives over gloo): a real psum across processes,
the jitted step lowered for CUDA on every process, and every cross-process
check of ``ShardedGraph.check_devices`` on graph-less specs and stand-in GPU
devices. ``gpu``: graphs captured on each process's GPU, replayed inside one
jitted ``shard_map`` over the global mesh; ``--errors`` adds the failures
that must be caught before anything runs, with real captures.

Tests internals (listed in tests/README.md): ``internals.spec_replayable``,
``internals.spec_sharded``; the CPU scenario lowers and checks sharded specs in every process,
with no GPU.
"""

import hashlib
import json
import os
import re
import sys
import traceback
import types
from pathlib import Path

import numpy as np

# the repository root (benchmarks.harness.process_launcher) and tests/ (the shared kernels)
sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1])]

from benchmarks.harness.process_launcher import initialize  # noqa: E402

from support.kernel_sources import INC, SCALE  # noqa: E402

N = 4096  # floats per process (one shard)
SOURCE = SCALE + INC


def reference(x):
    """What the sharded graph computes, in float32 as the kernels do: 0.5 x, then plus 1 nine times."""
    y = np.float32(0.5) * x
    for _ in range(9):
        y = y + np.float32(1)
    return y


def error(fn):
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def replays(text):
    return [line.strip() for line in text.splitlines() if "stablehlo.custom_call @jaxgraph_replay(" in line]


def digest(text):
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def global_input(seed, world, k=0):
    """The whole input, the same on every process; each process holds its slice."""
    return np.random.default_rng(seed + 1000 * k).standard_normal(N * world).astype(np.float32)


# ---------------------------------------------------------------------------
# JAX on the CPU: gloo collectives, lowering for CUDA, the cross-process checks
# ---------------------------------------------------------------------------


def cpu_scenarios(rank, world, seed):
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from support.internals import spec_replayable, spec_sharded

    f32 = jax.ShapeDtypeStruct
    mesh = Mesh(np.array(jax.devices()), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    # Stand-ins for one GPU per process (what cuda_ordinal reads), as a mesh.
    gpus = [types.SimpleNamespace(platform="gpu", local_hardware_id=0, process_index=p, id=p) for p in range(world)]
    gpu_mesh = types.SimpleNamespace(devices=np.array(gpus), axis_names=("x",))

    def spec(graph_id, n=N, devices=(0,)):
        return spec_sharded(spec_replayable((f32((n,), jnp.float32),), (f32((n,), jnp.float32),), graph_id),
                            devices)

    def lowered(sg):
        def body(x):
            y = sg(x * 2.0 - 1.0)
            return y - 99.0, jax.lax.psum(jnp.sum(y), "x")

        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P())))
        return f.trace(f32((N * world,), jnp.float32, sharding=sharding)).lower(lowering_platforms=("cuda",)).as_text()

    out = {}

    def gloo_psum():
        x = global_input(seed, world)
        local = jax.make_array_from_process_local_data(sharding, x[rank * N:(rank + 1) * N])
        f = jax.jit(jax.shard_map(lambda v: (v * 2.0, jax.lax.psum(jnp.sum(v), "x")), mesh=mesh,
                                  in_specs=P("x"), out_specs=(P("x"), P())))
        y, total = f(local)
        (shard,) = y.addressable_shards
        return {"devices": [str(d) for d in jax.devices()], "local": [str(d) for d in jax.local_devices()],
                "total": float(total), "want": float(x.sum(dtype=np.float64)),
                "shard_ok": bool(np.array_equal(np.asarray(shard.data), x[rank * N:(rank + 1) * N] * 2))}

    def lowering():
        text = lowered(spec(7))
        return {"replays": replays(text), "digest": digest(text), "all_reduce": "all_reduce" in text,
                "partitions": "mhlo.num_partitions = " + str(world) in text}

    def lowering_with_ids_of_creation_order():
        # As if process 0 had made one replayable more before this one: its HLO differs.
        return {"digest": digest(lowered(spec(8 if rank == 0 else 7)))}

    def check_agrees():
        return {"ordinals": list(spec(7).check_devices(gpu_mesh, timeout_s=60)),
                "shard_map_check": list(spec(7).check_devices(list(gpu_mesh.devices), timeout_s=60))}

    def missing_graph():  # process 1 captured for another device than its mesh device
        return {"error": error(lambda: spec(7, devices=(1,) if rank == 1 else (0,)).check_devices(gpu_mesh))}

    def closed_graph():
        sg = spec(7)
        if rank == 1:
            sg.close()
        return {"error": error(lambda: sg.check_devices(gpu_mesh))}

    def shapes_differ():
        return {"error": error(lambda: spec(7, n=2 * N if rank == 1 else N).check_devices(gpu_mesh))}

    def ids_differ():
        return {"error": error(lambda: spec(8 if rank == 0 else 7).check_devices(gpu_mesh))}

    def traced_differently():
        # Process 0 does more before the common step: a check on another mesh that process 1 never
        # joins (it times out), and a trace of other replays. Neither may shift what both then agree
        # on (the check's keys) or the program both lower (the replays' call attributes).
        other = types.SimpleNamespace(devices=np.array([types.SimpleNamespace(
            platform="gpu", local_hardware_id=0, process_index=p, id=100 + p) for p in range(world)]),
            axis_names=("x",))
        extra = None
        if rank == 0:
            extra = error(lambda: spec(7).check_devices(other, timeout_s=2))
            lowered(spec(9))
            jax.jit(lambda v: spec(7)(spec(7)(v))).trace(f32((N,), jnp.float32)).lower(lowering_platforms=("cuda",))
        text = lowered(spec(7))
        return {"extra": extra, "ordinals": list(spec(7).check_devices(gpu_mesh, timeout_s=60)),
                "digest": digest(text), "calls": [re.search(r"call = \d+ : i64, graph = \d+", line).group(0)
                                                  for line in replays(text)]}

    def late_process():
        # Process 1 reaches the check after process 0 gave up: both raise process 0's error (process 1
        # reads the round's decision), then the retry is a fresh round on both and agrees.
        import time

        late = types.SimpleNamespace(devices=np.array([types.SimpleNamespace(
            platform="gpu", local_hardware_id=0, process_index=p, id=200 + p) for p in range(world)]),
            axis_names=("x",))  # a mesh of its own: round 0 on its subject
        if rank == 1:
            time.sleep(4)
        first = error(lambda: spec(7).check_devices(late, timeout_s=1))
        return {"first": first, "retry": list(spec(7).check_devices(late, timeout_s=60))}

    def silent_process():  # last: process 1 never arrives at the check
        if rank == 1:
            return {"error": None}
        return {"error": error(lambda: spec(7).check_devices(gpu_mesh, timeout_s=2))}

    for fn in (gloo_psum, lowering, lowering_with_ids_of_creation_order, check_agrees, missing_graph,
               closed_graph, shapes_differ, ids_differ, traced_differently, late_process, silent_process):
        out[fn.__name__] = run(fn)
    return out


# ---------------------------------------------------------------------------
# JAX on the GPU: real graphs, one jitted shard_map over every process's GPU
# ---------------------------------------------------------------------------


def gpu_scenarios(rank, world, seed, errors):
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import jaxgraph

    f32 = jax.ShapeDtypeStruct((N,), jnp.float32)
    blocks = (N + 255) // 256
    scale = jaxgraph.Kernel(SOURCE, "scale")
    inc = jaxgraph.Kernel(SOURCE, "inc")

    def step(x):  # y = 0.5 x + 9, ten launches
        y = jaxgraph.empty(x.shape)
        scale[blocks, 256](y, x, 0.5, N)
        for _ in range(9):
            inc[blocks, 256](y, N)
        return y

    def triple(x):  # for make_graphed_callables: z = 3 x + 1
        z = jaxgraph.empty(x.shape)
        scale[blocks, 256](z, x, 3.0, N)
        inc[blocks, 256](z, N)
        return z

    local = jax.local_devices()
    out = {"info": {"local": [(d.id, d.local_hardware_id, d.process_index) for d in local],
                    "global": [str(d) for d in jax.devices()], "jaxgraph_devices": jaxgraph.device_count(),
                    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "xla_flags": os.environ.get("XLA_FLAGS")}}
    mesh = Mesh(np.array(jax.devices()), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    mine = slice(rank * N, (rank + 1) * N)
    state = {}

    def capture():
        sg = state["sg"] = jaxgraph.capture_per_device(step, [f32])
        graphed = state["graphed"] = jaxgraph.make_graphed_callables(triple, (jaxgraph.zeros((N,)),))
        return {"devices": list(sg.devices), "graph": sg.graph_id, "graphed_graph": graphed.replayable.graph_id,
                "bindings": {str(d): [str(b) for b in rows] for d, rows in sg.bindings.items()},
                "graphed_bindings": {str(d): [str(b) for b in rows]
                                     for d, rows in graphed.replayable.bindings.items()},
                "check": list(sg.check_devices(mesh))}

    def placed(x):
        return jax.make_array_from_process_local_data(sharding, x[mine])

    def poison():
        for arrays in (state["sg"].outputs(state["sg"].devices[0]),):
            for a in arrays:
                a.fill_(np.float32(np.nan))  # a replay that writes nothing cannot pass

    def replay_only():  # no collective: each process replays its graph on its shard
        f = state["sg"].shard_map(mesh, P("x"), P("x"))
        x = global_input(seed, world, 1)
        poison()
        (shard,) = f(placed(x)).addressable_shards
        got = np.asarray(shard.data)
        return {"max_err": float(np.max(np.abs(got - reference(x[mine])))), "finite": bool(np.isfinite(got).all())}

    def full_step():  # XLA ops, the sharded replay, a graphed callable, a psum across processes
        sg, graphed = state["sg"], state["graphed"]

        def body(x):
            y = sg(x * 2.0 - 1.0)
            z = graphed(y)
            return z - 99.0, jax.lax.psum(jnp.sum(z), "x")

        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P())))
        text = f.trace(jax.ShapeDtypeStruct((N * world,), jnp.float32, sharding=sharding)).lower().as_text()
        errs, totals = [], []
        for k in range(3):  # fresh inputs each call
            x = global_input(seed, world, 2 + k)
            want = np.float32(3) * reference(x * np.float32(2) - np.float32(1)) + np.float32(1)
            poison()
            z, total = f(placed(x))
            (shard,) = z.addressable_shards
            errs.append(float(np.max(np.abs(np.asarray(shard.data) - (want[mine] - 99)))))
            totals.append([float(total), float(want.sum(dtype=np.float64))])
        return {"max_err": max(errs), "totals": totals, "digest": digest(text), "replays": len(replays(text))}

    out["capture"] = run(capture)
    if "crashed" not in out["capture"]:
        out["replay_only"] = run(replay_only)
    if errors:  # before the psum: they need no collective, and a hang there would hide them
        out.update(gpu_errors(rank, step, f32, mesh))
    if "crashed" not in out["capture"]:
        out["full_step"] = run(full_step)
    return out


def gpu_errors(rank, step, f32, mesh):
    """Failures caught on every process before anything is compiled, with real captures."""
    import jax
    import jax.numpy as jnp

    import jaxgraph

    out, keep = {}, []

    def ids_differ():
        if rank == 0:  # process 0 happens to make one replayable more first
            g, x, y = jaxgraph.CUDAGraph(), jaxgraph.zeros((16,)), jaxgraph.zeros((16,))
            with jaxgraph.graph(g):
                jaxgraph.Kernel(SOURCE, "scale")[1, 16](y, x, 2.0, 16)
            keep.append(jaxgraph.replayable(g, [x], [y]))
        sg = jaxgraph.capture_per_device(step, [f32])
        return {"graph": sg.graph_id, "error": error(lambda: sg.check_devices(mesh))}

    def shapes_differ():
        n = N + 256 if rank == 1 else N
        sg = jaxgraph.capture_per_device(step, [jax.ShapeDtypeStruct((n,), jnp.float32)])
        return {"error": error(lambda: sg.shard_map(mesh, jax.sharding.PartitionSpec("x"),
                                                    jax.sharding.PartitionSpec("x")))}

    def closed_on_one_process():
        sg = jaxgraph.capture_per_device(step, [f32])
        if rank == 1:
            sg.close()
        return {"error": error(lambda: sg.check_devices(mesh))}

    for fn in (ids_differ, shapes_differ, closed_on_one_process):
        out[fn.__name__] = run(fn)
    return out


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def run(fn):
    """``fn()``'s result, or its traceback; printed at once, so a later hang still shows it."""
    try:
        result = fn()
    except Exception:
        result = {"crashed": traceback.format_exc()}
    print(f"SCENARIO {fn.__name__} {json.dumps(result)[:3000]}", flush=True)
    return result


def main(argv):
    platform, seed = argv[0], int(argv[1])
    rank, world = initialize()
    if platform == "cpu":
        results = cpu_scenarios(rank, world, seed)
    else:
        results = gpu_scenarios(rank, world, seed, "--errors" in argv)
    print("RESULT " + json.dumps({"rank": rank, "world": world, **results}), flush=True)
    # Process 0 hosts the coordinator: nobody leaves before everyone has finished.
    from jax._src import distributed

    distributed.global_state.client.wait_at_barrier("jaxgraph-scenarios-end", 120_000)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
