"""examples/adaptive_ode.py: Dormand-Prince 5(4) with a PI controller as one device loop.

CPU: the kernels compile to cubin through NVRTC, the settings and the tiled
geometry are validated, a numpy model of the tiled kernel's halo arithmetic
(tiles with clamped edges) gives the ring's step, the float64 numpy model of
the device algorithm and the jnp Dopri5 agree with scipy (and, where diffrax
is installed, take diffrax's steps). GPU: the device loop, one block or a
grid of tiles, and the six-kernel stages path accept and reject steps, land
on t_end exactly, take the model's steps, agree with scipy on fresh random
initial states, eagerly, inside jax.jit and through Kernel.jax_call in a
lax.while_loop, under XLA's command buffers off, on, JAX's defaults and
WHILE (one process each).
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


@pytest.mark.parametrize("name", ["stage_first", "stage", "error_control", "tile_step<1>", "tile_step<2>",
                                  "tile_step<4>"])
def test_kernels_compile_to_cubin_without_a_device(name):
    k = jaxgraph.Kernel(ao.SOURCE, name, arch="sm_90")
    assert k.cubin.startswith(b"\x7fELF")
    assert [p.ctype for p in k.params][:2] == ["double*", "double*"]
    if name.startswith("tile_step"):  # every pointer written (jax_call's inout) but none read-only
        assert [p.name for p in k.params if p.is_pointer and not p.is_const_pointer] == [
            "y0", "y1", "partial", "st", "ist", "done"]


@pytest.mark.parametrize("n, want", [
    (40, (64, 1, 1)), (100, (128, 1, 1)), (256, (256, 1, 1)),  # one block: the ring
    (257, (256, 1, 2)), (20000, (256, 1, 86)), (65536, (256, 1, 279)),  # tiles of 256 - 21
])
def test_tile_geometry(n, want):
    assert ao.tile_geometry(n) == want
    block, per_thread, blocks = want
    if blocks > 1:  # the tiles cover the ring
        assert (blocks - 1) * (block * per_thread - ao.HALO) < n <= blocks * (block * per_thread - ao.HALO)
    else:
        assert block * per_thread >= n and block % 32 == 0


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(per_thread=3), ValueError, "per_thread must be one of \\(1, 2, 4\\).*got 3"),
    (dict(block=100), ValueError, "block must be a multiple of 32 in \\[32, 1024\\], got 100"),
    (dict(block=2048), ValueError, "got 2048"),
    (dict(block=32.0), TypeError, "block must be an int, got float"),
])
def test_tile_geometry_is_validated(kwargs, error, match):
    with pytest.raises(error, match=match):
        ao.tile_geometry(5000, **kwargs)
    with pytest.raises(error, match=match):
        ao.AdaptiveDopri5(5000, **kwargs)  # before compiling or touching a device


def test_stages_path_takes_no_tile_geometry():
    with pytest.raises(ValueError, match="path must be one of tiled, stages, got 'fused'"):
        ao.AdaptiveDopri5(40, path="fused")
    with pytest.raises(ValueError, match="the stages path runs 256-thread blocks"):
        ao.AdaptiveDopri5(40, path="stages", block=64)


def tiled_step_model(y, h, width, left=14, right=7, forcing=ao.F):
    """tile_step's arithmetic on tiles of ``width`` elements with clamped edges (numpy): (y_new, sum of the
    squared scaled errors). Only the halo (``left`` + ``right`` = ao.HALO) makes each tile's own elements exact."""
    n, tile = len(y), width - left - right
    y_new, total = np.empty(n), 0.0

    def f(x):  # Lorenz-96 in a buffer, neighbours clamped to it (as l96_buf does for a tile)
        i = np.arange(len(x))
        at = lambda d: x[np.clip(i + d, 0, len(x) - 1)]  # noqa: E731
        return (at(1) - at(-2)) * at(-1) - x + forcing

    for first in range(0, n, tile):
        g = (first - left + np.arange(width)) % n
        yb = y[g]
        k = [f(yb)]
        ys = yb + h * (ao.A[1][0] * k[0])
        for s in range(2, 7):
            k.append(f(ys))
            ys = yb + h * sum((ao.A[s][j] * k[j] for j in range(s - 1)), ao.A[s][s - 1] * k[s - 1])
        k.append(f(ys))
        e = sum((ao.E[j] * k[j] for j in range(6)), ao.E[6] * k[6])
        scaled = h * e / (ao.ATOL + ao.RTOL * np.maximum(np.abs(yb), np.abs(ys)))
        own = slice(left, left + min(tile, n - first))
        y_new[g[own]] = ys[own]
        total += float(np.sum(scaled[own] ** 2))
    return y_new, total


