"""Seeing a graph: summaries, DOT text and rendering (CPU, on made-up node lists), then real graphs (GPU).

Neither Graphviz's ``dot`` nor the ``graphviz`` package is installed on CI or
the GPU machine, so the tests check the DOT text itself and the error that
names what to install; the one test that draws an SVG skips without ``dot``.

Tests internals (listed in tests/README.md): ``_graphs.inspect_render``; summaries and DOT text of made-up
node lists, with no graph behind them.
"""

import shutil

import numpy as np
import pytest

import jaxgraph
from jaxgraph._graphs import inspect_render as _views
from support.kernel_sources import AXPY
from support.graph_helpers import BLOCK, blocks, load_kernels


def node(index, kind, name=None, grid=None, block=None):
    return {"index": index, "node_type": kind, "kernel_name": name, "grid": grid, "block": block}


# memset -> axpy -> (scale, scale) -> memcpy: a diamond of five nodes.
DATA = {
    "nodes": [
        node(0, "memset"),
        node(1, "kernel", "_Z4axpyIfEvPT_PKS0_S0_i", [16, 1, 1], [256, 1, 1]),
        node(2, "kernel", "scale", [8, 8, 1], [16, 16, 1]),
        node(3, "kernel", "scale", [8, 8, 1], [16, 16, 1]),
        node(4, "memcpy"),
        node(5, "kernel", "void at::native::vectorized_elementwise_kernel<4, " + "x" * 300 + ">", [1, 1, 1],
             [128, 1, 1]),
    ],
    "edges": [[0, 1], [1, 2], [1, 3], [2, 4], [3, 4], [4, 5]],
}
NAMES = {"_Z4axpyIfEvPT_PKS0_S0_i": "axpy<float>"}.get


class FakePool:
    def __init__(self, pool_id, reserved, free):
        self.pool_id, self.reserved_bytes, self.free_bytes = pool_id, reserved, free

    def token(self):
        return (0, self.pool_id)


# ---------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------


def test_dot_labels_kernels_with_name_grid_block_and_draws_every_dependency():
    dot = _views.to_dot(DATA, 'my "step"', lambda s: NAMES(s, s))
    assert dot.startswith("digraph jaxgraph {") and dot.rstrip().endswith("}")
    assert 'label="my \\"step\\""' in dot  # quotes in the title are escaped
    assert 'n1 [label="#1 axpy<float>\\ngrid 16, block 256"' in dot
    assert 'n2 [label="#2 scale\\ngrid 8x8, block 16x16"' in dot
    assert 'n0 [label="#0 memset"' in dot and 'n4 [label="#4 memcpy"' in dot
    long_name = "void at::native::vectorized_elementwise_kernel<4, " + "x" * 19 + "..."
    assert f'n5 [label="#5 {long_name}\\ngrid 1, block 128"' in dot  # library template names are cut
    for a, b in DATA["edges"]:
        assert f"  n{a} -> n{b};" in dot
    assert dot.count("->") == len(DATA["edges"])


def test_summary_counts_nodes_kernels_dependencies_and_memory():
    pools = [FakePool(3, 4 << 20, 1 << 20), FakePool(5, 1536, 0)]
    text = _views.summary_text("CUDAGraph on device 0 (ended)", DATA, pools, 2, lambda s: NAMES(s, s))
    lines = text.splitlines()
    assert lines[0] == "CUDAGraph on device 0 (ended)"
    assert lines[1] == "  6 nodes (4 kernel, 1 memset, 1 memcpy), 6 dependencies, longest chain 5 nodes"
    pad = " " * 61  # names are padded to the longest shown, 72 characters
    assert f"    1 x axpy<float>{pad}  grid 16, block 256" in text
    assert f"    2 x scale{pad + ' ' * 6}  grid 8x8, block 16x16" in text
    assert "    1 x void at::native::vectorized_elementwise_kernel<4, xxxxxxxxxxxxxxxxxxx...  grid 1, block 128" in text
    assert "memory: its pool (0, 3) holds 4.0 MiB (1.0 MiB free for later captures into it)" in text
    assert "memory: an input's pool (0, 5) holds 1.5 KiB (0 B free" in text
    assert lines[-1] == "  keeps 2 external input arrays alive"
    assert _views.summary_text("g", None) == "g: nothing captured"


@pytest.mark.parametrize("count, edges, longest", [
    (0, [], 0), (1, [], 1), (3, [], 1), (4, [[0, 1], [1, 2], [2, 3]], 4),
    (5, [[3, 1], [1, 0], [4, 0]], 3),  # dependencies need not follow creation order
])
def test_longest_chain(count, edges, longest):
    assert _views.longest_chain(count, edges) == longest


