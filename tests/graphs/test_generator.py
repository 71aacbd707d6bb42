"""jaxgraph.Generator: Philox-4x32-10 on the device, eager and across graph replays.

Tests internals (listed in tests/README.md): ``_graphs.generator._KERNELS_SOURCE``; the generator's own
CUDA source compiles to a cubin on a CPU.
"""

import gc
import weakref

import numpy as np
import pytest

import jaxgraph
from support.kernel_sources import MY_NOISE
from support.graph_helpers import philox4x32_10, poison, ref_normal, ref_uniform

N = 1001  # not a multiple of 4: the last Philox block is partly used


def _seed(rng):
    return int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2))  # any 64-bit value


# ---------------------------------------------------------------------------
# CPU: the reference and the CUDA source
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("ctr, key, expected", [
    # Known-answer vectors of Random123's philox4x32_10.
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_numpy_reference_matches_known_answers(ctr, key, expected):
    assert tuple(int(v) for v in philox4x32_10(ctr, key)[0]) == expected


def test_reference_uniform_is_in_unit_interval_and_exact_in_float32():
    u = ref_uniform(12345, 3, 4096)
    assert u.dtype == np.float32 and u.min() >= 0.0 and u.max() < 1.0
    assert 0.45 < u.mean() < 0.55


def test_draw_kernels_and_header_compile_without_a_device(tmp_path):
    from jaxgraph._graphs.generator import _KERNELS_SOURCE

    for name in ("jaxgraph_philox_fill_uniform", "jaxgraph_philox_fill_normal", "jaxgraph_philox_advance"):
        kernel = jaxgraph.Kernel(_KERNELS_SOURCE, name, arch="sm_90", cache_dir=tmp_path)
        assert kernel.cubin.startswith(b"\x7fELF")
    user = jaxgraph.Kernel(jaxgraph.Generator.CUDA_HEADER + MY_NOISE, "my_noise", arch="sm_90",
                           cache_dir=tmp_path)
    assert [p.name for p in user.params] == ["out", "state", "n"]


# ---------------------------------------------------------------------------
# GPU: values against the reference
# ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_uniform_matches_the_reference_exactly(rng):
    seed = _seed(rng)
    gen = jaxgraph.Generator(seed=seed)
    out = jaxgraph.empty(N)
    for offset in range(3):
        poison(out)
        gen.uniform(out)
        np.testing.assert_array_equal(out.numpy(), ref_uniform(seed, offset, N))
    assert gen.get_offset() == 3
    assert gen.initial_seed() == seed


@pytest.mark.gpu
def test_uniform_range_and_normal_values(rng):
    seed = _seed(rng)
    gen = jaxgraph.Generator(seed=seed)
    out = jaxgraph.empty(N)
    gen.uniform(out, -2.0, 3.0)
    got = out.numpy()
    assert got.min() >= -2.0 and got.max() < 3.0
    np.testing.assert_allclose(got, -2.0 + 5.0 * ref_uniform(seed, 0, N), rtol=1e-6, atol=1e-6)
    gen.normal(out)
    np.testing.assert_allclose(out.numpy(), ref_normal(seed, 1, N), rtol=1e-5, atol=1e-5)
    gen.normal(out, 10.0, 0.5)
    np.testing.assert_allclose(out.numpy(), 10.0 + 0.5 * ref_normal(seed, 2, N), rtol=1e-5, atol=1e-5)
    big = jaxgraph.empty(1 << 20)
    gen.normal(big)
    values = big.numpy()
    assert abs(values.mean()) < 0.01 and abs(values.std() - 1.0) < 0.01


@pytest.mark.gpu
def test_seeding_offsets_and_state_round_trip(rng):
    gen = jaxgraph.Generator(seed=1)
    out = jaxgraph.empty(N)
    seed = _seed(rng)
    assert gen.manual_seed(seed) is gen
    gen.uniform(out)
    first = out.numpy()
    state = gen.get_state()
    assert state.dtype == np.uint64 and list(state) == [seed, 1]
    gen.uniform(out)
    gen.set_state(state)
    assert gen.get_offset() == 1
    gen.manual_seed(seed)
    gen.uniform(out)
    np.testing.assert_array_equal(out.numpy(), first)
    gen.set_offset(7)
    gen.uniform(out)
    np.testing.assert_array_equal(out.numpy(), ref_uniform(seed, 7, N))
    new_seed = gen.seed()
    assert gen.initial_seed() == new_seed and gen.get_offset() == 0


@pytest.mark.gpu
def test_user_kernel_with_the_header_draws_the_same_numbers(rng):
    seed = _seed(rng)
    gen = jaxgraph.Generator(seed=seed)
    mine = jaxgraph.Kernel(jaxgraph.Generator.CUDA_HEADER + MY_NOISE, "my_noise")
    ours = jaxgraph.empty(N)
    theirs = jaxgraph.empty(N)
    mine[(N + 255) // 256, 256](ours, gen.state, N)
    gen.advance()
    assert gen.get_offset() == 1
    gen.set_offset(0)
    gen.uniform(theirs)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


# ---------------------------------------------------------------------------
# GPU: graphs
# ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("draw", ["uniform", "normal"])
def test_replays_reproduce_the_eager_sequence(rng, draw):
    seed = _seed(rng)
    replays = 5
    eager_gen = jaxgraph.Generator(seed=seed)
    out = jaxgraph.empty(N)
    eager = []
    for _ in range(replays):
        getattr(eager_gen, draw)(out)
        eager.append(out.numpy())

    gen = jaxgraph.Generator(seed=seed)
    static = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    g.register_generator_state(gen)
    with jaxgraph.graph(g):
        getattr(gen, draw)(static)
    assert gen.get_offset() == 0              # capturing draws nothing
    got = []
    for _ in range(replays):
        poison(static)
        g.replay()
        got.append(static.numpy())
    for a, b in zip(eager, got):
        np.testing.assert_array_equal(a, b)
    for i in range(replays - 1):
        assert not np.array_equal(got[i], got[i + 1])   # fresh numbers each replay
    assert gen.get_offset() == replays
    getattr(gen, draw)(out)                               # eager draws continue the sequence
    reference = ref_uniform if draw == "uniform" else ref_normal
    np.testing.assert_allclose(out.numpy(), reference(seed, replays, N), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_two_graphs_share_one_generator(rng):
    seed = _seed(rng)
    gen = jaxgraph.Generator(seed=seed)
    a, b = jaxgraph.empty(N), jaxgraph.empty(N)
    g1, g2 = jaxgraph.CUDAGraph(), jaxgraph.CUDAGraph()
    for g, out in ((g1, a), (g2, b)):
        g.register_generator_state(gen)
        with jaxgraph.graph(g):
            gen.uniform(out)
    g1.replay()
    np.testing.assert_array_equal(a.numpy(), ref_uniform(seed, 0, N))
    g2.replay()
    np.testing.assert_array_equal(b.numpy(), ref_uniform(seed, 1, N))
    g1.replay()
    np.testing.assert_array_equal(a.numpy(), ref_uniform(seed, 2, N))


@pytest.mark.gpu
def test_registered_generator_lives_as_long_as_the_graph(rng):
    gen = jaxgraph.Generator(seed=_seed(rng))
    out = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    g.register_generator_state(gen)
    g.register_generator_state(gen)                       # once is enough
    with jaxgraph.graph(g):
        gen.uniform(out)
    ref = weakref.ref(gen)
    del gen
    gc.collect()
    assert ref() is not None
    g.replay()
    del g
    gc.collect()
    assert ref() is None


@pytest.mark.gpu
def test_host_side_generator_calls_are_refused_during_capture(rng):
    gen = jaxgraph.Generator(seed=_seed(rng))
    g = jaxgraph.CUDAGraph()
    for call in (lambda: gen.manual_seed(1), gen.get_offset, lambda: gen.set_offset(2), gen.get_state,
                 lambda: jaxgraph.Generator(seed=3)):
        with pytest.raises(RuntimeError, match="while the current stream is capturing"):
            with jaxgraph.graph(g):
                call()
    with pytest.raises(TypeError, match="float32"):
        gen.uniform(jaxgraph.empty(4, np.float64))
