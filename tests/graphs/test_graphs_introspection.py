"""Looking inside captured graphs: raw handles with cuda.bindings, get_graph_data, debug_dump.

The template jaxgraph keeps for replays inside jit (``jaxgraph.diagnostics.graph_template``)
outlives `keep_graph=False`.
"""

import numpy as np
import pytest

import jaxgraph
from jaxgraph import diagnostics
from support.graph_helpers import BLOCK, blocks, load_kernels, poison

N = 2048


@pytest.fixture(scope="module")
def k():
    return load_kernels()


@pytest.fixture
def driver():
    from cuda.bindings import driver

    return driver


def _ok(result):
    err = result[0]
    assert err == 0, err
    return result[1] if len(result) == 2 else result[1:]


def _capture_chain(k, x, y, t, z, keep_graph=True):
    """memset y -> t = 2x -> y = t + x -> z = y (copy): a linear chain of four nodes."""
    g = jaxgraph.CUDAGraph(keep_graph=keep_graph)
    with jaxgraph.graph(g):
        y.fill_(np.float32(0))
        k.scale[blocks(N), BLOCK](t, x, 2.0, N)
        k.add[blocks(N), BLOCK](y, t, x, N)
        z.copy_(y)
    return g


@pytest.fixture
def arrays(rng):
    data = rng.standard_normal(N, dtype=np.float32)
    return data, jaxgraph.asarray(data), jaxgraph.empty(N), jaxgraph.empty(N), jaxgraph.empty(N)


# ---------------------------------------------------------------------------
# Raw handles
# ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_raw_handles_work_with_cuda_bindings(k, arrays, driver):
    data, x, y, t, z = arrays
    g = _capture_chain(k, x, y, t, z)
    template = driver.CUgraph(g.raw_cuda_graph())
    nodes, count = _ok(driver.cuGraphGetNodes(template, 0))
    assert count == 4
    g.instantiate()
    h_exec = driver.CUgraphExec(g.raw_cuda_graph_exec())
    flags = _ok(driver.cuGraphExecGetFlags(h_exec))
    # Instantiated with AUTO_FREE_ON_LAUNCH | USE_NODE_PRIORITY, as torch; the driver
    # (580, CUDA 13.0) reports only AUTO_FREE_ON_LAUNCH back.
    assert int(flags) & 1 == 1
    # Launch the exec ourselves, on our own stream.
    s = jaxgraph.Stream()
    poison(z)
    jaxgraph.synchronize()
    _ok(driver.cuGraphLaunch(h_exec, s.handle))
    s.synchronize()
    np.testing.assert_allclose(z.numpy(), 3.0 * data, rtol=1e-6)


@pytest.mark.gpu
def test_private_template_stays_usable_after_keep_graph_false(k, arrays, driver):
    _data, x, y, t, z = arrays
    g = _capture_chain(k, x, y, t, z, keep_graph=False)
    template = driver.CUgraph(diagnostics.graph_template(g))
    _nodes, count = _ok(driver.cuGraphGetNodes(template, 0))
    assert count == 4
    with pytest.raises(RuntimeError, match="cudaGraph_t is not live: with keep_graph=False"):
        g.raw_cuda_graph()
    g.reset()
    with pytest.raises(RuntimeError, match="holds no captured graph"):
        diagnostics.graph_template(g)


# ---------------------------------------------------------------------------
# get_graph_data
# ---------------------------------------------------------------------------


def _check_schema(data):
    assert set(data) >= {"exec_graph_id", "nodes", "edges"}
    assert isinstance(data["exec_graph_id"], int)
    assert data["ids"] in ("driver", "jaxgraph")
    keys = {"index", "node_type", "tools_id", "graph_id", "node_id", "kernel_name", "dependencies",
            "dependents", "grid", "block"}
    node_ids = set()
    for i, node in enumerate(data["nodes"]):
        assert set(node) == keys
        assert node["index"] == i
        assert node["graph_id"] == data["exec_graph_id"]
        assert node["tools_id"] == (data["exec_graph_id"] << 32) | node["node_id"]
        node_ids.add(node["node_id"])
        if node["node_type"] != "kernel":
            assert node["kernel_name"] is None and node["grid"] is None and node["block"] is None
    assert len(node_ids) == len(data["nodes"])
    edges = sorted((a, b) for a, b in data["edges"])
    from_nodes = sorted((d, n["index"]) for n in data["nodes"] for d in n["dependencies"])
    to_nodes = sorted((n["index"], d) for n in data["nodes"] for d in n["dependents"])
    assert edges == from_nodes == to_nodes


def _chain(data):
    """Node indices of a linear graph, from its root."""
    roots = [n["index"] for n in data["nodes"] if not n["dependencies"]]
    assert len(roots) == 1
    order = [roots[0]]
    while data["nodes"][order[-1]]["dependents"]:
        (nxt,) = data["nodes"][order[-1]]["dependents"]
        order.append(nxt)
    return order


