"""Branches inside a capture (CUDA conditional nodes: IF, IF/ELSE, SWITCH) on the GPU, and their errors.

Every graph is replayed several times with the predicate changed between
replays from the host, and every result is checked against numpy on fresh
random inputs, with outputs poisoned (NaN) first. Loops (WHILE), nesting and
embedding are in test_conditional_loops.py.
"""

import numpy as np
import pytest

import jaxgraph
from support.conditional_helpers import capture_api_kernels, device, set_value
from support.graph_helpers import blocks, poison

pytestmark = pytest.mark.gpu

N = 1000


@pytest.fixture(scope="module")
def k():
    return capture_api_kernels()


# ----------------------------------------------------------------------------
# IF, IF/ELSE, SWITCH
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.bool_, np.int32])
def test_if_runs_only_where_the_predicate_holds(k, rng, dtype):
    x = device(rng.standard_normal(N), np.float32)
    y = jaxgraph.empty(N)
    pred = device([1], dtype)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        with jaxgraph.if_then(pred):
            k.axpb[blocks(N), 256](y, x, np.float32(3.0), np.float32(1.0), N)
    values = [1, 0, 1, 1, 0] if dtype is np.bool_ else [7, 0, -2, 1, 0]
    for value in values:
        set_value(pred, value)
        poison(y)
        g.replay()
        got = y.numpy()
        if value:
            np.testing.assert_allclose(got, 3 * x.numpy() + 1, rtol=1e-6, atol=1e-6)  # FMA
        else:
            assert np.isnan(got).all(), f"IF body ran with predicate {value}"


def test_if_else_takes_each_branch(k, rng):
    x = device(rng.standard_normal(N), np.float32)
    y = jaxgraph.empty(N)
    pred = device([True], np.bool_)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        with jaxgraph.if_else(pred) as branch:
            with branch.then:
                k.scale[blocks(N), 256](y, x, np.float32(2.0), N)
            with branch.otherwise:
                k.axpb[blocks(N), 256](y, x, np.float32(-1.0), np.float32(0.5), N)
    for value in (True, False, False, True):
        set_value(pred, value)
        poison(y)
        g.replay()
        want = 2 * x.numpy() if value else 0.5 - x.numpy()
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)


