"""examples/adaptive_ode.py: Dormand-Prince 5(4) with a PI controller as one device loop.

CPU: the kernels compile to cubin through NVRTC, the settings are validated,
and the float64 numpy model of the device algorithm agrees with scipy (and,
where diffrax is installed, takes diffrax's steps). GPU: the device loop
accepts and rejects steps, lands on t_end exactly, takes the model's steps,
agrees with scipy on fresh random initial states, eagerly and inside jax.jit
under XLA's command buffers off, on and JAX's defaults (one process each).
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import jaxgraph
from conftest import enable_x64, example

ROOT = pathlib.Path(__file__).parents[2]
PATH = ROOT / "examples" / "adaptive_ode.py"


ao = example("adaptive_ode")
scipy_integrate = pytest.importorskip("scipy.integrate", reason="scipy is needed for the reference solutions")


def scipy_ref(y0, t_end, tol=1e-12):
    return ao.scipy_solve(y0, t_end, tol=tol)


# ----------------------------------------------------------------------------
# CPU
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["stage_first", "stage", "error_control"])
def test_kernels_compile_to_cubin_without_a_device(name):
    k = jaxgraph.Kernel(ao.SOURCE, name, arch="sm_90")
    assert k.cubin.startswith(b"\x7fELF")
    assert [p.ctype for p in k.params][:2] == {"stage_first": ["double*", "double*"], "stage": ["double*", "double*"],
                                               "error_control": ["double*", "double*"]}[name]


@pytest.mark.parametrize("kwargs, match", [
    (dict(n=3), "n must be in \\[4, .*got 3"),
    (dict(n=2**31), "n must be in"),
    (dict(rtol=0.0), "rtol must be a finite number > 0, got 0.0"),
    (dict(atol=float("nan")), "atol must be a finite number > 0, got nan"),
    (dict(t_end=-1.0), "t_end must be a finite number > 0, got -1.0"),
    (dict(dt0=True), "dt0 must be a finite number > 0, got True"),
    (dict(max_steps=0), "max_steps must be in \\[1, 2\\*\\*31\\), got 0"),
])
def test_settings_are_validated_before_any_device_work(kwargs, match):
    settings = dict(n=40, t_end=1.0, rtol=1e-5, atol=1e-5, dt0=0.01, max_steps=100)
    settings.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ao.check_problem(**settings)
    n = settings.pop("n")
    with pytest.raises(ValueError, match=match):
        ao.AdaptiveDopri5(n, **settings)  # raises before compiling or touching a device


def test_fused_needs_a_size_one_block_holds():
    with pytest.raises(ValueError, match="n must be at most 4096, got 4097"):
        ao.AdaptiveDopri5(4097, fused=True)


def test_settings_types_are_checked():
    with pytest.raises(TypeError, match="n must be an int, got float"):
        ao.check_problem(40.0, 1.0, 1e-5, 1e-5, 0.01, 100)
    with pytest.raises(TypeError, match="max_steps must be an int, got str"):
        ao.reference_solve(np.ones(8), 1.0, max_steps="100")


def test_numpy_model_converges_to_scipy_on_fresh_random_states():
    rng = np.random.default_rng()
    for n in (8, 40, 97):
        y0 = ao.F + rng.standard_normal(n)  # well off the fixed point
        ref = scipy_ref(y0, 1.0)
        errors = []
        for tol in (1e-5, 1e-7, 1e-9, 1e-11):
            y, t, acc, rej = ao.reference_solve(y0, 1.0, rtol=tol, atol=tol)
            assert t == 1.0  # exactly: the last step is clipped to t_end
            errors.append(float(np.abs(y - ref).max()))
        assert errors[-1] < 1e-6, errors
        assert errors[0] > 30 * errors[-1], errors  # a tighter tolerance gives a better answer
        assert all(b < a for a, b in zip(errors, errors[1:])), errors


def test_numpy_model_rejects_a_too_large_first_step_and_lands_on_t_end():
    y0 = ao.F + np.random.default_rng().standard_normal(40)
    y, t, acc, rej = ao.reference_solve(y0, 1.0, rtol=1e-9, atol=1e-9, dt0=0.9)
    assert t == 1.0 and rej >= 2 and acc >= 10
    y_small, _, _, rej_small = ao.reference_solve(y0, 1.0, rtol=1e-9, atol=1e-9, dt0=1e-4)
    assert rej_small < rej  # the large first step is what got rejected
    assert np.abs(y - scipy_ref(y0, 1.0)).max() < 1e-4  # global error of a chaotic system: up to ~1.2e-5 seen over 100 seeds


def test_numpy_model_takes_diffraxs_steps():
    pytest.importorskip("diffrax", reason="diffrax is optional (the examples extra)")
    rng = np.random.default_rng()
    for n in (40, 256):
        y0 = ao.initial_state(n, rng)
        y, t, acc, rej = ao.reference_solve(y0, 2.0)
        with enable_x64(True):
            dy, dt, dacc, drej = (np.asarray(a) for a in ao.diffrax_solver()(y0, 2.0))
        assert (acc, rej) == (int(dacc), int(drej)) and rej > 0
        assert float(dt) == t == 2.0
        np.testing.assert_allclose(y, dy, rtol=0, atol=1e-8)


def test_help_prints_the_whole_description():
    out = subprocess.run([sys.executable, str(PATH), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for text in ("Lorenz-96", "error_control", "PIDController", "--quick", "--command-buffers", "examples"):
        assert text in out.stdout, out.stdout


# ----------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False])
def test_rejections_and_t_end_exactly_with_the_models_steps(fused):
    rng = np.random.default_rng()
    y0 = ao.F + rng.standard_normal(40)
    ode = ao.AdaptiveDopri5(40, t_end=1.0, rtol=1e-9, atol=1e-9, dt0=0.9, fused=fused)  # far too large a dt0
    ode.y_new.copy_(jaxgraph.asarray(np.full(40, np.nan)))  # poison: the result must be written
    y, t, acc, rej = ode.solve(y0)
    my, mt, macc, mrej = ao.reference_solve(y0, 1.0, rtol=1e-9, atol=1e-9, dt0=0.9)
    assert t == 1.0 and rej >= 2 and acc >= 10
    assert (acc, rej) == (macc, mrej)
    np.testing.assert_allclose(y, my, rtol=0, atol=1e-9)
    assert np.abs(y - scipy_ref(y0, 1.0)).max() < 1e-5
    assert int(ode.loop.steps_run.numpy()[0]) == acc + rej  # the loop stopped after the step that set the flag


@pytest.mark.gpu
@pytest.mark.parametrize("n, fused", [(40, False), (1000, False), (4099, False),  # 1, 4 and 17 blocks
                                      (40, True), (1000, True), (4096, True)])    # 1 to 4 elements a thread
def test_agrees_with_scipy_and_the_model_on_fresh_random_states(n, fused):
    rng = np.random.default_rng()
    ode = ao.AdaptiveDopri5(n, t_end=1.0, rtol=1e-10, atol=1e-10, fused=fused)
    for _ in range(2):  # a second state through the same loop: nothing stale carries over
        y0 = ao.F + rng.standard_normal(n)
        y, t, acc, rej = ode.solve(y0)
        assert t == 1.0
        assert np.abs(y - scipy_ref(y0, 1.0)).max() < 1e-5  # global error at 1e-10 here: 1e-7 to 1e-6
        my, _, macc, mrej = ao.reference_solve(y0, 1.0, rtol=1e-10, atol=1e-10)
        assert (acc, rej) == (macc, mrej)
        np.testing.assert_allclose(y, my, rtol=0, atol=1e-9)


@pytest.mark.gpu
def test_fused_and_six_kernel_steps_agree():
    y0 = ao.initial_state(1024, np.random.default_rng())
    a = ao.AdaptiveDopri5(1024, t_end=2.0, fused=True)
    b = ao.AdaptiveDopri5(1024, t_end=2.0, fused=False)
    assert a.fused and not b.fused
    ya, ta, *sa = a.solve(y0)
    yb, tb, *sb = b.solve(y0)
    assert ta == tb == 2.0 and sa == sb
    np.testing.assert_allclose(ya, yb, rtol=0, atol=1e-9)


@pytest.mark.gpu
def test_step_counts_match_diffrax():
    pytest.importorskip("diffrax", reason="diffrax is optional (the examples extra)")
    y0 = ao.initial_state(1024, np.random.default_rng())
    _, t, acc, rej = ao.AdaptiveDopri5(1024, t_end=2.0).solve(y0)
    with enable_x64(True):
        _, dt, dacc, drej = (np.asarray(a) for a in ao.diffrax_solver()(y0, 2.0))
    assert t == float(dt) == 2.0
    assert abs(acc - int(dacc)) + abs(rej - int(drej)) <= 1, ((acc, rej), (int(dacc), int(drej)))


JIT_CHECK = r"""
import sys, importlib.util
import numpy as np
import jax
jax.config.update("jax_enable_x64", True)
spec = importlib.util.spec_from_file_location("ao", sys.argv[1]); ao = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ao)
rng = np.random.default_rng()
for fused in (True, False):
  ode = ao.AdaptiveDopri5(256, t_end=2.0, dt0=1.0, fused=fused)
  solve = jax.jit(ode.jax_solve)
  for _ in range(2):  # fresh states through the same executable
      y0 = ao.initial_state(256, rng)
      y, t, acc, rej = (np.asarray(a) for a in solve(y0))
      ey, et, eacc, erej = ode.solve(y0)
      assert float(t) == et == 2.0, (t, et)
      assert (int(acc), int(rej)) == (eacc, erej) and erej >= 1, (acc, rej, eacc, erej)
      assert np.array_equal(y, ey)
      my = ao.reference_solve(y0, 2.0, dt0=1.0)
      assert (eacc, erej) == my[2:], (eacc, erej, my[2:])
      np.testing.assert_allclose(y, my[0], rtol=0, atol=1e-8)
