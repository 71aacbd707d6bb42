"""examples/poisson_solver.py's jax.numpy solvers on the CPU: the idiomatic loops and their fair forms.

``jnp_jacobi(per_trip=S)`` and ``jnp_cg(per_trip=S)`` run S sweeps (iterations)
a ``lax.while_loop`` trip, as the device loop reads its flag once a step; each
tests the one before it and leaves the state as it was once converged, so the
result and the count must be those of one a trip (the test after every sweep), up to
the order XLA sums an unrolled trip in.
"""

import numpy as np
import pytest

from conftest import example

ps = example("poisson_solver")


@pytest.mark.parametrize("n, per_trip", [(9, 8), (16, 3), (13, 1)])
def test_jacobi_any_sweeps_a_trip_stops_at_the_same_sweep(n, per_trip):
    import jax.numpy as jnp

    prob = ps.Problem(n, 1e-3, np.random.default_rng())
    f = jnp.asarray(prob.f)
    u1, k1 = (np.asarray(a) for a in ps.jnp_jacobi(prob, 100_000)(f))
    assert 0 < int(k1) < 100_000
    trips = (per_trip,)
    if per_trip > 1:  # and a trip the stop falls inside of: the sweeps after it must be masked
        trips += (next(t for t in range(per_trip + 1, per_trip + 30) if int(k1) % t),)
    for t in trips:
        uk, kk = (np.asarray(a) for a in ps.jnp_jacobi(prob, 100_000, t)(f))
        # the same sweeps; XLA may fuse (and so sum) an unrolled trip in another order: a last bit apart
        assert abs(int(kk) - int(k1)) <= 1, (t, int(kk), int(k1))
        np.testing.assert_allclose(uk, u1, rtol=0, atol=1e-5 * float(np.abs(u1).max()))
        ps.Checker(prob).jacobi(f"jnp, {t} a trip", uk, int(kk), 100_000)  # numpy's sweeps, the exact solution


@pytest.mark.parametrize("n, per_trip", [(12, 4), (20, 1), (7, 5)])
def test_jnp_cg_meets_the_tolerance_and_its_count_does_not_depend_on_the_trip(n, per_trip):
    import jax.numpy as jnp

    prob = ps.Problem(n, 1e-4, np.random.default_rng())
    b = jnp.asarray(prob.b)
    x1, k1 = (np.asarray(a) for a in ps.jnp_cg(prob, 10_000)(b))
    xk, kk = (np.asarray(a) for a in ps.jnp_cg(prob, 10_000, per_trip)(b))
    assert 1 <= int(k1) <= 4 * n  # CG on n^2 unknowns: O(n) iterations
    assert abs(int(kk) - int(k1)) <= 1  # the same iterations; an unrolled trip may sum in another order
    np.testing.assert_allclose(xk, x1, rtol=0, atol=1e-3 * float(np.abs(x1).max()))
    ps.Checker(prob).cg(f"jnp CG, {per_trip} a trip", xk)  # float64 residual within tolerance, scipy's solution
    r = prob.b.astype(np.float64) - ps.numpy_operator(xk.astype(np.float64))
    assert np.linalg.norm(r) <= 1.01 * prob.rtol * np.linalg.norm(prob.b.astype(np.float64))


def test_the_fair_loops_stop_at_max():
    import jax.numpy as jnp

    prob = ps.Problem(10, 1e-6, np.random.default_rng())
    _, k = ps.jnp_jacobi(prob, 13, 8)(jnp.asarray(prob.f))
    assert int(k) == 13  # a trip of 8 stops counting at the limit, not at 16
    _, k = ps.jnp_cg(prob, 3, 4)(jnp.asarray(prob.b))
    assert int(k) == 3