def test_if_else_with_pytorch_names(k, rng):
    x = device(rng.standard_normal(N), np.float32)
    y = jaxgraph.empty(N)
    pred = device([0], np.int32)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        g.begin_capture_to_if_else_node(pred)
        k.scale[blocks(N), 256](y, x, np.float32(4.0), N)
        g.begin_capture_to_next_conditional_body()
        k.scale[blocks(N), 256](y, x, np.float32(-3.0), N)
        g.end_capture_to_conditional_node()
        k.axpb[blocks(N), 256](y, y, np.float32(1.0), np.float32(1.0), N)  # after the node, always
    for value in (0, 5, 0):
        set_value(pred, value)
        poison(y)
        g.replay()
        np.testing.assert_allclose(y.numpy(), (4.0 if value else -3.0) * x.numpy() + 1, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("api", ["context", "pytorch"])
def test_switch_runs_the_indexed_case(k, rng, api):
    x = device(rng.standard_normal(N), np.float32)
    y = jaxgraph.empty(N)
    index = device([0], np.int32)
    factors = (2.0, -1.0, 0.25)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        if api == "context":
            with jaxgraph.switch(index, 3) as cases:
                for i in (0, 2):  # case 1 left out: it does nothing
                    with cases[i]:
                        k.scale[blocks(N), 256](y, x, np.float32(factors[i]), N)
        else:
            g.begin_capture_to_switch_node(index, 3)
            for i in range(3):
                if i:
                    g.begin_capture_to_next_conditional_body()
                if i != 1:
                    k.scale[blocks(N), 256](y, x, np.float32(factors[i]), N)
            g.end_capture_to_conditional_node()
    for value in (2, 0, 1, 3, -1, 0):
        set_value(index, value)
        poison(y)
        g.replay()
        got = y.numpy()
        if value in (0, 2):
            np.testing.assert_allclose(got, factors[value] * x.numpy(), rtol=1e-6)
        else:
            assert np.isnan(got).all(), f"a SWITCH case ran for index {value}"


# ----------------------------------------------------------------------------
# Introspection and errors on the device
# ----------------------------------------------------------------------------


def test_regions_show_in_summary_dot_and_graph_data(k, rng):
    x = device(rng.standard_normal(N), np.float32)
    y = jaxgraph.empty(N)
    remaining, counter, flag = device([2], np.int32), device([0], np.int32), device([True], np.bool_)
    g = jaxgraph.CUDAGraph(keep_graph=True)
    with jaxgraph.graph(g):
        with jaxgraph.while_loop(remaining):
            k.count_down[1, 1](remaining, counter)
            with jaxgraph.if_then(flag):
                k.scale[blocks(N), 256](y, x, np.float32(2.0), N)
    g.instantiate()
    print(g)
    data = g.get_graph_data()
    loops = [n for n in data["nodes"] if n["node_type"] == "conditional"]
    assert len(loops) == 1 and loops[0]["conditional"]["kind"] == "WHILE"
    body = loops[0]["conditional"]["bodies"][0]["nodes"]
    ifs = [n for n in body if n["node_type"] == "conditional"]
    assert len(ifs) == 1 and ifs[0]["conditional"]["kind"] == "IF"
    inner = ifs[0]["conditional"]["bodies"][0]["nodes"]
    assert [n["kernel_name"] for n in inner] == ["scale"]
    assert "WHILE" in str(g) and "IF" in str(g)
    dot = g.to_dot()
    assert "cluster_" in dot and "WHILE body" in dot and "IF body" in dot
    assert g.node_count() == g.node_count(nested=False) + len(body) + len(inner)
    g.replay()
    np.testing.assert_allclose(y.numpy(), 2 * x.numpy(), rtol=1e-6)
    assert counter.numpy()[0] == 2


def test_a_region_left_open_discards_the_capture(k):
    pred = device([1], np.int32)
    out, x = device([-1.0], np.float32), device([2.0], np.float32)
    g = jaxgraph.CUDAGraph()
    before = jaxgraph.current_stream()
    with pytest.raises(RuntimeError, match="WHILE region opened by begin_capture_to_while_node .* still open"):
        with jaxgraph.graph(g):
            g.begin_capture_to_while_node(pred)
    assert jaxgraph.current_stream() == before
    assert not jaxgraph.is_current_stream_capturing()
    with jaxgraph.graph(g):      # the graph captures again
        k.scale[1, 1](out, x, np.float32(3.0), 1)
    g.replay()
    assert out.numpy()[0] == 6.0


def test_an_exception_inside_a_region_discards_cleanly(k):
    pred = device([1], np.int32)
    g = jaxgraph.CUDAGraph()
    before = jaxgraph.current_stream()
    with pytest.raises(KeyError):
        with jaxgraph.graph(g):
            with jaxgraph.while_loop(pred):
                with jaxgraph.if_then(pred):
                    raise KeyError("boom")
    assert jaxgraph.current_stream() == before
    assert not jaxgraph.is_current_stream_capturing()
    g2 = jaxgraph.CUDAGraph()
    with pytest.raises(RuntimeError, match="ValueError raised inside the IF region"):
        with jaxgraph.graph(g2):
            try:
                with jaxgraph.if_then(pred):
                    raise ValueError("caught inside the capture")
            except ValueError:
                pass
    assert not jaxgraph.is_current_stream_capturing()


def test_region_state_errors(k):
    pred, two, flag = device([1], np.int32), device([1, 1], np.int32), device([True], np.bool_)
    counter = device([0], np.int32)
    g = jaxgraph.CUDAGraph()
    with jaxgraph.graph(g):
        with pytest.raises(RuntimeError, match="no conditional region is open"):
            g.end_capture_to_conditional_node()
        g.begin_capture_to_if_node(pred)
        with pytest.raises(RuntimeError, match="has 1 body and its last"):
            g.begin_capture_to_next_conditional_body()
        g.end_capture_to_conditional_node()
        with pytest.raises(ValueError, match="exactly one element"):
            g.begin_capture_to_if_node(two)
        with pytest.raises(TypeError, match="int32"):
            g.begin_capture_to_switch_node(flag, 2)
        capture_stream = jaxgraph.current_stream()
        with jaxgraph.while_loop(pred):
            with jaxgraph.stream(capture_stream):   # not the loop's body stream
                with pytest.raises(RuntimeError, match="does not capture into the WHILE region"):
                    with jaxgraph.if_then(pred):
                        pass
            k.count_down[1, 1](pred, counter)
    g.replay()     # IF with an empty body, then a loop that runs once
    assert counter.numpy()[0] == 1 and pred.numpy()[0] == 0
    with pytest.raises(RuntimeError, match="no jaxgraph capture is underway"):
        with jaxgraph.while_loop(pred):
            pass