@pytest.mark.parametrize("n, width", [(1000, 64), (1000, 512), (4097, 512), (700, 22)])
def test_tiles_with_their_halo_give_the_rings_step(n, width):
    rng = np.random.default_rng()
    y, h = ao.F + rng.standard_normal(n), 0.02
    k = [ao.lorenz96(y)]  # the ring's step, as reference_solve takes it
    ys = y + h * (ao.A[1][0] * k[0])
    for s in range(2, 7):
        k.append(ao.lorenz96(ys))
        ys = y + h * sum((ao.A[s][j] * k[j] for j in range(s - 1)), ao.A[s][s - 1] * k[s - 1])
    k.append(ao.lorenz96(ys))
    e = sum((ao.E[j] * k[j] for j in range(6)), ao.E[6] * k[6])
    want = np.sum((h * e / (ao.ATOL + ao.RTOL * np.maximum(np.abs(y), np.abs(ys)))) ** 2)
    y_new, total = tiled_step_model(y, h, width)
    np.testing.assert_allclose(y_new, ys, rtol=0, atol=1e-13)
    assert total == pytest.approx(want, rel=1e-12)


def test_a_halo_one_element_short_is_wrong():
    # y_new takes 6 evaluations of f (12 elements on the left, 6 on the right), the error's k7 a 7th
    y, h = ao.F + np.random.default_rng().standard_normal(1000), 0.05
    y_new, total = tiled_step_model(y, h, 64)
    assert 14 + 7 == ao.HALO
    for left, right in ((13, 7), (14, 6)):  # y_new still exact, the error sum not
        y_short, t_short = tiled_step_model(y, h, 64, left, right)
        np.testing.assert_array_equal(y_short, y_new)
        assert abs(t_short - total) > 1e-9 * total  # one wrong element a tile; rounding is ~1e-15
    for left, right in ((11, 7), (14, 5)):  # y_new reads a clamped (wrong) neighbour
        y_short, _ = tiled_step_model(y, h, 64, left, right)
        assert np.abs(y_short - y_new).max() > 1e-8


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


def test_jnp_dopri5_takes_the_models_steps_and_converges_to_scipy():
    rng = np.random.default_rng()
    with enable_x64(True):
        for n, tol, dt0 in ((8, 1e-5, 0.01), (40, 1e-9, 0.9), (97, 1e-7, 0.01)):  # dt0 0.9: rejections first
            y0 = ao.F + rng.standard_normal(n)
            y, t, acc, rej = (np.asarray(a) for a in ao.jnp_solver(rtol=tol, atol=tol, dt0=dt0)(y0, 1.0))
            my, mt, macc, mrej = ao.reference_solve(y0, 1.0, rtol=tol, atol=tol, dt0=dt0)
            assert float(t) == mt == 1.0 and (int(acc), int(rej)) == (macc, mrej), ((acc, rej), (macc, mrej))
            np.testing.assert_allclose(y, my, rtol=0, atol=1e-9)
            # the global error of a chaotic system, well off its fixed point: ~1e-3 seen at 1e-5, ~1e-5 at 1e-9
            assert np.abs(y - scipy_ref(y0, 1.0)).max() < {1e-5: 3e-2, 1e-7: 1e-3, 1e-9: 1e-4}[tol]
        y0 = ao.F + rng.standard_normal(40)
        y, t, acc, rej = (np.asarray(a) for a in ao.jnp_solver(max_steps=5)(y0, 1.0))
        assert int(acc) + int(rej) == 5 and float(t) < 1.0  # gives up after max_steps attempted steps


