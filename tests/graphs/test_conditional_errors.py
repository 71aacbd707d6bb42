"""Conditional regions: what needs no device (NVRTC, argument checks, version checks, views).

The set-conditional kernel must compile with the toolkit hidden as ``.ci/run``
hides it, and with no CUDA headers at all (NVIDIA's runtime wheel lacks the
``crt/`` headers that ``<cuda_device_runtime_api.h>`` needs). Tests of internals (the version
check, made-up device arrays and node lists) say so in their names.

Tests internals (listed in tests/README.md): ``_kernels.compile``, ``_graphs.conditional_predicates``, ``_graphs.inspect_render``,
``_graphs.inspect_nodes``; the set-conditional kernel compiled with the toolkit hidden, version checks
with NVRTC's version patched, views of made-up node data.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import jaxgraph
from jaxgraph._graphs import inspect_render as _views, conditional_predicates as _predicates
from support.graph_helpers import null_array


def fake_array(shape=(1,), dtype=np.int32):
    """A DeviceArray at address 0 (never launched): enough for checks that need no device."""
    return null_array(shape, dtype)


# ----------------------------------------------------------------------------
# NVRTC, with the toolkit hidden
# ----------------------------------------------------------------------------


def test_set_conditional_kernel_compiles_to_a_cubin_without_cuda_headers(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if "cuda" not in p)
    script = f"""
from jaxgraph._kernels import compile as _compile
from jaxgraph._graphs import conditional_predicates as _predicates
for dtype in ("int32", "bool"):
    name = _predicates.setter_name(dtype)
    for options in (None, {{"include_path": []}}):   # jaxgraph's defaults, and no include directory at all
        c = _compile.compile_kernel(_predicates.SET_CONDITIONAL_SOURCE, name, options, arch="sm_90",
                                    cache_dir={str(tmp_path)!r})
        assert c.cubin[:4] == b"\\x7fELF" and c.lowered_name == name and not c.cache_hit, c
    print(name, len(c.cubin), "bytes")
