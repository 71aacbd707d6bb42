"""JAX interop on the CPU: what the kernel and replay calls lower to, and trace-time errors.

``jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))`` lowers for CUDA
on a CPU-only jax, so these tests check the custom calls (targets, operand and
result types, attributes, aliasing) without a GPU.

Tests internals (listed in tests/README.md): ``internals.spec_replayable``, ``ReplaySpec``; replay
lowering without a graph. Kernel ids and the native replay table come from ``jaxgraph.diagnostics``
(the FFI targets' registration is tested in cuda/test_driver.py).
"""

import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgraph
from jaxgraph import diagnostics
from support.internals import ReplaySpec, spec_replayable
from support.kernel_sources import COPY_BYTES, SAXPY, SCALAR_TYPES, SUM_DIFF_INTERLEAVED
from conftest import enable_x64

ARCH = None if jaxgraph.device_count() else "sm_90"  # loading a kernel needs the device's arch


@pytest.fixture(scope="module")
def saxpy():
    return jaxgraph.Kernel(SAXPY, "saxpy", arch=ARCH)


@pytest.fixture(scope="module")
def sum_diff():
    return jaxgraph.Kernel(SUM_DIFF_INTERLEAVED, "sum_diff_interleaved", arch=ARCH)


def lower(f, *args, **jit_kwargs) -> str:
    return jax.jit(f, **jit_kwargs).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def custom_calls(text: str, target: str) -> list[str]:
    return [line for line in text.splitlines() if f"stablehlo.custom_call @{target}(" in line]


def attr(line: str, name: str) -> list[int]:
    """An integer attribute of a custom call line: ``name = 3 : i64`` or ``dense<...>``."""
    m = re.search(rf"\b{name} = (-?\d+) : i64", line)
    if m:
        return [int(m.group(1))]
    m = re.search(rf"\b{name} = dense<(\[[^\]]*\]|-?\d+|)> : tensor<(\d+)xi64>", line)
    assert m, f"no attribute {name} in {line}"
    body, size = m.group(1), int(m.group(2))
    if not body.startswith("["):  # a splat (all equal) or empty
        return [int(body)] * size if body else []
    return [int(v) for v in body.strip("[]").split(",")]


def f32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


# ---------------------------------------------------------------------------
# Kernel.jax_call
# ---------------------------------------------------------------------------


def test_kernel_call_lowers_to_one_launch_with_its_attributes(saxpy):
    n = 4099  # not a multiple of the block
    text = lower(lambda y, x: saxpy.jax_call(y, x, 2.5, n, inout=("y",)), f32(n), f32(n))
    (line,) = custom_calls(text, "jaxgraph_launch")
    assert f"(tensor<{n}xf32>, tensor<{n}xf32>) -> tensor<{n}xf32>" in line
    assert attr(line, "kernel") == [diagnostics.kernel_id(saxpy)]
    assert attr(line, "grid") == [17, 1, 1]          # ceil(4099 / 256)
    assert attr(line, "block") == [256, 1, 1]
    assert attr(line, "shared_mem") == [0]
    # y is result 0 (buffer 2 = after the two operands), x operand 1, then scalar words 0 and 1.
    assert attr(line, "params") == [2, 1, -1, -2]
    a_bits = int(np.frombuffer(np.float32(2.5).tobytes(), np.uint32)[0])
    assert attr(line, "scalars") == [a_bits, n]
    assert "output_operand_alias<output_tuple_indices = [], operand_index = 0" in line
    assert "jaxgraph_replay" not in text


def test_kernel_call_fresh_outputs_grid_block_and_result_order(sum_diff):
    n = 1000
    f = lambda a, b: sum_diff.jax_call(f32(n), a, f32(n), b, n, grid=(8, 1), block=(128,), shared_mem=64)
    text = lower(f, f32(n), f32(n))
    (line,) = custom_calls(text, "jaxgraph_launch")
    assert f"-> (tensor<{n}xf32>, tensor<{n}xf32>)" in line
    assert attr(line, "grid") == [8, 1, 1] and attr(line, "block") == [128, 1, 1]
    assert attr(line, "shared_mem") == [64]
    assert attr(line, "params") == [2, 0, 3, 1, -1]   # s = result 0, a, d = result 1, b, n
    assert "output_operand_alias" not in line
    out = jax.eval_shape(f, f32(n), f32(n))
    assert isinstance(out, tuple) and len(out) == 2


