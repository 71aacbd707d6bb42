"""benchmarks/gray_scott_bench.py on the CPU: its arguments, what it reads from XLA's HLO, its report.

The timings need the GPU (``python benchmarks/gray_scott_bench.py``). Here:
the HLO facts are read from loops XLA really compiles (a replayable's
``jaxgraph_replay`` call with and without aliased operands, compiled for
JAX's CPU backend, where the target is registered too), and the report is
rendered from synthetic worker records.

Tests internals: the replayables are built from a spec with aliases
(``internals.ReplaySpec``, ``Replayable._create``), since the public
way needs a captured graph, hence a GPU.
"""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from support.internals import Replayable, ReplaySpec

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import gray_scott_bench as bench  # noqa: E402


def _replay_loop(aliases):
    """A fori_loop whose body is one replay of (u, v) -> (u, v, total), compiled for the CPU."""
    grid, total = jax.ShapeDtypeStruct((32, 32), jnp.float32), jax.ShapeDtypeStruct((1,), jnp.float32)
    step = Replayable._create(ReplaySpec((grid, grid), (grid, grid, total), 1, aliases=aliases), via="ffi")

    def body(i, carry):
        u, v, masses = carry
        u, v, m = step(u, v)
        return u, v, masses.at[i].set(m[0])

    f = jax.jit(lambda u, v: jax.lax.fori_loop(0, 4, body, (u, v, jnp.zeros(4, jnp.float32))))
    u = jnp.ones((32, 32), jnp.float32)
    return f.lower(u, u).compile().as_text()


def test_a_replay_with_aliased_state_needs_no_copies_in_the_loop():
    # Why the example's step updates u and v in place: with fresh outputs XLA
    # copies each into the loop's carry every trip; aliased, it copies none.
    fresh = bench.compiled_facts(_replay_loop(()))
    in_place = bench.compiled_facts(_replay_loop(((0, 0), (1, 1))))
    assert fresh["loop_array_copies"] == 2, fresh
    assert in_place["loop_array_copies"] == 0, in_place
    assert fresh["custom_calls"] == in_place["custom_calls"] == 1


def test_compiled_facts_count_only_array_copies_outside_the_entry():
    hlo = "\n".join([
        "HloModule m",
        "%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {",
        "  %c = s32[] copy(%x)",            # the loop counter: a scalar, not counted
        "  %d = f32[4]{0} copy(%y)",        # counted
        "}",
        "%command_buffer (p0: f32[4]) -> f32[4] {",
        "  %e = f32[4,2]{1,0} copy-start(%z)",  # counted
        "}",
        "ENTRY %main (a: f32[4]) -> f32[4] {",
        "  %f = f32[4]{0} copy(%a)",        # the arguments' copy before the loop: not counted
        "  %g = f32[4]{0} custom-call(%f), custom_call_target=\"jaxgraph_replay\"",
        "}",
    ])
    assert bench.compiled_facts(hlo) == {"loop_array_copies": 2, "custom_calls": 1}


def test_arguments():
    args = bench.parse_args([])
    assert args.settings == bench.SETTINGS and args.repeats == 15 and args.target_ms == 30.0
    quick = bench.parse_args(["--quick", "--settings", "on,off"])
    assert quick.settings == ("on", "off") and quick.repeats == 5
    for bad in (["--settings", "fast"], ["--grid", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def _process(setting, xla_us, factors):
    modes = {"xla_fori": {"samples": [xla_us, xla_us * 1.1, xla_us * 0.9], "per_step": {}, "compiled": {}}}
    for key, f in factors.items():
        modes[key] = {"samples": [xla_us * f, xla_us * 1.1 * f, xla_us * 0.9 * f],
                      "per_step": {"launch": 1.0, "copy": 0.0}, "handler_us_per_handler_call": 3.25,
                      "compiled": {"loop_array_copies": 0}, "bindings": ["input 0 bound"]}
    return {"setting": setting, "xla_flags": "--x", "modes": modes, "device": {"name": "NVIDIA H100 80GB HBM3"},
            "summary": "graphed step: ...", "loop": "<loop>"}


def test_speed_is_xla_time_over_the_modes_and_the_report_shows_it():
    processes = bench.summarize({"off": _process("off", 50.0, {"graphed_fori": 0.5, "graphed_fresh": 1.25}),
                                 "on": {"setting": "on", "failed": "exit code 1"}})
    speed = processes["off"]["speed_vs_xla"]
    assert speed["graphed_fori"]["median"] == pytest.approx(2.0)
    assert speed["graphed_fresh"]["median"] == pytest.approx(0.8)
    assert speed["graphed_fori"]["min"] == pytest.approx(2.0) == speed["graphed_fori"]["max"]  # paired rounds
    results = {"date": "2026-11-23", "git": "abc", "device": "NVIDIA H100 80GB HBM3", "processes": processes,
               "config": {"repeats": 3, "grid": 256, "steps": 100, "substeps": 10}}
    text = bench.markdown(results)
    assert "100 steps of 22 kernels" in text
    row = next(line for line in text.splitlines() if line.startswith("| off |"))
    assert row == "| off | 50.00 | 25.00 | **2.000x** (2.00-2.00) |"
    fresh = next(line for line in text.splitlines() if line.startswith("| `graphed_fresh` | 62"))
    assert fresh.startswith("| `graphed_fresh` | 62.50 | 0.800x | launch 1 | 3.250 | 0 | input 0 bound |")
    assert "| on | failed: exit code 1 | | |" in text
