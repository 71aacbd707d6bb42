"""examples/poisson_kernels.py's steps on the CPU, their kernels emulated in numpy.

The CUDA kernels need the GPU (tests/test_examples_gpu.py runs them). Here
``jaxgraph`` inside the module is replaced by numpy stand-ins: ``empty`` gives
NaN-poisoned arrays and each kernel launch runs a numpy model of that kernel
(the whole grid at once, in float32, the per-block sums over blocks of 256).
Running the steps in a Python loop until their flag, as the device loop does,
checks what the kernels cannot check on their own: the ping-pong of u, the
per-block sums and CG's sets of arrays between launches and steps, the
counts, and the stop on the launch after the converged sweep.
"""

import types

import numpy as np
import pytest

from conftest import example

ps = example("poisson_solver")  # it puts examples/ on the path for its siblings
import poisson_kernels  # noqa: E402  (the module poisson_solver imported)
from support.poisson_helpers import Captured  # noqa: E402

f32 = np.float32


def block_sums(x, blocks):
    flat = np.zeros(blocks * 256, f32)
    flat[:x.size] = x.ravel()
    return flat.reshape(blocks, 256).sum(axis=1, dtype=f32)


def jacobi(u_new, part_out, flag, count, update2, u, f, part_in, h2, n, tol2):
    if flag[0] or part_in.sum(dtype=f32) <= tol2:
        if not flag[0]:
            flag[0], update2[0] = 1, part_in.sum(dtype=f32)
        u_new[...] = u
        return
    q = np.pad(u, 1)
    v = f32(0.25) * (((q[1:-1, :-2] + q[1:-1, 2:]) + (q[:-2, 1:-1] + q[2:, 1:-1])) + h2 * f)
    part_out[...] = block_sums((v - u) ** 2, part_out.size)
    u_new[...] = v
    count[0] += 1


def cg_fused(x, p, flag, count, r_out, w_out, s_out, part_out, scal_out, r, w, s, part_in, scal_in, n, tol2):
    blocks = part_in.size // 2
    gamma, delta = part_in[:blocks].sum(dtype=f32), part_in[blocks:].sum(dtype=f32)
    if flag[0] or gamma <= tol2:
        flag[0] = 1
        return
    beta = gamma / scal_in[0]
    alpha = gamma / (delta - beta * gamma / scal_in[1])
    s_out[...] = w + beta * s
    p[...] = r + beta * p
    x += alpha * p
    r_out[...] = r - alpha * s_out
    w_out[...] = ps.numpy_operator(r_out)
    part_out[...] = np.concatenate([block_sums(r_out * r_out, blocks), block_sums(w_out * r_out, blocks)])
    scal_out[...] = gamma, alpha
    count[0] += 1


class FakeKernel:
    def __init__(self, source, name):
        self.run = {"jacobi": jacobi, "cg_fused": cg_fused}[name]

    def __getitem__(self, launch):
        return self.run


@pytest.fixture
def numpy_jaxgraph(monkeypatch):
    captured = Captured()
    monkeypatch.setattr(poisson_kernels, "jaxgraph", types.SimpleNamespace(Kernel=FakeKernel, empty=captured.empty))
    monkeypatch.setattr(poisson_kernels, "has_check_every", lambda: True)
    return captured


def run_until_flag(captured, step, state, fed, most):
    """The device loop in Python: step until the flag (its last output, cleared at the start, as the
    loop does); ``fed``: {output: input}."""
    captured.next = 0
    step(*[np.copy(a) for a in state])[-1][0] = 0  # "capture": allocate, then clear the flag
    for steps in range(1, most + 1):
        captured.next = 0
        out = step(*state)
        state = list(state)
        for o, i in fed.items():
            state[i] = out[o]
        if out[-1][0]:
            return out, steps
    raise AssertionError("no flag")