def test_jnp_dopri5_takes_diffraxs_steps():
    pytest.importorskip("diffrax", reason="diffrax is optional (the examples extra)")
    rng = np.random.default_rng()
    with enable_x64(True):
        for n in (40, 256):
            y0 = ao.initial_state(n, rng)
            y, t, acc, rej = (np.asarray(a) for a in ao.jnp_solver()(y0, 2.0))
            dy, dt, dacc, drej = (np.asarray(a) for a in ao.diffrax_solver()(y0, 2.0))
            assert (int(acc), int(rej)) == (int(dacc), int(drej)) and int(rej) > 0
            assert float(t) == float(dt) == 2.0
            np.testing.assert_allclose(y, dy, rtol=0, atol=1e-8)


def test_help_prints_the_whole_description():
    out = subprocess.run([sys.executable, str(PATH), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for text in ("Lorenz-96", "tile_step", "halo", "PIDController", "jax_call", "--quick", "--command-buffers",
                 "examples"):
        assert text in out.stdout, out.stdout


# ----------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------


# (n, AdaptiveDopri5 keyword arguments): one block (the ring), a grid of tiles, the six-kernel stages
TILED_ONE = [(40, {}), (256, {}), (2048, dict(block=1024, per_thread=2)), (1000, dict(per_thread=1)),
             (1500, dict(per_thread=4))]
TILED_MANY = [(257, {}), (4097, {}), (20000, {}), (40, dict(block=32, per_thread=1)),  # 2, 18, 86 and 4 tiles
              (1000, dict(block=64, per_thread=2)), (5000, dict(block=512, per_thread=4)),  # 10 and 3 tiles
              (3000, dict(block=128, per_thread=4))]
STAGES = [(40, dict(path="stages")), (4099, dict(path="stages"))]  # 1 and 17 blocks


def geometry_id(case):
    n, kw = case
    return f"{n}-" + "-".join(f"{k}{v}" for k, v in kw.items()) if kw else str(n)


@pytest.mark.gpu
@pytest.mark.parametrize("kwargs", [{}, dict(block=32, per_thread=1), dict(path="stages")], ids=["one", "tiles", "stages"])
def test_rejections_and_t_end_exactly_with_the_models_steps(kwargs):
    rng = np.random.default_rng()
    y0 = ao.F + rng.standard_normal(40)
    ode = ao.AdaptiveDopri5(40, t_end=1.0, rtol=1e-9, atol=1e-9, dt0=0.9, **kwargs)  # far too large a dt0
    assert (ode.blocks > 1) == ("block" in kwargs), ode
    ode.y_new.copy_(jaxgraph.asarray(np.full(40, np.nan)))  # poison: the result must be written
    y, t, acc, rej = ode.solve(y0)
    my, mt, macc, mrej = ao.reference_solve(y0, 1.0, rtol=1e-9, atol=1e-9, dt0=0.9)
    assert t == 1.0 and rej >= 2 and acc >= 10
    assert (acc, rej) == (macc, mrej)
    np.testing.assert_allclose(y, my, rtol=0, atol=1e-9)
    assert np.abs(y - scipy_ref(y0, 1.0)).max() < 1e-5
    assert int(ode.loop.steps_run.numpy()[0]) == acc + rej  # the loop stopped after the step that set the flag


@pytest.mark.gpu
@pytest.mark.parametrize("case", TILED_ONE + TILED_MANY + STAGES, ids=geometry_id)
def test_agrees_with_scipy_and_the_model_on_fresh_random_states(case):
    n, kwargs = case
    rng = np.random.default_rng()
    ode = ao.AdaptiveDopri5(n, t_end=1.0, rtol=1e-10, atol=1e-10, **kwargs)
    assert (ode.blocks == 1) == (case in TILED_ONE or (n, kwargs) == (40, dict(path="stages"))), ode
    for _ in range(2):  # a second state through the same loop: nothing stale carries over
        y0 = ao.F + rng.standard_normal(n)
        ode.y_new.copy_(jaxgraph.asarray(np.full(n, np.nan)))  # poison the other buffer
        y, t, acc, rej = ode.solve(y0)
        assert t == 1.0
        assert np.abs(y - scipy_ref(y0, 1.0)).max() < 1e-5  # global error at 1e-10 here: 1e-7 to 1e-6
        my, _, macc, mrej = ao.reference_solve(y0, 1.0, rtol=1e-10, atol=1e-10)
        assert (acc, rej) == (macc, mrej)
        np.testing.assert_allclose(y, my, rtol=0, atol=1e-9)


@pytest.mark.gpu
def test_one_block_tiles_and_stages_agree():
    y0 = ao.initial_state(2000, np.random.default_rng())
    runs = [ao.AdaptiveDopri5(2000, t_end=2.0, **kw).solve(y0)
            for kw in ({}, dict(block=1024, per_thread=2), dict(block=128, per_thread=2), dict(path="stages"))]
    for y, t, *steps in runs[1:]:  # against the default (tiles of 256 x 1): one block, tiles of 128 x 2, stages
        assert t == runs[0][1] == 2.0 and steps == list(runs[0][2:])
        np.testing.assert_allclose(y, runs[0][0], rtol=0, atol=1e-9)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1024, 20000])