def test_render_to_dot_needs_no_graphviz(tmp_path):
    dot = _views.to_dot(DATA)
    path = _views.render_dot(dot, tmp_path / "g.dot")
    assert path.read_text() == dot
    assert _views.render_dot(dot, tmp_path / "g.txt", format="gv").read_text() == dot


def test_render_without_graphviz_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match=r"drawing a svg needs Graphviz's `dot` program, which is not "
                                           r"installed here .*apt-get install graphviz.*render\('graph.dot'\)"):
        _views.render_dot(_views.to_dot(DATA), tmp_path / "g.svg")
    assert not (tmp_path / "g.svg").exists()


def test_render_needs_a_format(tmp_path):
    with pytest.raises(ValueError, match="say format= or give the path a suffix"):
        _views.render_dot("digraph {}", tmp_path / "graph")


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot program is not installed")
def test_render_svg_with_graphviz(tmp_path):
    path = _views.render_dot(_views.to_dot(DATA, "five nodes", lambda s: NAMES(s, s)), tmp_path / "g.svg")
    svg = path.read_text()
    assert "<svg" in svg and "axpy&lt;float&gt;" in svg


def test_an_uncaptured_graph_summarizes_without_a_device():
    g = jaxgraph.CUDAGraph()
    assert str(g) == g.summary()
    assert g.summary().endswith("(not started, keep_graph=False): nothing captured")
    with pytest.raises(RuntimeError, match="to_dot: nothing has been captured yet"):
        g.to_dot()


# ---------------------------------------------------------------------------
# GPU: real graphs
# ---------------------------------------------------------------------------

N = 3000


@pytest.mark.gpu
@pytest.mark.parametrize("keep_graph", [False, True])
def test_summary_and_dot_of_a_captured_graph(tmp_path, rng, keep_graph):
    k = load_kernels()
    axpy = jaxgraph.Kernel(AXPY, "axpy<float>")
    axpy.handle  # noqa: B018 - load before capture
    x = jaxgraph.asarray(rng.standard_normal(N).astype(np.float32))
    y, t = jaxgraph.empty(N), jaxgraph.empty(N)
    g = jaxgraph.CUDAGraph(keep_graph=keep_graph)
    with jaxgraph.graph(g):
        y.fill_(np.float32(0))
        k.scale[blocks(N), BLOCK](t, x, 2.0, N)
        for _ in range(3):
            axpy[blocks(N), BLOCK](y, t, np.float32(0.5), N)
        scratch = jaxgraph.empty(1 << 20)  # from the graph's pool
        k.scale[blocks(N), BLOCK](scratch, y, 1.0, N)
    text = g.summary()
    assert str(g) == text
    assert f"({'ended' if keep_graph else 'ended, instantiated'}, keep_graph={keep_graph})" in text.splitlines()[0]
    assert "6 nodes (5 kernel, 1 memset), 5 dependencies, longest chain 6 nodes" in text
    assert f"3 x axpy<float>  grid {blocks(N)}, block {BLOCK}" in text  # the name given, not _Z4axpy...
    assert f"2 x scale        grid {blocks(N)}, block {BLOCK}" in text
    assert "memory: its pool" in text and "holds 4.0 MiB" in text
    assert "keeps 3 external input arrays alive" in text  # x, y, t
    dot = g.to_dot()
    assert dot.count("->") == 5 and dot.count("axpy<float>") == 3
    assert f'"#1 scale\\ngrid {blocks(N)}, block {BLOCK}"' in dot
    assert g.render(tmp_path / "g.dot").read_text() == dot
    g.replay()
    np.testing.assert_allclose(y.numpy(), 3.0 * x.numpy(), rtol=1e-6)


@pytest.mark.gpu
def test_graphed_callable_summary_names_both_graphs(rng):
    k = load_kernels()

    def forward(x):
        y = jaxgraph.empty(x.shape)
        k.scale[blocks(N), BLOCK](y, x, 2.0, N)
        return y

    def backward(x, y, g):
        gx = jaxgraph.empty(x.shape)
        k.scale[blocks(N), BLOCK](gx, g, 2.0, N)
        return gx

    graphed = jaxgraph.make_graphed_callables(forward, (rng.standard_normal(N).astype(np.float32),),
                                              backward=backward)
    text = graphed.summary()
    assert text.startswith("graphed forward: (float32[3000]) -> (float32[3000])")
    assert "\nforward: CUDAGraph on device" in text and "\nbackward: CUDAGraph on device" in text
    assert text.count(f"1 x scale  grid {blocks(N)}, block {BLOCK}") == 2
