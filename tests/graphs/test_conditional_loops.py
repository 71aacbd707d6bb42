"""Loops inside a capture (CUDA WHILE nodes), nesting and embedding, on the GPU.

Every graph is replayed several times with the trip count or predicate
changed between replays from the host, and every result is checked against
numpy on fresh random inputs, with outputs poisoned (NaN) first.
"""

import numpy as np
import pytest

import jaxgraph
from support.conditional_helpers import capture_api_kernels, device, set_value
from support.graph_helpers import blocks, poison, ref_uniform

pytestmark = pytest.mark.gpu

N = 1000


@pytest.fixture(scope="module")
def k():
    return capture_api_kernels()


# ----------------------------------------------------------------------------
# WHILE, nesting, embedding
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["context", "pytorch"])
def test_while_runs_as_many_trips_as_the_device_says(k, rng, api):
    x = device(rng.standard_normal(N), np.float32)
    y = jaxgraph.empty(N)
    remaining, counter = device([0], np.int32), device([-5], np.int32)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):     # y = x; while remaining: y += 1; counter += 1; remaining -= 1
        y.copy_(x)
        counter.fill_(0)
        if api == "context":
            with jaxgraph.while_loop(remaining):
                k.add_inplace[blocks(N), 256](y, np.float32(1.0), N)
                k.count_down[1, 1](remaining, counter)
        else:
            g.begin_capture_to_while_node(remaining)
            k.add_inplace[blocks(N), 256](y, np.float32(1.0), N)
            k.count_down[1, 1](remaining, counter)
            g.end_capture_to_conditional_node()
    for trips in (5, 0, 1, int(rng.integers(20, 60))):
        set_value(remaining, trips)
        poison(y)
        g.replay()
        assert counter.numpy()[0] == trips
        assert remaining.numpy()[0] == 0
        np.testing.assert_allclose(y.numpy(), x.numpy() + trips, rtol=1e-5, atol=1e-5)


def test_if_inside_while(k, rng):
    x = device(rng.standard_normal(N), np.float32)
    y = jaxgraph.empty(N)
    remaining, counter = device([0], np.int32), device([0], np.int32)
    even = device([False], np.bool_)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        y.copy_(x)
        counter.fill_(0)
        with jaxgraph.while_loop(remaining):
            k.count_down[1, 1](remaining, counter)
            k.is_even[1, 1](even, remaining)
            with jaxgraph.if_then(even):
                k.add_inplace[blocks(N), 256](y, np.float32(1.0), N)
    for trips in (7, 4, 0):
        set_value(remaining, trips)
        poison(y)
        g.replay()
        taken = sum(1 for r in range(trips - 1, -1, -1) if r % 2 == 0)
        assert counter.numpy()[0] == trips
        np.testing.assert_allclose(y.numpy(), x.numpy() + taken, rtol=1e-5, atol=1e-5)


