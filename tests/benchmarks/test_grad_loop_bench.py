"""benchmarks/grad_loop.py on the CPU: the jnp workers run (JAX on the CPU), agree with each other, and the
report picks each variant's best setting from made-up records."""

import importlib.util
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "grad_loop.py"


def _module():
    spec = importlib.util.spec_from_file_location("grad_loop", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_jnp_workers_run_and_agree():
    for variant in ("jnp", "jnp_checkpoint"):
        p = subprocess.run([sys.executable, str(SCRIPT), "--worker", variant, "--grids", "12", "--steps", "9",
                            "--reps", "2"], capture_output=True, text=True, timeout=300)
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        assert line, p.stdout + p.stderr
        rec = json.loads(line[0][7:])
        g = rec["grids"]["12"]
        assert g["max_rel_err_vs_jnp"] < 1e-6 and g["median_ms"] > 0 and len(g["samples_ms"]) == 2


def test_report_takes_each_variant_at_its_best_setting():
    mod = _module()

    def rec(v, setting, ms, r):
        return {"variant": v, "setting": setting, "round": r, "device": "Fake GPU",
                "grids": {"8": {"median_ms": ms, "samples_ms": [ms], "xla_temp_bytes": 2**20, "xla_peak_bytes": 2**21,
                                "jaxgraph_held_bytes": 0, "max_rel_err_vs_jnp": 1e-7, "loss": 1.0}}}

    records = [rec("jnp", "defaults", 10.0 + r, r) for r in range(3)] + [rec("jnp", "off", 20.0, r) for r in range(3)]
    records += [rec("jaxgraph", "off", 4.0 + r, r) for r in range(3)] + [{"variant": "jax_call", "setting": "on",
                                                                           "round": 0, "error": "boom"}]
    args = type("A", (), {"grids": "8", "steps": 5, "rounds": 3, "reps": 1})()
    text, summary = mod.report(records, args)
    assert summary["8"]["jnp"]["setting"] == "defaults" and summary["8"]["jnp"]["median_ms"] == 11.0
    assert summary["8"]["jaxgraph"]["min_ms"] == 4.0 and summary["8"]["jaxgraph"]["max_ms"] == 6.0
    assert "jaxgraph vs jnp (each at its best): 2.20x" in text
    assert "| jax_call | failed |" in text and "boom" in text
