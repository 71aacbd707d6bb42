"""benchmarks/scaling_gpus.py on the CPU: arguments, the ratio, markdown, the jit mode over two CPU devices."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks` is a package at the repository root

from benchmarks import run  # noqa: E402
from benchmarks.harness import config, stats  # noqa: E402

HAS_GPU = __import__("jaxgraph").device_count() > 0


# ---------------------------------------------------------------------------
# Scaling over GPUs (benchmarks/scaling_gpus.py)
# ---------------------------------------------------------------------------


def test_scaling_arguments():
    from benchmarks import scaling_gpus

    args = scaling_gpus.parse_args([])
    assert (args.elements, args.kernels, args.repeats, args.target_ms, args.devices) == (1 << 22, 100, 9, 100.0, None)
    quick = scaling_gpus.parse_args(["--quick", "--kernels", "10", "--devices", "2", "--out", "/tmp/s"])
    assert (quick.repeats, quick.target_ms, quick.kernels, quick.devices, quick.out) == (3, 20.0, 10, 2, Path("/tmp/s"))
    for bad in (["--devices", "1"], ["--kernels", "0"], ["--elements", "-4"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            scaling_gpus.parse_args(bad)


def scaling_results(t1, t2, r1=5.0, r2=5.2):
    from benchmarks import scaling_gpus

    records = {"jit_1gpu": {"samples": [t1, t1 * 1.1, t1 * 0.9]}, "jit_2gpus": {"samples": [t2, t2 * 1.2, t2]},
               "replay_1gpu": {"samples": [r1] * 3}, "replay_2gpus": {"samples": [r2] * 3},
               "broken": {"error": "setup: RuntimeError: boom"}}
    for record in records.values():
        if "samples" in record:
            record["stats"] = stats.summarize(record["samples"])
    results = {"n": 2, "modes": records, "scaling": scaling_gpus.scaling(records, 2), "date": "2026-11-23",
               "git": "abc", "device": {"name": "NVIDIA H200"},
               "config": {"elements": 1 << 22, "kernels": 100, "repeats": 3, "target_ms": 100.0}}
    return results


def test_scaling_ratio_is_n_times_t1_over_tn_with_the_target():
    from benchmarks import scaling_gpus

    r = scaling_results(1000.0, 1040.0)["scaling"]
    assert r["jit"]["ratio"] == pytest.approx(2 * 1000 / 1040)
    # Per round: (1000, 1040), (1100, 1248), (900, 1040).
    assert r["jit"]["ratio_min"] == pytest.approx(2 * 900 / 1040) and r["jit"]["ratio_max"] == pytest.approx(2 * 1000 / 1040)
    assert r["jit"]["met"] and r["jit"]["target"] == scaling_gpus.TARGET
    assert r["replay"]["ratio"] == pytest.approx(2 * 5.0 / 5.2) and "target" not in r["replay"]
    assert not scaling_results(1000.0, 1100.0)["scaling"]["jit"]["met"]  # 1.82x
    assert scaling_gpus.scaling({"jit_1gpu": {"samples": [1.0]}}, 2) == {}  # nothing to compare


def test_scaling_markdown():
    from benchmarks import scaling_gpus

    text = scaling_gpus.markdown(scaling_results(1000.0, 1040.0))
    assert text.startswith("# jaxgraph scaling over GPUs: NVIDIA H200")
    assert "| `jit_1gpu` | `jax.jit(jax.shard_map(sg))`, one call per step | 1000 | 900.0-1100 |" in text
    assert "| `replay_2gpus` | `sg.replay(d)` on each device per step, from the host | 5.200 | 5.200-5.200 |" in text
    assert "**jitted shard_map step: throughput on 2 GPUs = 1.92x one GPU** (rounds 1.73-1.92); target >= 1.9x: met" in text
    assert "host replays, no JAX: throughput on 2 GPUs = 1.92x" in text
    assert "- broken: setup: RuntimeError: boom" in text
    assert "NOT met" in scaling_gpus.markdown(scaling_results(1000.0, 1200.0))


SCALING_ON_CPU = r'''
import sys
import numpy as np
import jax
sys.path.insert(0, sys.argv[1])
from benchmarks import scaling_gpus

rng = np.random.default_rng()
kernels = 7
step = lambda x: x + np.float32(kernels)  # what each device's graph computes
for devices in (jax.devices()[:1], jax.devices()[:2]):
    mode = scaling_gpus.jit_step_mode(f"jit_{len(devices)}", step, devices, 512, kernels, rng)
    mode.calls = 3
    assert mode.sample() > 0 and mode.unit == "us_per_call" and f"({len(devices)} shard(s))" in mode.check
    print("OK", mode.key, mode.check)
try:
    scaling_gpus.jit_step_mode("wrong", lambda x: x + 1, jax.devices()[:2], 512, kernels, rng)
except AssertionError as exc:
    print("REFUSED", exc)
'''


def test_scaling_jit_mode_checks_every_shard_on_two_cpu_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCALING_ON_CPU, str(ROOT)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK jit_1 x + 7 on 512 random floats matches numpy (1 shard(s))" in proc.stdout
    assert "OK jit_2 x + 7 on 1024 random floats matches numpy (2 shard(s))" in proc.stdout
    assert "REFUSED wrong result: expected x + 7" in proc.stdout


@pytest.mark.skipif(HAS_GPU, reason="on a GPU machine the benchmark would really run")
def test_scaling_without_gpus_says_so():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scaling_gpus.py"), "--quick"], cwd=ROOT,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "scaling needs JAX with CUDA on several GPUs" in proc.stderr