def test_step_counts_match_diffrax_and_the_jnp_solver(n):
    pytest.importorskip("diffrax", reason="diffrax is optional (the examples extra)")
    y0 = ao.initial_state(n, np.random.default_rng())
    _, t, acc, rej = ao.AdaptiveDopri5(n, t_end=2.0).solve(y0)
    with enable_x64(True):
        _, dt, dacc, drej = (np.asarray(a) for a in ao.diffrax_solver()(y0, 2.0))
        _, jt, jacc, jrej = (np.asarray(a) for a in ao.jnp_solver()(y0, 2.0))
    assert t == float(dt) == float(jt) == 2.0
    assert abs(acc - int(dacc)) + abs(rej - int(drej)) <= 1, ((acc, rej), (int(dacc), int(drej)))
    assert (int(jacc), int(jrej)) == (int(dacc), int(drej))


JIT_CHECK = r"""
import sys, importlib.util
import numpy as np
import jax
jax.config.update("jax_enable_x64", True)
spec = importlib.util.spec_from_file_location("ao", sys.argv[1]); ao = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ao)
rng = np.random.default_rng()
for n, kw in ((256, {}), (3000, dict(block=128, per_thread=2)), (256, dict(path="stages"))):
  ode = ao.AdaptiveDopri5(n, t_end=2.0, dt0=1.0, **kw)
  solve, xla = jax.jit(ode.jax_solve), jax.jit(ode.xla_solve)
  for _ in range(2):  # fresh states through the same executables
      y0 = ao.initial_state(n, rng)
      y, t, acc, rej = (np.asarray(a) for a in solve(y0))
      xy, xt, xacc, xrej = (np.asarray(a) for a in xla(y0))
      ey, et, eacc, erej = ode.solve(y0)
      assert float(t) == float(xt) == et == 2.0, (t, xt, et)
      assert (int(acc), int(rej)) == (int(xacc), int(xrej)) == (eacc, erej) and erej >= 1, (acc, rej, eacc, erej)
      assert np.array_equal(y, ey) and np.array_equal(xy, ey)  # same kernels: bit for bit
      my = ao.reference_solve(y0, 2.0, dt0=1.0)
      assert (eacc, erej) == my[2:], (eacc, erej, my[2:])
      np.testing.assert_allclose(y, my[0], rtol=0, atol=1e-8)
  print("ok", n, kw, int(acc), int(rej))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("setting", ["off", "on", "defaults", "while"])
def test_jit_and_jax_call_match_eager_under_each_xla_setting(setting):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if setting != "defaults":
        env["XLA_FLAGS"] = ao.COMMAND_BUFFERS[setting]
    out = subprocess.run([sys.executable, "-c", JIT_CHECK, str(PATH)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.count("ok") == 3, out.stdout + out.stderr