def test_while_inside_while(k, rng):
    x = device(rng.standard_normal(N), np.float32)
    y = jaxgraph.empty(N)
    outer, inner = device([0], np.int32), device([0], np.int32)
    outer_count, inner_count = device([0], np.int32), device([0], np.int32)
    inner_trips = int(rng.integers(2, 6))
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        y.copy_(x)
        outer_count.fill_(0)
        inner_count.fill_(0)
        with jaxgraph.while_loop(outer):
            inner.fill_(np.int32(inner_trips))  # a memset node in the outer body
            with jaxgraph.while_loop(inner):
                k.add_inplace[blocks(N), 256](y, np.float32(0.5), N)
                k.count_down[1, 1](inner, inner_count)
            k.count_down[1, 1](outer, outer_count)
    for trips in (3, 0, 6):
        set_value(outer, trips)
        poison(y)
        g.replay()
        assert outer_count.numpy()[0] == trips
        assert inner_count.numpy()[0] == trips * inner_trips
        np.testing.assert_allclose(y.numpy(), x.numpy() + 0.5 * trips * inner_trips, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("unroll", [1, 4])
def test_captured_step_embedded_in_a_while_body(k, rng, unroll):
    x = device(rng.standard_normal(N), np.float32)
    y = jaxgraph.empty(N)
    step = jaxgraph.CUDAGraph()
    with jaxgraph.graph(step):
        k.axpb[blocks(N), 256](y, y, np.float32(1.0), np.float32(0.25), N)   # y += 0.25
    remaining, counter = device([0], np.int32), device([0], np.int32)
    loop = jaxgraph.CUDAGraph()
    with jaxgraph.graph(loop):
        y.copy_(x)
        counter.fill_(0)
        with jaxgraph.while_loop(remaining):
            for _ in range(unroll):
                step.replay()   # embeds the step: a child-graph node
            k.count_down[1, 1](remaining, counter)
    assert loop.node_count(nested=False) == 4   # copy, memset, set-condition kernel, WHILE
    assert loop.node_count() == 4 + unroll + 2  # body: the steps, count_down, the re-test kernel
    for trips in (3, 0, 10):
        set_value(remaining, trips)
        poison(y)
        loop.replay()
        assert counter.numpy()[0] == trips
        np.testing.assert_allclose(y.numpy(), x.numpy() + 0.25 * unroll * trips, rtol=1e-5, atol=1e-5)
    y.copy_(x)
    step.replay()    # the step itself still replays on its own
    np.testing.assert_allclose(y.numpy(), x.numpy() + 0.25, rtol=1e-6, atol=1e-6)


def test_embedding_a_graph_with_a_loop_works_or_says_why_not(k, rng):
    x = device(rng.standard_normal(N), np.float32)
    y = jaxgraph.empty(N)
    inner, inner_count = device([0], np.int32), device([0], np.int32)
    step = jaxgraph.CUDAGraph()
    with jaxgraph.graph(step):          # a step that itself loops: inner_trips times y += 1
        inner.fill_(np.int32(3))
        with jaxgraph.while_loop(inner):
            k.add_inplace[blocks(N), 256](y, np.float32(1.0), N)
            k.count_down[1, 1](inner, inner_count)
    outer = jaxgraph.CUDAGraph()
    try:
        with jaxgraph.graph(outer):
            y.copy_(x)
            step.replay()
            step.replay()
    except RuntimeError as exc:         # CUDA refuses conditional nodes in child graphs
        assert "has conditional nodes, which CUDA does not allow in a child graph" in str(exc)
        print("embedding a graph with a WHILE node:", exc)
        assert not jaxgraph.is_current_stream_capturing()
        return
    print("embedding a graph with a WHILE node: accepted by this driver")
    inner_count.fill_(0)
    poison(y)
    outer.replay()
    assert inner_count.numpy()[0] == 6
    np.testing.assert_allclose(y.numpy(), x.numpy() + 6, rtol=1e-5, atol=1e-5)


def test_generator_in_a_while_body_matches_eager_draws(k, rng):
    seed, n, trips = int(rng.integers(0, 2**63)), 513, 6
    gen = jaxgraph.Generator(seed)
    tmp = jaxgraph.empty(n)
    history = jaxgraph.empty(2 * trips * n)
    remaining, row = device([0], np.int32), device([0], np.int32)
    g = jaxgraph.CUDAGraph()
    g.register_generator_state(gen)
    with jaxgraph.graph(g):
        with jaxgraph.while_loop(remaining):
            gen.uniform(tmp)
            k.store_row[blocks(n), 256](history, tmp, row, n)
            k.count_down[1, 1](remaining, row)     # row counts up, remaining down
    poison(history)
    for _ in range(2):          # the second replay continues the sequence
        set_value(remaining, trips)
        g.replay()
    got = history.numpy().reshape(2 * trips, n)
    assert gen.get_offset() == 2 * trips
    eager = jaxgraph.Generator(seed)
    out = jaxgraph.empty(n)
    for draw in range(2 * trips):
        np.testing.assert_array_equal(got[draw], eager.uniform(out).numpy())
        np.testing.assert_array_equal(got[draw], ref_uniform(seed, draw, n))
    assert len({got[i].tobytes() for i in range(2 * trips)}) == 2 * trips


def test_allocation_inside_a_body_comes_from_the_pool_and_is_not_reused_early(k, rng):
    x = device(rng.standard_normal(N), np.float32)
    y = jaxgraph.empty(N)
    remaining, counter = device([0], np.int32), device([0], np.int32)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        y.copy_(x)
        with jaxgraph.while_loop(remaining):
            t = jaxgraph.empty(N)                         # from the graph's pool: no memory node
            k.axpb[blocks(N), 256](t, y, np.float32(2.0), np.float32(1.0), N)
            y.copy_(t)
            freed = t.ptr
            del t
            u = jaxgraph.empty(N)
            assert u.ptr != freed, "a block freed inside a loop body was reused while the loop can still run"
            k.scale[blocks(N), 256](u, y, np.float32(1.0), N)
            k.count_down[1, 1](remaining, counter)
    for trips in (1, 4):
        set_value(remaining, trips)
        poison(y)
        g.replay()
        want = x.numpy().astype(np.float64)
        for _ in range(trips):
            want = 2 * want + 1
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)
    assert "mem_alloc" not in g.summary()
