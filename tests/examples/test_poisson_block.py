"""examples/poisson_block.py: the single-block Jacobi and CG kernels, their numpy models and device loops.

On the CPU: the kernels compile to sm_90 cubins through NVRTC; the numpy
models of one launch (the kernel's thread layout, shared copy and reduction
tree) agree with poisson_solver's numpy Jacobi bit for bit and with scipy's
solution, stop on the sweep an independent float64 test stops at (within
the last bits of the sum), and give the same bits however many sweeps a
launch runs (what the kernels store at exit and load at entry); the steps
and loops, their kernels replaced by the models, stop on their flag. On the
GPU (marked gpu): the kernels, eagerly and in jax.jit, exact and every-K
stop, against the models bit for bit and against the references.
"""

import types

import numpy as np
import pytest

import jaxgraph
from conftest import example

ps = example("poisson_solver")  # it puts examples/ on the path for its siblings
import poisson_block as pb  # noqa: E402  (the module poisson_solver imported)
from support.poisson_helpers import Captured, float64_jacobi_stop  # noqa: E402

f32 = np.float32


def float64_cg_iterations(prob, most=10**4):
    """Textbook CG in float64 from x = 0 until ||r||^2 <= the float32 tolerance: its iteration count."""
    b = prob.b.astype(np.float64)
    x, r = np.zeros_like(b), b.copy()
    p, gamma = r.copy(), float(np.sum(r * r))
    for k in range(most):
        if gamma <= prob.cg_tol2:
            return k
        ap = ps.numpy_operator(p)
        alpha = gamma / float(np.sum(p * ap))
        x, r = x + alpha * p, r - alpha * ap
        gamma, last = float(np.sum(r * r)), gamma
        p = r + (gamma / last) * p
    raise AssertionError("float64 CG did not converge")


# ----------------------------------------------------------------------------
# CPU
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("name, params", [
    ("jacobi_block", "float* u, int* flag, int* count, const float* f, float h2, int n, float tol2, int sweeps"),
    ("cg_block", "float* x, int* flag, int* count, float* r, float* w, float* p, float* s, float* scal, "
                 "const float* b, int n, float tol2, int iters")], ids=["jacobi_block", "cg_block"])
def test_kernels_compile_for_sm90(name, params):
    k = jaxgraph.Kernel(pb.SOURCE, name, arch="sm_90")
    assert k.arch == "sm_90" and len(k.cubin) > 1000
    assert f"{name}({params})" in repr(k)  # the order BlockKernels launches them with


def test_the_layout_covers_the_grid_once():
    for n in (1, 7, 40, 64):
        st = pb.Strips(n)
        assert sorted(st.glob[st.inside]) == list(range(n * n))  # every unknown owned by exactly one thread
        assert sorted(st.sh.ravel()) == list(range(pb.SIDE * pb.SIDE))  # the shared copy written whole
        assert st.inside.sum() == n * n


def test_the_block_sum_is_a_fixed_tree():
    rng = np.random.default_rng()
    terms = rng.standard_normal((pb.THREADS, pb.ROWS)).astype(f32)
    total = pb.block_total(terms)
    assert total.dtype == f32 and total == pytest.approx(float(terms.astype(np.float64).sum()), abs=1e-3)
    lanes = np.zeros(32, f32)
    lanes[5] = 3  # lane 5 reaches lane 0 through the +4 and +1 levels of the shuffle-down tree
    assert pb.tree32(lanes) == 3
    ones = np.ones((pb.THREADS, pb.ROWS), f32)
    assert pb.block_total(ones) == 4096