print("ok", int(acc), int(rej))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("setting", ["off", "on", "defaults"])
def test_jit_matches_eager_under_each_xla_setting(setting):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if setting != "defaults":
        env["XLA_FLAGS"] = ao.COMMAND_BUFFERS[setting]
    out = subprocess.run([sys.executable, "-c", JIT_CHECK, str(PATH)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


# ----------------------------------------------------------------------------
# The benchmark's report (CPU, from made-up worker records)
# ----------------------------------------------------------------------------


def test_vs_diffrax_report_takes_each_solvers_best_setting():
    sys.path.insert(0, str(ROOT))
    from benchmarks import vs_diffrax

    def rec(samples_us):
        return {"samples": samples_us, "jaxgraph_steps": [280, 9], "diffrax_steps": [280, 9],
                "max_abs_diff_vs_diffrax": 3e-6}

    procs = {"off": {"by_n": {"40": {"diffrax": rec([90e3, 95e3]), "jaxgraph_jit": rec([6e3, 6.2e3]),
                                     "jaxgraph_eager": rec([6.5e3, 7e3])}}},
             "on": {"by_n": {"40": {"diffrax": rec([40e3, 44e3]), "jaxgraph_jit": rec([7e3, 7.5e3]),
                                    "jaxgraph_eager": rec([6.5e3, 7e3])}}},
             "defaults": {"failed": "exit code 1"}}
    vs_diffrax.summarize(procs)
    sp = vs_diffrax.speedups(procs, "40")
    assert sp["diffrax"][0] == "on" and sp["jaxgraph_jit"][0] == "off"  # each at its lowest median
    assert sp["speedup"] == pytest.approx(42.0 / 6.1)
    assert sp["speedup_range"] == pytest.approx([40.0 / 6.2, 44.0 / 6.0])
    text = vs_diffrax.markdown({"processes": procs, "device": "NVIDIA H100", "command": "python x", "git": "abc",
                                "date": "2026-11-27", "config": {"t_end": 10.0, "repeats": 2, "sizes": [40]}})
    assert "| diffrax | 92.500 [90.000 - 95.000] | 42.000 [40.000 - 44.000] |" in text
    assert "setting `defaults` failed: exit code 1" in text
    assert "**6.9x** [6.5 - 7.3] (issue 30's target, >= 5x on the H100: met on this device)" in text
    assert f"{6.1e3 / 289:.1f} vs {42e3 / 289:.1f} us per attempted step" in text
    assert "off: jaxgraph [280, 9], diffrax [280, 9], max |jaxgraph - diffrax| 3.0e-06" in text