@pytest.mark.parametrize("n, per_step", [(12, 1), (16, 2), (9, 3), (20, 8)])
def test_jacobi_steps_stop_at_numpy_sweep(numpy_jaxgraph, n, per_step):
    prob = ps.Problem(n, 1e-3, np.random.default_rng())
    kernels = ps.Kernels(prob, per_step)
    state = [np.zeros((n, n), f32), prob.f, np.zeros(1, np.int32), np.full(prob.blocks, np.inf, f32)]
    (u, count, _, _), _ = run_until_flag(numpy_jaxgraph, kernels.jacobi_step, state, kernels.jacobi_feed, 100_000)
    sweeps, u_k, pad = 0, np.zeros((n, n), f32), np.zeros((n + 2, n + 2), f32)
    while True:  # numpy: the first sweep whose squared update (summed as the kernels do) is within tolerance
        sweeps += 1
        pad[1:-1, 1:-1] = u_k
        u_next = f32(0.25) * (((pad[1:-1, :-2] + pad[1:-1, 2:]) + (pad[:-2, 1:-1] + pad[2:, 1:-1])) + prob.b)
        if block_sums((u_next - u_k) ** 2, prob.blocks).sum(dtype=f32) <= prob.jacobi_tol2:
            break
        u_k = u_next
        assert sweeps < 100_000
    assert int(count[0]) == sweeps
    np.testing.assert_allclose(u, ps.numpy_jacobi(prob, int(count[0])), rtol=0, atol=1e-6)


@pytest.mark.parametrize("n, per_step", [(12, 2), (20, 4), (33, 8)])
def test_cg_steps_match_scipy(numpy_jaxgraph, n, per_step):
    prob = ps.Problem(n, 1e-5, np.random.default_rng())
    kernels = ps.Kernels(prob, per_step)
    z, b = np.zeros((n, n), f32), prob.b
    w = ps.numpy_operator(b)
    part = np.zeros(2 * prob.blocks, f32)
    part[0], part[prob.blocks] = np.sum(b * b, dtype=f32), np.sum(w * b, dtype=f32)
    state = [z.copy(), z.copy(), np.zeros(1, np.int32), b.copy(), w, z.copy(), part, np.array([np.inf, 1], f32)]
    out, steps = run_until_flag(numpy_jaxgraph, kernels.cg_step, state, {}, 10_000)
    x, its = out[0], int(out[2][0])
    assert steps == -(-(its + 1) // per_step)  # stopped by the launch after the converged iteration
    ps.Checker(prob).cg("emulated", x)
    assert its <= 4 * n


@pytest.mark.parametrize("per_step, check_every", [(1, 1), (3, 4), (8, 8)])
def test_the_loops_stop_on_the_steps_flag(numpy_jaxgraph, monkeypatch, per_step, check_every):
    """jacobi_loop and cg_loop hand graphed_loop the step's flag, the feed the steps need and enough steps."""
    calls = []

    def graphed(step, sample):
        numpy_jaxgraph.next = 0
        return types.SimpleNamespace(static_outputs=step(*[np.copy(a) for a in sample]), sample=sample)

    def graphed_loop(g, steps, feed=None, until=None, **kw):
        calls.append((g, steps, feed, until, kw))
        return "loop"

    monkeypatch.setattr(poisson_kernels.jaxgraph, "make_graphed_callables", graphed, raising=False)
    monkeypatch.setattr(poisson_kernels.jaxgraph, "graphed_loop", graphed_loop, raising=False)
    prob = ps.Problem(10, 1e-3, np.random.default_rng())
    kernels = ps.Kernels(prob, per_step)
    assert kernels.jacobi_loop(1000, check_every)[1] == "loop"
    g, steps, feed, until, kw = calls[-1]
    assert until is g.static_outputs[-1] and until.dtype == np.int32 and steps == -(-1000 // per_step) + 1
    assert feed == ({0: 0, 2: 3} if per_step % 2 else {0: 0}) and kw == ({"check_every": check_every}
                                                                       if check_every > 1 else {})
    assert [a.shape for a in g.sample] == [(10, 10), (10, 10), (1,), (prob.blocks,)]
    assert np.isinf(g.sample[3]).all()  # no sweep before the first converged
    if per_step % 2:
        with pytest.raises(ValueError, match="even per_step"):
            kernels.cg_loop(100)
        return
    kernels.cg_loop(100, check_every)
    g, steps, feed, until, kw = calls[-1]
    assert until is g.static_outputs[-1] and feed is None and steps == -(-100 // per_step) + 1
    assert [a.shape for a in g.sample] == [(10, 10)] * 2 + [(1,)] + [(10, 10)] * 3 + [(2 * prob.blocks,), (2,)]