@pytest.mark.parametrize("n, rtol", [(5, 1e-3), (12, 1e-3), (33, 1e-3), (64, 1e-4)])
def test_jacobi_model_is_numpys_jacobi_and_stops_there(n, rtol):
    prob = ps.Problem(n, rtol, np.random.default_rng())
    u, sweeps, launches = pb.model_solve(prob, "jacobi", 256)
    np.testing.assert_array_equal(u, ps.numpy_jacobi(prob, sweeps))  # the same float32 operations, same order
    assert abs(sweeps - float64_jacobi_stop(prob)) <= 2  # the sum's order differs in the last bits only
    assert launches == -(-sweeps // 256)  # stopped in the launch of the converged sweep, not the next
    ps.Checker(prob).jacobi("model", u, sweeps, 10**6)
    for per_launch in (7, sweeps, 10**6):  # state stored at exit, loaded at entry: the same bits
        u_k, sweeps_k, _ = pb.model_solve(prob, "jacobi", per_launch)
        assert sweeps_k == sweeps
        np.testing.assert_array_equal(u_k, u)


@pytest.mark.parametrize("n, rtol", [(4, 1e-5), (13, 1e-5), (40, 1e-4), (64, 1e-4)])
def test_cg_model_matches_scipy_and_float64_cg(n, rtol):
    prob = ps.Problem(n, rtol, np.random.default_rng())
    x, its, launches = pb.model_solve(prob, "cg", 256)
    ps.Checker(prob).cg("model", x)
    assert abs(its - float64_cg_iterations(prob)) <= max(3, its // 20), (its, float64_cg_iterations(prob))
    assert launches == 1
    for per_launch in (1, 5, its):
        x_k, its_k, launches_k = pb.model_solve(prob, "cg", per_launch)
        assert its_k == its and launches_k == -(-max(its, 1) // per_launch) and np.array_equal(x_k, x)


class FakeKernel:
    def __init__(self, source, name):
        self.run = {"jacobi_block": pb.jacobi_block_model, "cg_block": pb.cg_block_model}[name]

    def __getitem__(self, launch):
        assert launch == (1, pb.THREADS)
        return self.run


@pytest.fixture
def numpy_jaxgraph(monkeypatch):
    captured, calls = Captured(), []

    def graphed(step, sample):
        captured.next = 0
        return types.SimpleNamespace(static_outputs=step(*[np.copy(a) for a in sample]), sample=sample, step=step)

    def graphed_loop(g, steps, feed=None, until=None, **kw):
        calls.append((g, steps, feed, until, kw))
        return types.SimpleNamespace(graphed=g, steps=steps, check_every=kw.get("check_every", 1))

    monkeypatch.setattr(pb, "jaxgraph", types.SimpleNamespace(Kernel=FakeKernel, empty=captured.empty,
                                                              make_graphed_callables=graphed,
                                                              graphed_loop=graphed_loop))
    return captured, calls


def run_loop(captured, loop, state):
    """The device loop in Python: clear the flag, run steps on the inputs in place, read the flag every
    ``check_every`` steps; (outputs, steps run)."""
    loop.graphed.static_outputs[-1][0] = 0
    for steps in range(1, loop.steps + 1):
        captured.next = 0
        out = loop.graphed.step(*state)
        if out[-1][0] and steps % loop.check_every == 0:
            return out, steps
    return out, loop.steps


@pytest.mark.parametrize("per_launch, check_every", [(1, 1), (9, 1), (9, 4), (300, 8)])
def test_the_steps_run_in_place_until_the_flag(numpy_jaxgraph, per_launch, check_every):
    captured, calls = numpy_jaxgraph
    prob = ps.Problem(20, 1e-3, np.random.default_rng())
    kernels = pb.BlockKernels(prob, per_launch)
    graphed, loop = kernels.jacobi_loop(10**5, check_every)
    g, steps, feed, until, kw = calls[-1]
    assert until is graphed.static_outputs[-1] and until.dtype == np.int32 and feed is None
    assert steps == -(-10**5 // per_launch) and kw == ({"check_every": check_every} if check_every > 1 else {})
    u = np.full((20, 20), np.nan, f32)
    u[...] = 0  # the caller's zeros
    (u_out, count, flag), ran = run_loop(captured, loop, [u, prob.f.copy(), np.zeros(1, np.int32)])
    want_u, want_sweeps, launches = pb.model_solve(prob, "jacobi", per_launch)
    assert u_out is u and int(count[0]) == want_sweeps and flag[0] == 1
    np.testing.assert_array_equal(u, want_u)
    assert ran == -(-launches // check_every) * check_every  # the every-K stop: no-op launches after the flag

    graphed, loop = kernels.cg_loop(10**4, check_every)
    g, steps, feed, until, kw = calls[-1]
    assert until is graphed.static_outputs[-1] and feed is None and steps == -(-10**4 // per_launch)
    assert [a.shape for a in g.sample] == [(20, 20), (1,), (20, 20), (20, 20), (20, 20), (20, 20), (20, 20), (4,)]
    state = [np.full((20, 20), np.nan, f32), np.zeros(1, np.int32), prob.b.copy()] + \
        [np.full((20, 20), np.nan, f32) for _ in range(4)] + [np.full(4, np.nan, f32)]  # poisoned: count 0 starts
    out, ran = run_loop(captured, loop, state)
    want_x, want_its, launches = pb.model_solve(prob, "cg", per_launch)
    assert int(out[1][0]) == want_its and out[-1][0] == 1
    np.testing.assert_array_equal(out[0], want_x)
    ps.Checker(prob).cg("steps", out[0])


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="up to 64 x 64, got 65 x 65"):
        pb.BlockKernels(ps.Problem(65, 1e-3, np.random.default_rng()))
    with pytest.raises(ValueError, match="per_launch must be >= 1, got 0"):
        pb.BlockKernels(ps.Problem(8, 1e-3, np.random.default_rng()), 0)
    assert pb.fits(64) and not pb.fits(65) and not pb.fits(0)


# ----------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("n, per_launch", [(12, 5), (37, 64), (64, 256)])
def test_block_jacobi_on_the_gpu_is_the_model(n, per_launch):
    import jax.numpy as jnp

    prob = ps.Problem(n, 1e-3, np.random.default_rng())
    check = ps.Checker(prob)
    want_u, want_sweeps, _ = pb.model_solve(prob, "jacobi", per_launch)
    kernels = pb.BlockKernels(prob, per_launch)
    graphed, loop = kernels.jacobi_loop(10**5)
    f = jnp.asarray(prob.f)
    u, sweeps = (np.asarray(a) for a in pb.jacobi_in_jit(loop)(f))
    check.jacobi("single block, in jit", u, int(sweeps), 10**5)
    assert int(sweeps) == want_sweeps, (int(sweeps), want_sweeps)
    np.testing.assert_array_equal(u, want_u)  # = numpy_jacobi(prob, sweeps), bit for bit
    graphed.static_inputs[0].fill_(np.nan)  # poisoned: the eager run must start from zeros and write u
    graphed.static_inputs[2].fill_(-5)
    u_e, s_e = pb.jacobi_eager(graphed, loop, prob)()
    assert int(s_e.numpy()[0]) == want_sweeps
    np.testing.assert_array_equal(u_e.numpy(), want_u)
    _, every = kernels.jacobi_loop(10**5, check_every=4)
    u_k, s_k = (np.asarray(a) for a in pb.jacobi_in_jit(every)(f))
    assert int(s_k) == want_sweeps
    np.testing.assert_array_equal(u_k, want_u)
    u_x, s_x = (np.asarray(a) for a in kernels.xla_jacobi(10**5)(f))  # the kernel via jax_call, no graph
    assert int(s_x) == want_sweeps
    np.testing.assert_array_equal(u_x, want_u)


@pytest.mark.gpu
@pytest.mark.parametrize("n, per_launch", [(9, 4), (33, 16), (64, 256)])
def test_block_cg_on_the_gpu_is_the_model(n, per_launch):
    import jax.numpy as jnp

    prob = ps.Problem(n, 1e-5, np.random.default_rng())
    check = ps.Checker(prob)
    want_x, want_its, _ = pb.model_solve(prob, "cg", per_launch)
    kernels = pb.BlockKernels(prob, per_launch)
    graphed, loop = kernels.cg_loop(10**4)
    b = jnp.asarray(prob.b)
    x, its = (np.asarray(a) for a in pb.cg_in_jit(loop)(b))
    check.cg("single block, in jit", x)
    assert int(its) == want_its, (int(its), want_its)
    np.testing.assert_array_equal(x, want_x)
    for a in graphed.static_inputs:  # poisoned: the eager run starts from count 0 and b alone
        if a.dtype == np.float32:
            a.fill_(np.nan)
    x_e, its_e = pb.cg_eager(graphed, loop, prob)()
    assert int(its_e.numpy()[0]) == want_its
    np.testing.assert_array_equal(x_e.numpy(), want_x)
    _, every = kernels.cg_loop(10**4, check_every=4)
    x_k, its_k = (np.asarray(a) for a in pb.cg_in_jit(every)(b))
    assert int(its_k) == want_its
    np.testing.assert_array_equal(x_k, want_x)
    x_x, its_x = (np.asarray(a) for a in kernels.xla_cg(10**4)(b))  # the kernel via jax_call, no graph
    assert int(its_x) == want_its
    np.testing.assert_array_equal(x_x, want_x)
