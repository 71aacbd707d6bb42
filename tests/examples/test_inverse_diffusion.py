"""examples/inverse_diffusion.py: the jnp model, the hand-written adjoint and the finite-difference check on
the CPU (float64); on the GPU, the device gradient against both and a descent that lowers the loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import enable_x64, example


@pytest.fixture(scope="module")
def ex():
    return example("inverse_diffusion")


def _lap(u):
    return np.roll(u, 1, 0) + np.roll(u, -1, 0) + np.roll(u, 1, 1) + np.roll(u, -1, 1) - 4 * u


def adjoint_np(u, kappa, ct):
    """What diffuse_bwd computes, in numpy (the kernel's formula, neighbour by neighbour)."""
    w = kappa * ct
    return ct + _lap(w), ct * _lap(u)


def test_reference_matches_a_numpy_loop(ex, rng):
    with enable_x64(True):
        u0, kappa = rng.standard_normal((9, 9)), rng.uniform(0.02, 0.2, (9, 9))
        u = u0.copy()
        for _ in range(13):
            u = u + kappa * _lap(u)
        np.testing.assert_allclose(ex.diffuse_reference(jnp.asarray(u0), jnp.asarray(kappa), 13), u, rtol=1e-12)


def test_hand_written_adjoint_is_the_vjp_of_a_step(ex, rng):
    with enable_x64(True):
        u, kappa, ct = rng.standard_normal((7, 7)), rng.uniform(0.02, 0.2, (7, 7)), rng.standard_normal((7, 7))
        _, vjp = jax.vjp(lambda u, k: u + k * ex.laplacian(u), jnp.asarray(u), jnp.asarray(kappa))
        gu, gk = vjp(jnp.asarray(ct))
        mu, mk = adjoint_np(u, kappa, ct)
        np.testing.assert_allclose(mu, gu, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(mk, gk, rtol=1e-12, atol=1e-12)


def test_finite_differences_confirm_jax_grad_and_catch_a_wrong_gradient(ex, rng):
    with enable_x64(True):
        kappa_true, u0, kappa = (np.asarray(a, np.float64) for a in ex.problem(10, rng))
        u_obs = np.asarray(ex.diffuse_reference(jnp.asarray(u0), jnp.asarray(kappa_true), 15))
        loss = jax.jit(lambda k: ex.loss_reference(k, jnp.asarray(u0), jnp.asarray(u_obs), 15))
        g = np.asarray(jax.grad(loss)(kappa))
        assert ex.finite_difference_check(loss, g, kappa, rng) < 1e-6
        wrong = g.copy()
        wrong[3, 4] += 0.3 * np.abs(g).max()
        assert ex.finite_difference_check(loss, wrong, kappa, rng, directions=5) > 1e-3
        assert ex.finite_difference_check(loss, 1.01 * g, kappa, rng) > 5e-3


def test_backtracking_descent_lowers_the_jnp_loss(ex, rng):
    losses, err, _ = ex.descend(16, 30, 8, rng, loss_fn=ex.loss_reference)
    assert len(losses) >= 3 and all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.9 * losses[0], losses


@pytest.mark.gpu
def test_device_gradient_matches_and_descent_lowers_the_loss(ex, rng):
    err32, err_fd = ex.check_gradients(rng)
    assert err32 < 1e-4 and err_fd < 1e-5, (err32, err_fd)
    losses, err, loop = ex.descend(24, 60, 8, rng)
    assert len(losses) >= 2 and all(b < a for a, b in zip(losses, losses[1:])), losses
