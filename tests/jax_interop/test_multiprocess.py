"""jaxgraph under ``jax.distributed``: one process per GPU, as on a cluster, started by the test itself.

Each test starts N processes of tests/support/multiprocess_scenarios.py with
benchmarks/harness/process_launcher.py (torchrun's variables, a coordinator on 127.0.0.1 at a
free port, one timeout that kills them all and reports every process's
output) and compares what the processes saw. On the CPU, JAX's CPU backend
runs the multi-process program with gloo collectives: a real psum across
processes, the jitted step lowered for CUDA on every process, and every
cross-process check. On a GPU machine with one GPU, the processes share it
(each with a fraction of its memory), which proves the logic; it is no
scaling figure (benchmarks/scaling_processes.py needs one GPU per process).

Tests internals (listed in tests/README.md): ``_jax_interop.processes``, ``_jax_interop.sharded.device_ordinals``,
``internals.spec_sharded``; the cross-process agreement and device lookup.
"""

import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest

# Before JAX starts here: this process's JAX must leave the GPU to the processes it launches.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jaxgraph  # noqa: E402
from support.graph_helpers import XLA_MODES  # noqa: E402
from jaxgraph._jax_interop import processes as _processes  # noqa: E402
from jaxgraph._jax_interop.sharded import device_ordinals  # noqa: E402
from support.internals import spec_replayable, spec_sharded  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.process_launcher import launch, report  # noqa: E402

SCENARIOS = str(ROOT / "tests" / "support" / "multiprocess_scenarios.py")
HAS_GPU = jaxgraph.device_count() > 0
WORLD = 2
F32 = jax.ShapeDtypeStruct((64,), np.float32)
# How long the processes of one launch may take in all (the GPU request script shortens it).
TIMEOUT_S = float(os.environ.get("JAXGRAPH_MULTIPROCESS_TIMEOUT", "240"))


def run_processes(platform, *extra, world=WORLD, timeout_s=TIMEOUT_S, env=None):
    """Launch the scenarios on ``world`` processes; return each process's RESULT (or fail with every output)."""
    import json

    seed = int(np.random.default_rng().integers(1 << 30))  # fresh inputs every run
    gpus = jaxgraph.device_count() if platform == "gpu" else 0
    results = launch([SCENARIOS, platform, str(seed), *extra], world, timeout_s=timeout_s, platform=platform,
                     share_gpu=platform == "gpu" and gpus < world, cwd=str(ROOT), extra_env=env)
    text = report(results)
    if any(r.returncode != 0 for r in results):
        print(text, flush=True)  # at once: a run stopped from outside (a time limit) still shows it
    assert all(r.returncode == 0 for r in results), text
    out = []
    for r in results:
        lines = [line for line in r.output.splitlines() if line.startswith("RESULT ")]
        assert len(lines) == 1, text
        out.append(json.loads(lines[0][len("RESULT "):]))
    assert [o["rank"] for o in out] == list(range(world)), text
    return out, text


def scenario(result, name, text=""):
    value = result[name]
    assert "crashed" not in value, f"{name} crashed on process {result['rank']}:\n{value['crashed']}\n{text}"
    return value


# ---------------------------------------------------------------------------
# In this process: the pieces that need no second process (tests of internals)
# ---------------------------------------------------------------------------


def fake_gpu(ordinal, process):
    return types.SimpleNamespace(platform="gpu", local_hardware_id=ordinal, process_index=process)


def fake_mesh(*devices):
    return types.SimpleNamespace(devices=np.array(devices), axis_names=("x",))


def test_a_global_mesh_stands_for_this_process_s_devices():
    mesh = fake_mesh(fake_gpu(0, 0), fake_gpu(0, 1), fake_gpu(1, 0))
    assert device_ordinals(mesh) == (0, 1)  # process 1's device 0 is not ours to capture on
    assert _processes.local_devices(mesh) == ([mesh.devices[0], mesh.devices[2]], True)
    assert _processes.local_devices([0, 1]) == ([0, 1], False)  # ordinals are this process's
    with pytest.raises(ValueError, match="none of the devices given is this process's: .* belongs to process 1, "
                                         "this is process 0"):
        device_ordinals([fake_gpu(0, 1)])  # naming only another process's devices stays an error
    with pytest.raises(ValueError, match="belongs to process 1, this is process 0"):
        device_ordinals(fake_gpu(0, 1))


