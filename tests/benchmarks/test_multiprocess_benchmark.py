"""benchmarks/scaling_processes.py on the CPU: arguments, the ratio, the report, and a whole run with gloo.

The GPU figure needs one GPU per process (``python benchmarks/scaling_processes.py``
on a machine with two); here the pure functions get synthetic records and the
whole launcher path runs with JAX on the CPU.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import scaling_processes as sp  # noqa: E402


def record(rank, replay, psum):
    return {"rank": rank, "modes": {"replay": {"samples": replay, "check": "ok"},
                                    "psum": {"samples": psum, "check": "x + 100 matches"}}}


def groups(slow=1.0):
    one = [record(0, [1000.0, 1010.0, 990.0], [1040.0, 1050.0, 1030.0])]
    two = [record(0, [1000.0, 1020.0, 1000.0], [1060.0, 1070.0, 1050.0]),
           record(1, [1010.0 * slow, 1000.0 * slow, 995.0 * slow], [1055.0, 1080.0, 1045.0])]
    return {1: one, 2: two}


def test_step_time_of_a_round_is_the_slowest_process():
    assert sp.step_times(groups()[2], "replay") == [1010.0, 1020.0, 1000.0]


def test_throughput_ratio_and_target():
    r = sp.scaling(groups(), 2, figure=True)
    assert r["replay"]["ratio"] == pytest.approx(2 * 1000.0 / 1010.0)
    assert r["replay"]["met"] and r["replay"]["target"] == sp.TARGET
    assert r["replay"]["ratio_min"] <= r["replay"]["ratio"] <= r["replay"]["ratio_max"]
    slow = sp.scaling(groups(slow=1.2), 2, figure=True)
    assert slow["replay"]["ratio"] == pytest.approx(2 * 1000.0 / 1200.0) and not slow["replay"]["met"]


def test_no_ratio_without_one_gpu_per_process():
    r = sp.scaling(groups(), 2, figure=False)
    assert "ratio" not in r["replay"] and "target" not in r["psum"]
    assert r["psum"]["step_us_2"]["median"] == 1070.0 - 10.0


def results(**kw):
    base = {"n": 2, "config": {"elements": 4194304, "kernels": 100, "steps": 100, "repeats": 3},
            "shared_gpu": False, "cpu": False, "device": "NVIDIA H200", "date": "2026-11-23", "git": "abc"}
    base.update(kw)
    base["scaling"] = sp.scaling(groups(), 2, figure=not (base["shared_gpu"] or base["cpu"]))
    return base


def test_report_gives_the_figure_only_with_one_gpu_per_process():
    text = sp.markdown(results())
    assert "| throughput 2 / 1 |" in text and "**1.98x**" in text
    assert "`replay`: target >= 1.9x on 2 GPUs: met" in text
    shared = sp.markdown(results(shared_gpu=True))
    assert "2 processes shared ONE GPU" in shared and "it is not a scaling figure" in shared
    assert "throughput" not in shared and "target" not in shared
    cpu = sp.markdown(results(cpu=True, device=None))
    assert "JAX on the CPU (gloo)" in cpu and "it is no GPU figure" in cpu and "x**" not in cpu


@pytest.mark.parametrize("argv, message", [
    (["--processes", "1"], "--processes must be >= 2"),
    (["--kernels", "0"], "--kernels must be >= 1"),
    (["--cpu", "--share-gpu"], "exclude each other"),
])
def test_argument_errors(argv, message, capsys):
    with pytest.raises(SystemExit):
        sp.parse_args(argv)
    assert message in capsys.readouterr().err


def test_defaults_follow_the_platform():
    cpu, gpu, quick = sp.parse_args(["--cpu"]), sp.parse_args([]), sp.parse_args(["--quick"])
    assert (cpu.elements, cpu.kernels) == (1 << 16, 10) and (gpu.elements, gpu.kernels) == (1 << 22, 100)
    assert (quick.steps, quick.repeats, gpu.steps, gpu.repeats) == (20, 3, 100, 9)


def test_a_whole_run_with_jax_on_the_cpu(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scaling_processes.py"), "--cpu", "--quick",
                           "--elements", "4096", "--steps", "5", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    md = (tmp_path / "cpu-scaling-processes-quick.md").read_text()
    assert "| `replay` |" in md and "| `psum` |" in md and "it is no GPU figure" in md
    assert "x + 10 on 4096 random floats matches numpy on each of 2 processes; the psum is exact" in md
    assert (tmp_path / "cpu-scaling-processes-quick.json").exists()
