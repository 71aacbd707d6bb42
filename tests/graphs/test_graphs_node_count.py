"""``CUDAGraph.node_count``: how many nodes a capture recorded, and the generator protocol graphs accept."""

import types

import numpy as np
import pytest

import jaxgraph
from support.graph_helpers import BLOCK, blocks, load_kernels, poison

N = 2048


# ---------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("nested", [True, False])
@pytest.mark.parametrize("make", [jaxgraph.CUDAGraph, jaxgraph.Graph])
def test_node_count_before_capture_says_to_capture_first(make, nested):
    with pytest.raises(RuntimeError, match="node_count: nothing has been captured yet"):
        make().node_count(nested=nested)


class StateOnTheDevice:
    """Not a jaxgraph.Generator, but it has the hooks a graph needs of one."""

    device = 0
    state = None

    def get_state(self):
        return np.zeros(2, np.uint64)

    def set_state(self, state):
        return self


def test_register_generator_state_takes_any_object_with_the_generator_hooks():
    g = jaxgraph.CUDAGraph()
    gen = StateOnTheDevice()
    g.register_generator_state(gen)
    g.register_generator_state(gen)  # once is enough
    with pytest.raises(TypeError, match="expects a jaxgraph.Generator, got SimpleNamespace"):
        g.register_generator_state(types.SimpleNamespace(device=0, state=None))  # no get_state/set_state


# ---------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def k():
    return load_kernels()


@pytest.mark.gpu
@pytest.mark.parametrize("keep_graph", [False, True])
@pytest.mark.parametrize("launches", [1, 7])
def test_node_count_counts_what_the_capture_recorded(k, rng, keep_graph, launches):
    x = jaxgraph.asarray(rng.standard_normal(N).astype(np.float32))
    y, z = jaxgraph.empty(N), jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph(keep_graph=keep_graph)
    with jaxgraph.graph(g):
        y.fill_(np.float32(0))                         # a memset node
        for _ in range(launches):                      # a chain of kernel nodes: y = 2 y + x
            k.axpb[blocks(N), BLOCK](y, y, 2.0, 0.0, N)
            k.add[blocks(N), BLOCK](y, y, x, N)
        z.copy_(y)                                     # a memcpy node
    expected = 1 + 2 * launches + 1
    assert g.node_count() == expected
    assert g.node_count(nested=False) == expected      # no conditional bodies
    if keep_graph:
        g.instantiate()
        assert len(g.get_graph_data()["nodes"]) == expected
    poison(z)
    g.replay()
    want = np.zeros(N, np.float32)
    xv = jaxgraph.to_host(x)
    for _ in range(launches):
        want = 2 * want + xv
    np.testing.assert_allclose(jaxgraph.to_host(z), want, rtol=1e-5, atol=1e-5)
    g.reset()
    with pytest.raises(RuntimeError, match="node_count: nothing has been captured yet"):
        g.node_count()


@pytest.mark.gpu
def test_node_count_of_an_empty_capture_is_zero():
    g = jaxgraph.CUDAGraph()
    with pytest.warns(UserWarning, match="The CUDA Graph is empty"):
        with jaxgraph.graph(g):
            pass
    assert g.node_count() == 0 and g.node_count(nested=False) == 0


@pytest.mark.gpu
def test_a_generator_registers_through_the_protocol(k):
    gen = jaxgraph.Generator(seed=5)
    noise = jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph()
    g.register_generator_state(gen)
    with jaxgraph.graph(g):
        gen.uniform(noise)                             # a draw kernel and the offset's advance
    assert g.node_count() == 2
    first = (g.replay(), jaxgraph.to_host(noise))[1]
    second = (g.replay(), jaxgraph.to_host(noise))[1]
    assert 0.0 <= first.min() and first.max() < 1.0 and not np.array_equal(first, second)


@pytest.mark.gpu
def test_an_accelerator_graph_counts_its_nodes(k, rng, side_stream):
    x = jaxgraph.asarray(rng.standard_normal(N).astype(np.float32))
    y = jaxgraph.empty(N)
    g = jaxgraph.Graph()
    with side_stream, g:
        k.add[blocks(N), BLOCK](y, x, x, N)
    assert g.node_count() == 1 and g.node_count(nested=False) == 1
    poison(y)
    g.replay()                                         # on the current stream, as CUDAGraph.replay
    np.testing.assert_allclose(jaxgraph.to_host(y), 2 * jaxgraph.to_host(x), rtol=1e-6)