"""
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "jaxgraph_set_conditional_int32" in done.stdout and "jaxgraph_set_conditional_bool" in done.stdout


def _ptx(source, options):
    from cuda.bindings import nvrtc

    err, program = nvrtc.nvrtcCreateProgram(source.encode(), b"set_conditional.cu", 0, [], [])
    options = [o.encode() for o in options]
    (err,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
    size = nvrtc.nvrtcGetProgramLogSize(program)[1]
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(program, log)
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, log.decode()
    size = nvrtc.nvrtcGetPTXSize(program)[1]
    ptx = b" " * size
    nvrtc.nvrtcGetPTX(program, ptx)
    return [line for line in ptx.decode().splitlines() if not line.startswith("//")]


def test_declared_builtin_gives_the_same_ptx_as_the_cuda_header():
    from jaxgraph._kernels.compile import _cuda_include_dir

    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    candidates = [_cuda_include_dir(), os.path.join(home, "include")]
    include = next((d for d in candidates if d and os.path.isfile(os.path.join(d, "crt", "host_defines.h"))), None)
    if include is None:
        pytest.skip("no CUDA headers with crt/host_defines.h here to compare with")
    kernels = "// Sets a conditional" + _predicates.SET_CONDITIONAL_SOURCE.split("// Sets a conditional", 1)[1]
    with_header = "#include <cuda_device_runtime_api.h>\n" + kernels
    ours = _ptx(_predicates.SET_CONDITIONAL_SOURCE, ["-arch=sm_90"])
    assert ours == _ptx(with_header, ["-arch=sm_90", f"-I{include}"])
    assert any("cudaGraphSetConditional" in line for line in ours)


# ----------------------------------------------------------------------------
# Arguments, checked before the driver
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("value, error, message", [
    (np.array([1], np.int32), TypeError, "host data"),
    (True, TypeError, "host data"),
    ([1], TypeError, "host data"),
    (object(), TypeError, "device array"),
    (fake_array((2,)), ValueError, "exactly one element"),
    (fake_array((1,), np.float32), TypeError, "bool or int32 array, got float32"),
    (fake_array((1,), np.int64), TypeError, "got int64"),
])
def test_predicates_must_be_one_bool_or_int32_on_the_device(value, error, message):
    with pytest.raises(error, match=message):
        jaxgraph.if_then(value)
    with pytest.raises(error, match=message):
        jaxgraph.while_loop(value)
    with pytest.raises(error, match=message):
        jaxgraph.CUDAGraph().begin_capture_to_if_else_node(value)


def test_switch_takes_an_int32_index_and_a_case_count():
    with pytest.raises(TypeError, match="jaxgraph.switch: index must be an int32 array, got bool"):
        jaxgraph.switch(fake_array((1,), np.bool_), 2)
    with pytest.raises(ValueError, match="num_cases must be at least 1"):
        jaxgraph.switch(fake_array(), 0)
    with pytest.raises(TypeError, match="num_cases must be an int"):
        jaxgraph.CUDAGraph().begin_capture_to_switch_node(fake_array(), 2.0)


def test_regions_outside_a_capture_are_refused():
    g = jaxgraph.CUDAGraph()
    for call in (lambda: g.begin_capture_to_if_node(fake_array((1,), np.bool_)),
                 lambda: g.begin_capture_to_while_node(fake_array()),
                 lambda: g.begin_capture_to_switch_node(fake_array(), 3),
                 g.begin_capture_to_next_conditional_body,
                 g.end_capture_to_conditional_node):
        with pytest.raises(RuntimeError, match="no capture is underway"):
            call()
    with pytest.raises(RuntimeError, match=r"no jaxgraph capture is underway .* inside `with jaxgraph.graph\(g\):`"):
        with jaxgraph.if_then(fake_array()):
            pass


# ----------------------------------------------------------------------------
# Driver and NVRTC versions (internal check, driven with made-up versions)
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind, too_old, enough, need", [
    ("if", 12030, 12040, "12.4"), ("while", 12020, 12060, "12.4"),
    ("if_else", 12060, 12080, "12.8"), ("switch", 12040, 13000, "12.8"),
])
def test_internal_version_check_names_the_cuda_each_region_needs(monkeypatch, kind, too_old, enough, need):
    monkeypatch.setattr("jaxgraph._kernels.compile.nvrtc_version", lambda: (13, 0))
    monkeypatch.setattr(_predicates, "driver_version", lambda: too_old)
    label = _predicates.KINDS[kind].label
    have = f"{too_old // 1000}.{too_old % 1000 // 10}"
    with pytest.raises(RuntimeError, match=rf"{label} regions need a CUDA {need} driver .* supports CUDA {have}"):
        _predicates.check_support(kind)
    monkeypatch.setattr(_predicates, "driver_version", lambda: enough)
    _predicates.check_support(kind)
    monkeypatch.setattr("jaxgraph._kernels.compile.nvrtc_version", lambda: (12, 2))
    with pytest.raises(RuntimeError, match=rf"need NVRTC {need} or newer .* NVRTC is 12.2"):
        _predicates.check_support(kind)


# ----------------------------------------------------------------------------
# Views of regions (made-up node lists, as _introspect.graph_data gives them)
# ----------------------------------------------------------------------------


def _node(i, kind="kernel", deps=(), **extra):
    node = {"index": i, "node_type": kind, "kernel_name": f"k{i}" if kind == "kernel" else None,
            "grid": [4, 1, 1], "block": [256, 1, 1], "dependencies": list(deps), "dependents": []}
    node.update(extra)
    return node


def _body(*nodes):
    return {"nodes": list(nodes), "edges": [[n["dependencies"][0], n["index"]] for n in nodes if n["dependencies"]]}


def made_up_graph():
    inner_if = {"kind": "IF", "bodies": [_body(_node(0))]}
    loop_body = _body(_node(0), _node(1, deps=[0]), _node(2, "conditional", deps=[1], conditional=inner_if))
    return {"nodes": [_node(0), _node(1, "conditional", deps=[0], conditional={"kind": "WHILE", "bodies": [loop_body]}),
                      _node(2, "conditional", deps=[1],
                            conditional={"kind": "IF", "bodies": [_body(_node(0)), _body()]}),
                      _node(3, "conditional", deps=[2],
                            conditional={"kind": "SWITCH", "bodies": [_body(_node(0)), _body(), _body(_node(0))]})],
            "edges": [[0, 1], [1, 2], [2, 3]]}


def test_summary_lists_regions_nested():
    text = _views.summary_text("G", made_up_graph())
    lines = text.splitlines()
    assert "  4 nodes (3 conditional, 1 kernel), 3 dependencies, longest chain 4 nodes" in lines
    assert "    #1 WHILE: body 3 nodes (2 kernel, 1 conditional)" in lines
    assert "      #2 IF: body 1 node (1 kernel)" in lines
    assert "    #2 IF/ELSE: then 1 node (1 kernel); else 0 nodes" in lines
    assert "    #3 SWITCH of 3 cases: case 0 1 node (1 kernel); case 1 0 nodes; case 2 1 node (1 kernel)" in lines
    assert any(line.strip() == "6 x k0  grid 4, block 256" for line in lines)  # kernels at every depth


def test_dot_draws_each_body_as_a_cluster():
    dot = _views.to_dot(made_up_graph())
    for cluster in ("cluster_n1_b0", "cluster_n1_b0_n2_b0", "cluster_n2_b0", "cluster_n2_b1", "cluster_n3_b2"):
        assert f"subgraph {cluster} {{" in dot
    assert 'label="WHILE body"' in dot and 'label="IF/ELSE else"' in dot and 'label="SWITCH case 1"' in dot
    assert "n1 -> n1_b0_n0 [style=dashed];" in dot and "n1_b0_n0 -> n1_b0_n1;" in dot
    assert 'n2_b1_n0 [label="(empty)"' in dot
    assert dot.count("{") == dot.count("}")


def test_nested_node_count_counts_every_body():
    from jaxgraph._graphs.inspect_nodes import nested_node_count

    assert nested_node_count(made_up_graph()) == 4 + 3 + 1 + 1 + 2
