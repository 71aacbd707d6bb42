"""The tutorial (docs/tutorial.md) and its one-file version, examples/tutorial_heat.py, agree and compute the model.

CPU: the jnp model against numpy on fresh random inputs, the stopped jnp loop against a numpy loop, the
page's code against the example's (the same functions, kernels and constants, so the factory the page's
``jaxgraph.compare`` commands name times the page's code), the page's chain split (the ``jnp`` stage and the
kernel's compilation run on the CPU, the rest on a GPU), the factory's stages, and ``jaxgraph.compare`` on
its ``jnp`` stage. GPU: every stage through ``jaxgraph.compare`` with ``--compare-functions``.
"""

import ast
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
import jaxgraph.compare
from conftest import example
from test_docs import CPU_MARK, GPU_FROM, cpu_part
from test_readme import chains

REPO = pathlib.Path(__file__).resolve().parents[2]
PAGE = (REPO / "docs" / "tutorial.md").read_text()
FACTORY = str(REPO / "examples" / "tutorial_heat.py") + ":make_case"
tutorial = example("tutorial_heat")


def numpy_steps(u, kappa, steps):
    u = u.astype(np.float64)
    for _ in range(steps):
        u = u + kappa * (np.roll(u, 1, 0) + np.roll(u, -1, 0) + np.roll(u, 1, 1) + np.roll(u, -1, 1) - 4 * u)
    return u


def test_the_jnp_model_matches_numpy(rng):
    n, steps = int(rng.integers(8, 40)), int(rng.integers(1, 60))
    u0 = rng.standard_normal((n, n)).astype(np.float32)
    kappa = rng.uniform(0.01, 0.24, (n, n)).astype(np.float32)
    got = np.asarray(tutorial.heat_jnp(jnp.asarray(u0), jnp.asarray(kappa), steps))
    np.testing.assert_allclose(got, numpy_steps(u0, kappa, steps), rtol=1e-4, atol=1e-5)


def test_the_stopped_jnp_loop_stops_where_numpy_does():
    u0, kappa, at = tutorial.problem(128)
    u, ran = tutorial.heat_jnp_until(jnp.asarray(u0), jnp.asarray(kappa), at)
    ran = int(np.asarray(ran)[0])
    want, u_np = 0, u0.astype(np.float64)
    while want < tutorial.STEPS and u_np.reshape(-1)[at] < tutorial.LEVEL:
        u_np, want = numpy_steps(u_np, kappa, 1), want + 1
    assert 0 < want < tutorial.STEPS and abs(ran - want) <= 1, (ran, want)   # the sensor is reached
    np.testing.assert_allclose(np.asarray(u), numpy_steps(u0, kappa, ran), rtol=1e-4, atol=1e-5)
    capped, ran_capped = tutorial.heat_jnp_until(jnp.asarray(u0), jnp.asarray(kappa), at, max_steps=10)
    assert int(np.asarray(ran_capped)[0]) == 10                                # at most max_steps


def page_code():
    (line, code), = chains(PAGE)             # the page is one session: one chain
    return code


def test_the_page_runs_its_first_stages_on_the_cpu_and_the_rest_on_a_gpu():
    code = page_code()
    assert code.lstrip().startswith(CPU_MARK)
    cpu, gpu = cpu_part(code), code[len(cpu_part(code)):]
    assert gpu.startswith(GPU_FROM)
    assert "heat_jnp(" in cpu and "jaxgraph.Kernel(HEAT" in cpu and "jax_call" not in cpu
    for name in ("heat.jax_call", "make_graphed_callables", "graphed_loop(", "until=done", "jax.grad",
                 "backward=advance_bwd"):
        assert name in gpu, name


def definitions(source: str) -> dict:
    """Top-level functions (their code) and constant assignments (their value's code) of a module's source."""
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = ast.unparse(node)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = ast.unparse(node.value)
    return out


def test_the_page_and_the_example_define_the_same_model_and_kernels():
    page, ex = definitions(page_code()), definitions((REPO / "examples" / "tutorial_heat.py").read_text())
    shared = ["N", "STEPS", "SENSOR_OFFSET", "LEVEL", "TILE", "HEAT", "REACHED", "HEAT_BWD",
              "laplacian", "heat_step", "heat_jnp", "problem", "heat_jnp_until", "loss_jnp"]
    for name in shared:
        assert name in page and name in ex, name
        assert page[name] == ex[name], name


def test_the_kernels_compile_without_a_gpu():
    ks = tutorial.kernels(arch="sm_90")
    assert [p.name for p in ks["heat"].params] == ["out", "u", "kappa", "n"]
    assert [p.name for p in ks["heat_bwd"].params] == ["gu", "gk", "u", "kappa", "ct", "n"]
    assert [p.name for p in ks["reached"].params] == ["done", "u", "at", "level"]


def test_the_pages_commands_name_the_factorys_stages():
    stages = re.findall(r"tutorial_heat\.py:make_case --arg stage=(\w+)", PAGE)
    assert sorted(set(stages)) == sorted(tutorial.STAGES), stages
    with pytest.raises(ValueError, match="stage must be one of jnp, jax_call.*got 'fast'"):
        tutorial.make_case("fast")


@pytest.mark.skipif(jaxgraph.device_count() > 0, reason="checks what the factory returns without a GPU")
def test_without_a_gpu_the_factory_returns_the_jnp_functions(rng):
    for stage in tutorial.STAGES:
        assert list(tutorial.make_case(stage, n=16, steps=5)) == ["jnp"], stage
    fn, args = tutorial.make_case("loop", n=16, steps=5)["jnp"]
    np.testing.assert_allclose(np.asarray(fn(*args)), numpy_steps(*(np.asarray(a) for a in args), 5),
                               rtol=1e-5, atol=1e-6)
    fn, (kappa,) = tutorial.make_case("grad", n=16, steps=5)["jnp"]
    u0, _, _ = tutorial.problem(16)
    want = jax.grad(tutorial.loss_jnp)(kappa, jnp.asarray(u0), jnp.asarray(tutorial.observed(16, 5)), 5)
    np.testing.assert_allclose(np.asarray(fn(kappa)), np.asarray(want), rtol=1e-6)


def test_compare_runs_the_jnp_stage():
    result = jaxgraph.compare.run(FACTORY, ["off", "on"], rounds=1, target_ms=1,
                                  factory_kwargs={"stage": "jnp", "n": 32, "steps": 20})
    assert result.ok, str(result)
    assert set(result.timings) == {"jnp"} and set(result.timings["jnp"]) == {"off", "on"}
    assert "jnp" in str(result)


@pytest.mark.gpu
@pytest.mark.parametrize("stage", ["jax_call", "graphed", "loop", "stop", "grad"])
def test_compare_runs_every_stage_on_a_gpu_and_the_stages_agree(stage):
    labels = {"jax_call": ["jnp", "jax_call"], "graphed": ["jnp", "jax_call", "graphed step"],
              "loop": ["jnp", "jax_call", "graphed step", "device loop"],
              "stop": ["jnp", "jax_call", "device loop"], "grad": ["jnp", "device loop"]}[stage]
    rtol, atol = (1e-3, 1e-9) if stage == "grad" else (1e-4, 1e-5)
    result = jaxgraph.compare.run(FACTORY, ["defaults"], rounds=1, target_ms=2, compare_functions=True,
                                  rtol=rtol, atol=atol, factory_kwargs={"stage": stage, "n": 128, "steps": 500})
    assert result.ok, str(result)
    assert list(result.timings) == labels, str(result)
