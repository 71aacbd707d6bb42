"""The typed native replay boundary and the uncaptured target, on the CPU.

Binding modes and replay paths cross from ``ffi/replay/replay.cc`` as codes (never
sentences); a replayable of a graph with conditional nodes lowers to
``jaxgraph_replay_uncaptured``, which XLA keeps out of its command buffers.
Lowering needs no device: the replayables here are built from a spec.

Tests internals (listed in tests/README.md): ``_jax_interop.replay_boundary.binding_from_row``,
``paths_from_codes``, ``internals.spec_replayable``, ``ReplaySpec``; the typed native boundary itself
(the native code and counter tables through ``jaxgraph.diagnostics.native_module("replay")``).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
from jaxgraph import BindingMode, BufferBinding, ReplayPath, Replayable
from jaxgraph import diagnostics
from support.internals import ReplaySpec, spec_replayable


def f32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def lowered(f, *args) -> str:
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def calls_to(text: str, target: str) -> list[str]:
    return [line for line in text.splitlines() if f"stablehlo.custom_call @{target}(" in line]


def spec_step(uncaptured: bool, graph_id: int = 5) -> Replayable:
    return spec_replayable((f32(256),), (f32(256),), graph_id, uncaptured=uncaptured)


# ---------------------------------------------------------------------------
# Codes: the extension's table and the Python enums agree
# ---------------------------------------------------------------------------


def test_native_codes_name_every_binding_mode_and_replay_path():
    codes = diagnostics.native_module("replay").codes()
    assert {BindingMode(name) for name in codes["binding"]} == set(BindingMode)
    native_paths = {ReplayPath(name) for name in codes["path"]}
    assert native_paths == set(ReplayPath) - {ReplayPath.HOST_CALLBACK}  # the host path never reaches C++
    assert len(set(codes["binding"].values())) == 4 and len(set(codes["path"].values())) == 4


def test_each_native_replay_path_has_its_own_counter():
    counters = diagnostics.native_module("replay").counters()
    for path in set(ReplayPath) - {ReplayPath.HOST_CALLBACK}:
        assert counters[path.value] >= 0
    assert "splice" not in counters  # the lumped counter is gone: tests name the path
    assert {"instantiate", "rebind", "copy", "to_copy", "handler_calls", "handler_ns"} <= set(counters)


def test_capture_policies_cross_as_codes_and_bad_ones_are_refused():
    from jaxgraph.diagnostics import CapturePolicy, set_capture_policy

    codes = diagnostics.native_module("replay").codes()["capture"]
    assert set(codes) == {p.value for p in CapturePolicy} and len(set(codes.values())) == 4
    previous = set_capture_policy("whole")
    try:
        assert previous is CapturePolicy.BIND  # the default
        assert set_capture_policy(CapturePolicy.AUTO) is CapturePolicy.WHOLE
        with pytest.raises(ValueError, match="'sometimes' is not a valid CapturePolicy"):
            set_capture_policy("sometimes")
        with pytest.raises(ValueError, match="capture policy must be a code"):
            diagnostics.native_module("replay").set_capture_policy(7)
    finally:
        set_capture_policy(previous)
    assert set_capture_policy(previous) is CapturePolicy.BIND


def test_binding_rows_are_typed_and_read_as_before():
    from jaxgraph._jax_interop.replay_boundary import binding_from_row

    codes = diagnostics.native_module("replay").codes()["binding"]
    bound = binding_from_row(("output", 0, codes["bound"], 3, ""))
    unused = binding_from_row(("input", 1, codes["unused"], 0, "no kernel argument points at it"))
    assert bound.mode is BindingMode.BOUND and bound.mode == "bound"  # a str enum: old comparisons hold
    assert str(bound) == "output 0 bound (3 sites)"
    assert unused.mode is BindingMode.UNUSED and str(unused) == "input 1 unused (no kernel argument points at it)"
    assert isinstance(bound, BufferBinding)
    by_cost = binding_from_row(("output", 0, codes["copied_by_cost"], 2000, "copying it ~2.5 us per call: copied"))
    assert by_cost.mode is BindingMode.COPIED_BY_COST and by_cost.sites == 2000
    assert str(by_cost) == "output 0 copied_by_cost (copying it ~2.5 us per call: copied)"


def test_unknown_code_is_an_error_not_a_guess():
    from jaxgraph._jax_interop.replay_boundary import paths_from_codes

    assert paths_from_codes([3]) == (ReplayPath.UNCAPTURED_LAUNCH,)
    with pytest.raises(KeyError):
        paths_from_codes([99])


# ---------------------------------------------------------------------------
# Lowering: conditional graphs go to the uncaptured target
# ---------------------------------------------------------------------------


def test_conditional_graph_lowers_to_the_uncaptured_target_only():
    step = spec_step(uncaptured=True, graph_id=5)
    text = lowered(lambda x: step(x * 2.0) + 1.0, f32(256))
    (line,) = calls_to(text, "jaxgraph_replay_uncaptured")
    assert not calls_to(text, "jaxgraph_replay")
    assert re.search(r"call = \d+ : i64, graph = 5 : i64", line)
    assert "has_side_effect = true" not in line
    body = text[text.index("func.func public @main"):]
    assert body.index("stablehlo.multiply") < body.index("@jaxgraph_replay_uncaptured") < body.index("stablehlo.add")


def test_plain_graph_lowers_to_the_command_buffer_target():
    text = lowered(spec_step(uncaptured=False), f32(256))
    assert len(calls_to(text, "jaxgraph_replay")) == 1 and not calls_to(text, "jaxgraph_replay_uncaptured")


def test_uncaptured_target_inside_loops_and_vmap():
    step = spec_step(uncaptured=True)
    loop = lowered(lambda x: jax.lax.fori_loop(0, 10, lambda i, v: step(v), x), f32(256))
    assert "stablehlo.while" in loop and len(calls_to(loop, "jaxgraph_replay_uncaptured")) == 1
    batched = lowered(jax.vmap(step), f32(3, 256))
    assert len(calls_to(batched, "jaxgraph_replay_uncaptured")) == 1


def test_uncaptured_target_fails_clearly_on_jax_cpu():
    step = spec_step(uncaptured=True)
    cpu = jax.devices("cpu")[0]  # JAX's CPU backend even where a GPU is present
    x = jax.device_put(np.random.default_rng(0).random(256).astype(np.float32), cpu)
    with pytest.raises(Exception, match="jaxgraph_replay .*runs on JAX's CUDA backend"):
        jax.block_until_ready(jax.jit(step)(x))


def test_spec_names_its_target():
    assert ReplaySpec((f32(4),), (f32(4),)).target == "jaxgraph_replay"
    assert ReplaySpec((f32(4),), (f32(4),), uncaptured=True).target == "jaxgraph_replay_uncaptured"


# ---------------------------------------------------------------------------
# The replayable's contract
# ---------------------------------------------------------------------------


def test_callback_replayable_names_its_path():
    step = spec_replayable((f32(4),), (f32(4),), via="callback", host=lambda x: x)
    assert step.replay_paths == (ReplayPath.HOST_CALLBACK,)
    assert "paths=host_callback" in repr(step)


def test_trust_foreign_kernels_with_bind_copy_is_an_argument_error():
    with pytest.raises(ValueError, match="trust_foreign_kernels=True binds buffers, but bind='copy'"):
        jaxgraph.replayable(jaxgraph.CUDAGraph(), [], [], bind="copy", trust_foreign_kernels=True)


def test_replay_path_values_are_the_counter_names():
    assert [p.value for p in ReplayPath] == ["launch", "splice_nodes", "splice_whole", "uncaptured_launch",
                                             "host_callback"]
    assert str(ReplayPath.SPLICE_NODES) == "splice_nodes"


# ---------------------------------------------------------------------------
# Stubs and the test kernels
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["launch", "replay", "device_loop"])
def test_stubs_declare_every_function_the_extension_exports(name):
    import pathlib

    extension = diagnostics.native_module(name)
    stub = (pathlib.Path(jaxgraph.__file__).parent / f"_{name}.pyi").read_text()
    exported = {n for n in dir(extension) if not n.startswith("_") and callable(getattr(extension, n))}
    assert set(re.findall(r"^def (\w+)\(", stub, re.M)) == exported


def test_conditional_test_kernels_compile_to_cubin_without_cuda_headers(tmp_path):
    """The kernels the GPU tests capture call cudaGraphSetConditional and need no header (the
    runtime wheel's cuda_device_runtime_api.h lacks its crt/ includes on the GPU machine)."""
    from support import conditional_helpers as cs

    for name in cs.NAMES:
        kernel = jaxgraph.Kernel(cs.KERNELS, name, arch="sm_90", options={"include_path": []}, cache_dir=tmp_path)
        assert kernel._compiled.cubin[:4] == b"\x7fELF"