def test_donated_inout_argument_aliases_the_output(saxpy):
    n = 256
    text = lower(lambda y, x: saxpy.jax_call(y, x, 1.0, n, inout="y"), f32(n), f32(n), donate_argnums=0)
    assert "%arg0: tensor<256xf32> {tf.aliasing_output = 0 : i32}" in text


def test_scalars_are_little_endian_words_of_their_c_type():
    k = jaxgraph.Kernel(SCALAR_TYPES, "scalars", arch=ARCH)
    f = lambda: k.jax_call(jax.ShapeDtypeStruct((8,), np.float64), -3, 65535, -(2**40), 2**32 - 1,
                           1.5, -0.25, 0.5, True, grid=1, block=1)
    with enable_x64(True):
        (line,) = custom_calls(lower(f), "jaxgraph_launch")
    words = np.asarray(attr(line, "scalars"), np.int64).view(np.uint64)

    def word(value, dtype):
        return int(np.frombuffer(np.asarray(value, dtype).tobytes().ljust(8, b"\0"), np.uint64)[0])

    assert list(words) == [word(-3, np.int8), 65535, word(-(2**40), np.int64), 2**32 - 1,
                           word(1.5, np.float32), word(-0.25, np.float64), word(0.5, np.float16), 1]
    assert attr(line, "params") == [0, -1, -2, -3, -4, -5, -6, -7, -8]


def test_untyped_pointers_take_any_dtype():
    k = jaxgraph.Kernel(COPY_BYTES, "copy_bytes", arch=ARCH)
    f = lambda src: k.jax_call(jax.ShapeDtypeStruct((16,), jnp.int32), src, 64)
    (line,) = custom_calls(lower(f, jax.ShapeDtypeStruct((16,), jnp.int32)), "jaxgraph_launch")
    assert "(tensor<16xi32>) -> tensor<16xi32>" in line


def test_kernel_call_under_vmap_runs_sequentially(saxpy):
    f = jax.vmap(lambda y, x: saxpy.jax_call(y, x, 2.0, 64, inout=("y",)))
    text = lower(f, f32(5, 64), f32(5, 64))
    assert "stablehlo.while" in text
    (line,) = custom_calls(text, "jaxgraph_launch")
    assert "tensor<64xf32>" in line and "5x64" not in line


def test_kernel_ids_are_stable_per_kernel_and_distinct_between_kernels(saxpy, sum_diff):
    assert diagnostics.kernel_id(saxpy) == diagnostics.kernel_id(saxpy)
    assert diagnostics.kernel_id(saxpy) != diagnostics.kernel_id(sum_diff)
    assert diagnostics.kernel_id(saxpy) > 0


# Builds and traces kernels in the order given by argv, then lowers a jax_call of the one named last.
ID_ORDER = r'''
import hashlib, sys
import jax, jaxgraph
from jaxgraph import diagnostics
from support.kernel_sources import SAXPY, SUM_DIFF_INTERLEAVED
sources = {"saxpy": SAXPY, "sum_diff_interleaved": SUM_DIFF_INTERLEAVED}
kernels = {name: jaxgraph.Kernel(sources[name], name, arch="sm_90") for name in sys.argv[1:]}
ids = {name: diagnostics.kernel_id(k) for name, k in kernels.items()}
y = jax.ShapeDtypeStruct((8,), "float32")
f = jax.jit(lambda y, x: kernels["saxpy"].jax_call(y, x, 2.0, 8, inout=("y",)))
text = f.trace(y, y).lower(lowering_platforms=("cuda",)).as_text()
print("IDS", ids["saxpy"], ids["sum_diff_interleaved"], hashlib.sha256(text.encode()).hexdigest())
'''