def test_one_rule_for_device_lists_that_include_other_processes_devices():
    # A list (jax.devices() under jax.distributed) is read as a mesh is: this process's devices of it.
    mine, theirs = fake_gpu(1, 0), fake_gpu(0, 1)
    for given in ([mine, theirs], (theirs, mine), fake_mesh(theirs, mine)):
        assert device_ordinals(given) == (1,)
        assert _processes.local_devices(given) == ([mine], True)
    assert device_ordinals([mine]) == (1,) and _processes.local_devices([mine]) == ([mine], False)
    with pytest.raises(ValueError, match=r"device\(s\) 1 given more than once"):
        device_ordinals([mine, theirs, fake_gpu(1, 0)])
    with pytest.raises(TypeError, match="devices must be a Mesh, a device or a sequence of devices, got float"):
        device_ordinals(1.5)
    with pytest.raises(TypeError, match="devices must be a Mesh, a device or a sequence of devices, got float"):
        _processes.local_devices(1.5)


def test_checking_a_global_mesh_needs_jax_distributed():
    sg = spec_sharded(spec_replayable((F32,), (F32,), 3), [0])
    assert sg.check_devices(fake_mesh(fake_gpu(0, 0))) == (0,)  # one process: no exchange
    with pytest.raises(RuntimeError, match="span several processes but jax.distributed is not initialized"):
        sg.check_devices(fake_mesh(fake_gpu(0, 0), fake_gpu(0, 1)))
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        _processes.agree("t", {}, subject="mesh", timeout_s=0)


def test_disagreements_name_each_process():
    ok = {"error": None, "graph": 3, "shapes": "(f32[4]) -> (f32[4])"}
    assert _processes.disagreements([ok, dict(ok)], {"graph": "graph ids"}) == []
    lines = _processes.disagreements([ok, {**ok, "graph": 4}, {**ok, "error": "RuntimeError: closed"}],
                                     {"shapes": "shard shapes", "graph": "graph ids"})
    assert lines == ["process 2: RuntimeError: closed", "graph ids differ between processes (process 0: 3; "
                     "process 1: 4)"]  # a process with its own error is not compared


# ---------------------------------------------------------------------------
# CPU: JAX's CPU backend with gloo, N processes (CI)
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_results():
    out, text = run_processes("cpu", timeout_s=min(TIMEOUT_S, 120))
    return out, text


def test_cpu_processes_form_one_mesh_and_psum_across_processes(cpu_results):
    out, text = cpu_results
    for r in out:
        s = scenario(r, "gloo_psum", text)
        assert len(s["devices"]) == WORLD and len(s["local"]) == 1, s
        assert s["shard_ok"], s
        assert s["total"] == pytest.approx(s["want"], rel=1e-5, abs=1e-3), s  # every process's shard summed


def test_every_process_lowers_the_same_program_for_cuda(cpu_results):
    out, text = cpu_results
    lowered = [scenario(r, "lowering", text) for r in out]
    assert len({s["digest"] for s in lowered}) == 1, lowered  # byte-identical HLO on every process
    for s in lowered:
        (line,) = s["replays"]
        assert "graph = 7 : i64" in line and "(tensor<4096xf32>) -> tensor<4096xf32>" in line  # one shard
        assert s["all_reduce"] and s["partitions"]


def test_ids_that_follow_creation_order_change_the_program(cpu_results):
    # Why the ids are checked: a process that made one more replayable first lowers another program.
    out, text = cpu_results
    digests = [scenario(r, "lowering_with_ids_of_creation_order", text)["digest"] for r in out]
    assert digests[0] != digests[1] and len(set(digests[1:])) == 1


def test_check_devices_agrees_across_processes(cpu_results):
    out, text = cpu_results
    for r in out:
        s = scenario(r, "check_agrees", text)
        assert s == {"ordinals": [0], "shard_map_check": [0]}  # this process's ordinals only


@pytest.mark.parametrize("name, match", [
    ("missing_graph", "process 1: ValueError: no graph for device 0: this ShardedGraph was captured on device(s) 1"),
    ("closed_graph", "process 1: RuntimeError: this ShardedGraph was closed"),
    ("shapes_differ", "shard shapes differ between processes (process 0: (float32[4096]) -> (float32[4096]); "
                      "process 1: (float32[8192]) -> (float32[8192])"),
    ("ids_differ", "graph ids differ between processes (process 0: 8; process 1: 7"),
])
def test_what_breaks_on_one_process_is_the_same_error_on_every_process(cpu_results, name, match):
    out, text = cpu_results
    errors = [scenario(r, name, text)["error"] for r in out]
    assert len(set(errors)) == 1, errors  # nobody goes on to wait in a collective
    assert errors[0].startswith("ValueError: the processes disagree about this ShardedGraph, so none may run")
    assert match in errors[0], errors[0]
    assert "in the same order" in errors[0]