@pytest.mark.gpu
def test_get_graph_data_of_a_chain(k, arrays, driver):
    _data, x, y, t, z = arrays
    g = _capture_chain(k, x, y, t, z)
    g.instantiate()
    data = g.get_graph_data()
    _check_schema(data)
    order = _chain(data)
    assert len(order) == 4
    nodes = [data["nodes"][i] for i in order]
    assert [n["node_type"] for n in nodes] == ["memset", "kernel", "kernel", "memcpy"]
    assert [n["kernel_name"] for n in nodes] == [None, "scale", "add", None]
    for n in nodes[1:3]:
        assert n["grid"] == [blocks(N), 1, 1] and n["block"] == [BLOCK, 1, 1]
    if data["ids"] == "driver":
        exec_id = _ok(driver.cuGraphExecGetId(driver.CUgraphExec(g.raw_cuda_graph_exec())))
        assert data["exec_graph_id"] == int(exec_id)
    # A new exec graph gets a new id.
    g.instantiate()
    assert g.get_graph_data()["exec_graph_id"] != data["exec_graph_id"]


@pytest.mark.gpu
def test_get_graph_data_shows_true_dependencies_of_a_fork_join(k, rng):
    data = rng.standard_normal(N, dtype=np.float32)
    x = jaxgraph.asarray(data)
    a, b, c, d = (jaxgraph.empty(N) for _ in range(4))
    side = jaxgraph.Stream()
    forked, joined = jaxgraph.Event(), jaxgraph.Event()
    g = jaxgraph.CUDAGraph(keep_graph=True)
    with jaxgraph.graph(g):
        main = jaxgraph.current_stream()
        k.scale[blocks(N), BLOCK](a, x, 2.0, N)              # a = 2x
        forked.record(main)
        side.wait_event(forked)
        k.scale[blocks(N), BLOCK, 0, side](b, a, 3.0, N)     # b = 6x, on the side stream
        k.scale[blocks(N), BLOCK](c, a, 5.0, N)              # c = 10x, concurrently
        joined.record(side)
        main.wait_event(joined)
        k.add[blocks(N), BLOCK](d, b, c, N)                  # d = 16x
    g.instantiate()
    info = g.get_graph_data()
    _check_schema(info)
    nodes = info["nodes"]
    assert [n["node_type"] for n in nodes] == ["kernel"] * 4
    root = [n for n in nodes if not n["dependencies"]]
    sink = [n for n in nodes if not n["dependents"]]
    assert len(root) == 1 and len(sink) == 1
    assert root[0]["kernel_name"] == "scale" and sink[0]["kernel_name"] == "add"
    middle = [n for n in nodes if n is not root[0] and n is not sink[0]]
    for n in middle:
        assert n["dependencies"] == [root[0]["index"]] and n["dependents"] == [sink[0]["index"]]
    assert sorted(sink[0]["dependencies"]) == sorted(n["index"] for n in middle)
    assert len(info["edges"]) == 4
    poison(d)
    g.replay()
    np.testing.assert_allclose(d.numpy(), 16.0 * data, rtol=1e-5)


@pytest.mark.gpu
def test_get_graph_data_from_a_post_instantiate_hook_with_keep_graph_false(k, arrays):
    _data, x, y, t, z = arrays
    seen = []
    g = jaxgraph.CUDAGraph()
    g.register_post_instantiate_hook(lambda graph: seen.append(graph.get_graph_data()))
    with jaxgraph.graph(g):
        k.scale[blocks(N), BLOCK](t, x, 2.0, N)
    assert len(seen) == 1 and [n["kernel_name"] for n in seen[0]["nodes"]] == ["scale"]
    with pytest.raises(RuntimeError, match="not live"):
        g.get_graph_data()


# ---------------------------------------------------------------------------
# debug_dump
# ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("verbose", [True, False])
def test_debug_dump_writes_graphviz(k, arrays, tmp_path, verbose):
    _data, x, y, t, z = arrays
    g = _capture_chain(k, x, y, t, z)
    path = tmp_path / "graph.dot"
    g.debug_dump(str(path), verbose=verbose)
    text = path.read_text()
    assert "digraph" in text
    assert "scale" in text and "add" in text


@pytest.mark.gpu
def test_debug_dump_from_a_capture_end_hook_and_with_debug_mode(k, arrays, tmp_path):
    _data, x, y, t, z = arrays
    g = jaxgraph.CUDAGraph()
    hook_path = tmp_path / "hook.dot"
    g.register_capture_end_hook(lambda graph: graph.debug_dump(hook_path))
    with jaxgraph.graph(g):
        k.scale[blocks(N), BLOCK](t, x, 2.0, N)
    assert "digraph" in hook_path.read_text()
    with pytest.raises(RuntimeError, match="not live"):
        g.debug_dump(tmp_path / "late.dot")

    acc = jaxgraph.Graph()
    acc.enable_debug_mode()
    s = jaxgraph.Stream()
    with s, acc:
        k.scale[blocks(N), BLOCK](t, x, 2.0, N)
    acc.debug_dump(tmp_path / "acc.dot")
    assert "scale" in (tmp_path / "acc.dot").read_text()
    acc.replay()