def test_kernel_ids_depend_on_the_kernel_not_on_the_order_a_process_traced_kernels(tmp_path):
    # Every process of a multi-process program must lower the same HLO for the same function, whatever it
    # traced before (as replays' call attributes do): the id is what the kernel is (its code), not a count.
    tests = pathlib.Path(__file__).resolve().parents[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXGRAPH_CACHE_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]))
    seen = []
    for order in (["saxpy", "sum_diff_interleaved"], ["sum_diff_interleaved", "saxpy"]):
        done = subprocess.run([sys.executable, "-c", ID_ORDER, *order], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        (line,) = [line for line in done.stdout.splitlines() if line.startswith("IDS ")]
        seen.append(line.split()[1:])
    assert seen[0] == seen[1], seen                       # the same ids, the same lowered text
    assert seen[0][0] != seen[0][1]                        # and distinct kernels have distinct ids


def test_kernels_of_the_same_code_share_an_id(saxpy):
    again = jaxgraph.Kernel(SAXPY, "saxpy", arch=ARCH)
    assert again is not saxpy and diagnostics.kernel_id(again) == diagnostics.kernel_id(saxpy)
    other = jaxgraph.Kernel(SAXPY, "saxpy", {"use_fast_math": True}, arch=ARCH)   # other code, other id
    assert (other.cubin != saxpy.cubin) == (diagnostics.kernel_id(other) != diagnostics.kernel_id(saxpy))


@pytest.mark.parametrize("pair, message", [
    ((5, 0), "alias names input 5, which does not exist (the graph has 1 inputs)"),
    ((-1, 0), "alias names input -1, which does not exist"),
    ((0, 3), "alias names output 3, which does not exist (the graph has 1 outputs)"),
    ((0, -2), "alias names output -2, which does not exist"),
])
def test_graph_registration_checks_alias_indices_before_using_them(pair, message):
    # The native table renumbers aliased inputs through a table of one entry per input (drop_unreferenced):
    # an index out of range is refused first, before the graph, the device or CUDA is looked at.
    replay = diagnostics.native_module("replay")
    with pytest.raises(ValueError, match=re.escape(message)):
        replay.register_graph(0, 0, 0, [(0, 4)], [(0, 4)], [pair], {}, True, False, True, [], 0, [])


X = np.zeros(8, np.float32)        # an operand (a constant once traced)


# Argument errors shared with eager launches are in test_arguments.py; these are jax_call's own.
@pytest.mark.parametrize("args, kwargs, exc, match", [
    ((X, X, 1.0, 8), {"inout": ("a",)}, ValueError, "inout names 'a', which is not a pointer"),
    ((f32(8), X, 1.0, 8), {"inout": ("y",)}, TypeError, "parameter y is in inout="),
    ((f32(8), X, 1.0, 8), {"block": (16, 16)}, ValueError, "grid= is required"),
    ((f32(8), X, 1.0, 8), {"shared_mem": -1}, ValueError, "shared_mem must be >= 0"),
    ((f32(8), X, 1.0, 8), {"grid": 0}, ValueError, "grid dimensions must be >= 1"),
    ((f32(8), X, 1.0, 8), {"grid": (2, 0)}, ValueError, r"grid dimensions must be >= 1, got \(2, 0\)"),
    # saxpy(float* y, const float* x, ...): x is only read, so it cannot be a new output.
    ((X, f32(8), 1.0, 8), {}, TypeError, r"parameter x is const float\*, which the kernel only reads, so it "
                                         r"cannot be a new output \(a jax.ShapeDtypeStruct\)"),
    ((f32(8), f32(8), 1.0, 8), {}, TypeError, r"parameter x is const float\*, which the kernel only reads"),
    # ... nor a read-write one: inout= would hand XLA back the input as if the kernel had written it.
    ((f32(8), X, 1.0, 8), {"inout": ("x",)}, TypeError, r"inout names x, which is const float\*: the kernel only "
                                                         r"reads through it, so it cannot be an output"),
    ((X, X, 1.0, 8), {"inout": ("y", "x")}, TypeError, r"inout names x, which is const float\*"),
    # Launch geometry over CUDA's limits, named at trace time (no device needed).
    ((f32(8), X, 1.0, 8), {"block": 2048}, ValueError, r"block \(2048, 1, 1\) has 2048 along x, over the limit "
                                                         r"of 1024 \(CUDA's limit for every GPU"),
    ((f32(8), X, 1.0, 8), {"block": (64, 32), "grid": 1}, ValueError,
     r"block \(64, 32, 1\) has 2048 threads, over the limit of 1024 threads per block"),
    ((f32(8), X, 1.0, 8), {"block": (1, 1, 65), "grid": 1}, ValueError, "has 65 along z, over the limit of 64"),
    ((f32(8), X, 1.0, 8), {"grid": (1, 65536)}, ValueError, r"grid \(1, 65536, 1\) has 65536 along y, over the "
                                                           "limit of 65535"),
])
def test_kernel_call_errors_are_raised_at_trace_time(saxpy, args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        jax.jit(lambda: saxpy.jax_call(*args, **kwargs)).trace()


def test_kernel_call_needs_an_output(saxpy):
    x = f32(8)
    with pytest.raises(ValueError, match="needs at least one output"):
        jax.eval_shape(lambda y, x: saxpy.jax_call(y, x, 1.0, 8), x, x)


def test_traced_scalar_is_a_clear_error(saxpy):
    with pytest.raises(TypeError, match="baked into the launch"):
        jax.eval_shape(lambda x, a: saxpy.jax_call(f32(8), x, a, 8), f32(8), jax.ShapeDtypeStruct((), jnp.float32))


# ---------------------------------------------------------------------------
# Graph replay (via="ffi"), from a spec: no graph or device needed to lower
# ---------------------------------------------------------------------------


def make_step(inputs, outputs, graph_id=7, **kwargs):
    return spec_replayable(inputs, outputs, graph_id, **kwargs)


def test_replay_lowers_to_one_call_between_xla_ops():
    step = make_step([f32(4096)], [f32(4096)], graph_id=7)
    text = lower(lambda x: step(x * 2.0) - 1.0, f32(4096))
    (line,) = custom_calls(text, "jaxgraph_replay")
    assert "(tensor<4096xf32>) -> tensor<4096xf32>" in line
    assert re.search(r"mhlo.backend_config = \{call = \d+ : i64, graph = 7 : i64\}", line)
    assert "has_side_effect = true" not in line  # DESIGN.md: it made an empty call cost 114 us instead of 37
    # In order: the multiply feeds the call, the subtract consumes it.
    body = text[text.index("func.func public @main"):]
    assert body.index("stablehlo.multiply") < body.index("@jaxgraph_replay") < body.index("stablehlo.subtract")


def test_the_call_attribute_depends_on_the_function_not_on_what_was_traced_before():
    step, other = make_step([f32(64)], [f32(64)], graph_id=7), make_step([f32(64)], [f32(64)], graph_id=8)

    def f(x):
        return step(step(x) + 1.0) * step(x)  # three replays, two of them on the same operand

    first = lower(lambda x: f(x), f32(64))  # a new function each time: traced anew, not found in jit's cache
    calls = [re.search(r"call = (\d+) : i64", line).group(1) for line in custom_calls(first, "jaxgraph_replay")]
    assert sorted(calls) == ["1", "2", "3"]  # distinct within the function: XLA merges none of them
    lower(lambda x: other(step(other(x))), f32(64))  # other replays traced in between (as another process might not)
    jax.eval_shape(step, f32(64))
    assert lower(lambda x: f(x), f32(64)) == first  # the same program, as every process of a multi-process run must lower
    inner = jax.jit(lambda x: step(x))
    nested = lower(lambda x: inner(x) + step(x), f32(64))
    assert len(custom_calls(nested, "jaxgraph_replay")) == 2


def test_replay_with_several_inputs_and_outputs_returns_a_tuple():
    ins = [f32(3, 5), jax.ShapeDtypeStruct((7,), jnp.int32)]
    outs = [f32(5), jax.ShapeDtypeStruct((2, 2), jnp.float16)]
    step = make_step(ins, outs, graph_id=11)
    (line,) = custom_calls(lower(step, *ins), "jaxgraph_replay")
    assert "(tensor<3x5xf32>, tensor<7xi32>) -> (tensor<5xf32>, tensor<2x2xf16>)" in line
    out = jax.eval_shape(step, *ins)
    assert isinstance(out, tuple) and [o.shape for o in out] == [(5,), (2, 2)]


def test_replay_in_fori_loop_and_vmap():
    step = make_step([f32(64)], [f32(64)])
    loop = lower(lambda x: jax.lax.fori_loop(0, 1000, lambda i, v: step(v), x), f32(64))
    assert "stablehlo.while" in loop and len(custom_calls(loop, "jaxgraph_replay")) == 1
    batched = lower(jax.vmap(step), f32(3, 64))
    assert "stablehlo.while" in batched  # one replay per batch element
    (line,) = custom_calls(batched, "jaxgraph_replay")
    assert "(tensor<64xf32>) -> tensor<64xf32>" in line


def test_replay_grad_uses_the_backward_replayable():
    bwd = make_step([f32(16)] * 3, [f32(16)], graph_id=22)
    fwd = make_step([f32(16)], [f32(16)], graph_id=21, backward=bwd)
    text = lower(jax.grad(lambda x: fwd(x).sum()), f32(16))
    (call_f,) = [line for line in custom_calls(text, "jaxgraph_replay") if "graph = 21" in line]
    (call_b,) = [line for line in custom_calls(text, "jaxgraph_replay") if "graph = 22" in line]
    assert "(tensor<16xf32>) -> tensor<16xf32>" in call_f
    assert "(tensor<16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<16xf32>" in call_b
    assert text.index("graph = 21") < text.index("graph = 22")  # forward before backward


@pytest.mark.parametrize("args, exc, match", [
    ((f32(8),), ValueError, r"replayable input 0: expected shape \(4096,\) \(float32\[4096\], the static "
                            r"input's\), got shape \(8,\)"),
    ((jax.ShapeDtypeStruct((4096,), jnp.int32),), TypeError, "replayable input 0: expected dtype float32"),
    ((f32(4096), f32(4096)), TypeError, r"replayable takes 1 array\(s\) \(float32\[4096\]\), got 2"),
])
def test_replay_shape_and_dtype_errors_at_trace_time(args, exc, match):
    step = make_step([f32(4096)], [f32(4096)])
    with pytest.raises(exc, match=match):
        jax.eval_shape(step, *args)


def test_replay_of_a_closed_replayable_is_a_runtime_error():
    step = make_step([f32(8)], [f32(8)])
    assert step.alive
    step.close()
    step.close()  # idempotent
    assert not step.alive
    with pytest.raises(RuntimeError, match="closed"):
        jax.eval_shape(step, f32(8))


def test_replayable_spec_needs_outputs():
    with pytest.raises(ValueError, match="at least one output"):
        ReplaySpec((f32(8),), ())


def test_replayable_is_built_by_its_factory():
    with pytest.raises(RuntimeError, match=r"jaxgraph.replayable\(\.\.\.\)"):
        jaxgraph.Replayable()


def test_replayable_argument_errors_need_no_device():
    class NotAGraph:
        pass

    with pytest.raises(ValueError, match="via must be one of 'ffi', 'callback', got 'host'"):
        jaxgraph.replayable(NotAGraph(), [], [], via="host")
    with pytest.raises(TypeError, match="backward must be callable"):
        jaxgraph.replayable(NotAGraph(), [], [], backward=3)
    with pytest.raises(TypeError, match=r"inputs\[0\] must be a device array .* got ndarray"):
        jaxgraph.replayable(NotAGraph(), [np.zeros(3)], [])
    with pytest.raises(TypeError, match="outputs must be a list of device arrays, got int"):
        jaxgraph.replayable(NotAGraph(), [], 5)
    with pytest.raises(ValueError, match="bind must be one of 'auto', 'copy', got 'never'"):
        jaxgraph.replayable(NotAGraph(), [], [], bind="never")
    with pytest.raises(TypeError, match="graph must be a captured jaxgraph.CUDAGraph or jaxgraph.Graph, got NotAGraph"):
        jaxgraph.replayable(NotAGraph(), [], [])