def test_processes_that_traced_differently_still_agree_and_lower_one_program(cpu_results):
    # Process 0 first checked another mesh (timed out: process 1 never joined) and traced other
    # replays; the check both then make meets on the same keys, and the HLO is byte-identical.
    out, text = cpu_results
    seen = [scenario(r, "traced_differently", text) for r in out]
    assert seen[0]["extra"].startswith("RuntimeError: check_devices: process 1 did not reach this check within 2 s")
    assert all(s["extra"] is None for s in seen[1:])
    assert all(s["ordinals"] == [0] for s in seen), seen
    assert len({s["digest"] for s in seen}) == 1, seen
    assert seen[0]["calls"] == ["call = 1 : i64, graph = 7"], seen


def test_a_process_that_arrives_after_the_others_gave_up_raises_their_error_and_the_retry_agrees(cpu_results):
    # The real key-value store of jax.distributed: the round's decision is written once and read by both.
    out, text = cpu_results
    seen = [scenario(r, "late_process", text) for r in out]
    assert len({s["first"] for s in seen}) == 1, seen  # the same error on both: nobody runs the step
    assert seen[0]["first"].startswith("RuntimeError: check_devices: process 1 did not reach this check within 1 s "
                                       "(round 0 on this subject, given up by process 0 of 2"), seen
    assert all(s["retry"] == [0] for s in seen), seen


def test_a_process_that_never_arrives_is_named_after_the_timeout(cpu_results):
    out, text = cpu_results
    for r in out:
        error = scenario(r, "silent_process", text)["error"]
        if r["rank"] == 1:
            assert error is None  # it skipped the check
        else:
            assert error.startswith("RuntimeError: check_devices: process 1 did not reach this check within 2 s")


def test_launch_kills_every_process_at_the_timeout_and_reports_each():
    code = "import sys, time, os; print('rank', os.environ['RANK'], flush=True); " \
           "time.sleep(0 if os.environ['RANK'] == '0' else 60)"
    results = launch(["-c", code], 2, timeout_s=3, platform="cpu")
    assert [r.timed_out for r in results] == [False, True]
    assert results[0].returncode == 0 and results[1].returncode is None
    assert "rank 1" in results[1].output
    text = report(results)
    assert "process 0: exit 0" in text and "process 1: killed at the timeout" in text


# ---------------------------------------------------------------------------
# GPU: one process per GPU (or sharing one GPU), real graphs
# ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["off", "on"])
def test_processes_replay_their_graphs_in_one_jitted_shard_map(mode):
    extra = ("--errors",) if mode == "off" else ()
    out, text = run_processes("gpu", *extra, env={"XLA_FLAGS": XLA_MODES[mode]})
    print(text)
    for r in out:
        info = r["info"]
        assert len(info["local"]) == 1 and len(info["global"]) == WORLD, info
        cap = scenario(r, "capture", text)
        assert cap["check"] == cap["devices"] == [info["local"][0][1]]  # the ordinal XLA gives the FFI call
        for rows in (*cap["bindings"].values(), *cap["graphed_bindings"].values()):
            assert rows and all(" bound " in row for row in rows), rows  # zero-copy on every process
        replay = scenario(r, "replay_only", text)
        assert replay["finite"] and replay["max_err"] <= 1e-5, replay
        full = scenario(r, "full_step", text)
        assert full["replays"] == 2 and full["max_err"] <= 1e-4, full
        for got, want in full["totals"]:  # the psum over every process's shard
            assert got == pytest.approx(want, rel=1e-4, abs=1e-2)
    assert len({r["capture"]["graph"] for r in out}) == 1
    assert len({r["full_step"]["digest"] for r in out}) == 1  # the same program on every process
    if mode == "off":
        check_gpu_errors(out, text)


def check_gpu_errors(out, text):
    ids = [scenario(r, "ids_differ", text) for r in out]
    assert ids[0]["graph"] == ids[1]["graph"] + 1  # process 0 made one replayable more first
    expected = {"ids_differ": f"graph ids differ between processes (process 0: {ids[0]['graph']}; "
                              f"process 1: {ids[1]['graph']}",
                "shapes_differ": "shard shapes differ between processes (process 0: (float32[4096]) -> "
                                 "(float32[4096]); process 1: (float32[4352])",
                "closed_on_one_process": "process 1: RuntimeError: this ShardedGraph was closed"}
    for name, match in expected.items():
        errors = [scenario(r, name, text)["error"] for r in out]
        assert len(set(errors)) == 1 and errors[0] and match in errors[0], (name, errors)
