"""``jaxgraph.compare``'s parts, without worker processes: agreement, the command-buffer count, the
factory contract, settings, argument checks and the table."""

import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxgraph.compare as compare
from jaxgraph.compare import Case, Setting
from jaxgraph.compare.agreement import compare_arrays, compare_results
from jaxgraph.compare.cases import factory_spec, normalize_cases
from jaxgraph.compare.report import Failure, Result, Timing
from jaxgraph.compare.settings import parse_setting
from jaxgraph.compare.table import fmt_seconds
from jaxgraph.compare.worker import command_buffers, count_command_buffer_thunks, count_command_buffers, host_tree


@pytest.fixture
def rng():
    return np.random.default_rng()


# ----------------------------------------------------------------------------
# Agreement
# ----------------------------------------------------------------------------


def test_close_arrays_agree_and_a_poisoned_element_is_found(rng):
    ref = rng.random((5, 7)).astype(np.float32)
    assert compare_arrays("result", ref.copy(), ref, 1e-5, 1e-8) is None
    assert compare_arrays("result", ref * (1 + 1e-7), ref, 1e-5, 1e-8) is None  # within rtol
    i, j = rng.integers(5), rng.integers(7)
    x = ref.copy()
    x[i, j] += 0.25
    m = compare_arrays("result[1]", x, ref, 1e-5, 1e-8)
    assert (m.output, m.index, m.count, m.size) == ("result[1]", (i, j), 1, 35)
    assert m.max_abs_diff == pytest.approx(0.25, rel=1e-5)
    assert (m.value, m.reference_value) == (float(x[i, j]), float(ref[i, j]))
    assert f"1 of 35 elements not within rtol=1e-05, atol=1e-08; max |diff| 0.25 at index ({i}, {j})" in str(m)


def test_the_largest_difference_is_reported_among_several(rng):
    ref = rng.random(100)
    x = ref.copy()
    x[[3, 50, 90]] += [0.1, 2.0, 0.5]
    m = compare_arrays("result", x, ref, 1e-5, 1e-8)
    assert m.index == (50,) and m.count == 3 and m.max_abs_diff == pytest.approx(2.0)


def test_nan_agrees_with_nan_and_differs_from_a_number():
    ref = np.array([1.0, np.nan, 3.0])
    assert compare_arrays("r", ref.copy(), ref, 1e-5, 1e-8) is None
    m = compare_arrays("r", np.array([1.0, 2.0, 3.0]), ref, 1e-5, 1e-8)
    assert m.index == (1,) and m.max_abs_diff == float("inf")


def test_shapes_dtypes_integers_and_structure_must_match():
    a = np.arange(6, dtype=np.int32)
    assert "shape (2, 3) vs the reference's (6,)" in str(compare_arrays("r", a.reshape(2, 3), a, 1e-5, 1e-8))
    assert "dtype int64 vs the reference's int32" in str(compare_arrays("r", a.astype(np.int64), a, 1e-5, 1e-8))
    b = a.copy()
    b[4] += 1  # integers: exact, whatever rtol says
    m = compare_arrays("r", b, a, 0.5, 0.0)
    assert m.index == (4,) and m.max_abs_diff == 1.0 and "not equal" in m.reason
    assert compare_arrays("r", np.array([True, False]), np.array([True, True]), 1e-5, 1e-8).index == (1,)
    one = {"treedef": "PyTreeDef((*, *))", "leaves": [("result[0]", a), ("result[1]", a)]}
    other = {"treedef": "PyTreeDef(*)", "leaves": [("result", a)]}
    assert compare_results(one, one, 1e-5, 1e-8) is None
    assert "structure PyTreeDef(*) vs the reference's PyTreeDef((*, *))" in str(compare_results(other, one, 0, 0))


def test_bfloat16_is_compared_as_numbers():
    ref = np.array([1.0, 2.0, 3.0], dtype=ml_dtypes.bfloat16)
    x = ref.copy()
    x[2] = 3.5
    assert compare_arrays("r", ref.copy(), ref, 1e-5, 1e-8) is None
    m = compare_arrays("r", x, ref, 1e-2, 0)
    assert m.index == (2,) and m.max_abs_diff == 0.5


def test_a_result_goes_to_the_host_with_its_paths(rng):
    u = rng.random(4).astype(np.float32)
    tree = host_tree({"u": jnp.asarray(u), "n": (jnp.int32(3), jnp.zeros(2))})
    assert [p for p, _ in tree["leaves"]] == ["result['n'][0]", "result['n'][1]", "result['u']"]
    np.testing.assert_array_equal(tree["leaves"][2][1], u)
    assert host_tree(jnp.asarray(u))["leaves"][0][0] == "result"


# ----------------------------------------------------------------------------
# Command buffers from XLA's dump
# ----------------------------------------------------------------------------

HLO = """HloModule jit_step, is_scheduled=true

%fused_add (p0: f32[8]) -> f32[8] {
  ROOT %a = f32[8]{0} add(%p0, %p0)
}

%command_buffer (p: f32[8]) -> f32[8] {
  ROOT %f = f32[8]{0} fusion(%p), kind=kLoop, calls=%fused_add
}

%command_buffer.1 (p.1: f32[8]) -> f32[8] {
  ROOT %g = f32[8]{0} fusion(%p.1), kind=kLoop, calls=%fused_add
}

ENTRY %main (x: f32[8]) -> f32[8] {
  %c = f32[8]{0} call(%x), to_apply=%command_buffer
  ROOT %d = f32[8]{0} call(%c), to_apply=%command_buffer.1
}
"""


def test_command_buffers_are_the_command_buffer_computations():
    assert count_command_buffers(HLO) == 2
    assert count_command_buffers(HLO.replace("%command_buffer", "%other")) == 0
    assert count_command_buffers("command_buffer (p: f32[8]) -> f32[8] {") == 1  # without the % too


def test_the_dump_of_the_compiled_module_is_the_one_counted(tmp_path):
    before = {"module_0001.jit_step.sm_9.0_gpu_after_optimizations.txt"}  # an earlier compilation
    files = {
        "module_0001.jit_step.sm_9.0_gpu_after_optimizations.txt": "",
        "module_0004.jit_step.sm_9.0_gpu_after_optimizations.txt": HLO,
        "module_0004.jit_step.sm_9.0_gpu_after_optimizations-buffer-assignment.txt": HLO,
        "module_0005.jit_other.sm_9.0_gpu_after_optimizations.txt": HLO,
        "module_0004.jit_step.before_optimizations.txt": HLO,
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    got = command_buffers(str(tmp_path), before, "HloModule jit_step, is_scheduled=true\n...")
    assert got == {"command_buffers": 2,
                   "command_buffers_from": "XLA dump: module_0004.jit_step.sm_9.0_gpu_after_optimizations.txt"}
    # Not jitted by the tool (no module name known): every module that call compiled.
    everything = command_buffers(str(tmp_path), before, None)
    assert everything["command_buffers"] == 4
    # Compiled before the dump could see it: its compiled text.
    assert command_buffers(str(tmp_path), set(files), HLO)["command_buffers_from"].startswith("compiled.as_text()")
    assert command_buffers(None, set(), HLO) == {"command_buffers": None, "command_buffers_from": "not counted"}


def test_the_cpu_dump_names_match_what_xla_writes(tmp_path, monkeypatch):
    # This process's XLA was started without --xla_dump_to, so compile in a fresh one.
    import subprocess
    import sys

    code = ("import jax, jax.numpy as jnp\n"
            "from jaxgraph.compare.worker import command_buffers, _listing\n"
            f"d = {str(tmp_path)!r}\n"
            "f = jax.jit(lambda x: x * 2 + 1)\n"
            "x = jnp.ones(4)\n"
            "before = _listing(d)\n"
            "c = f.lower(x).compile()\n"
            "print(command_buffers(d, before, c.as_text()))\n")
    env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={tmp_path}", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "'command_buffers': 0" in out.stdout and "cpu_after_optimizations.txt" in out.stdout, out.stderr


# ----------------------------------------------------------------------------
# The factory contract, settings, arguments
# ----------------------------------------------------------------------------


def _step(u):
    return u + 1


def test_what_a_factory_may_return():
    x = jnp.ones(3)
    assert list(normalize_cases((_step, (x,)))) == ["_step"]
    assert list(normalize_cases((lambda u: u, (x,)), "make_case")) == ["make_case"]
    case = Case(_step, (x,), jit=False, label="mine")
    assert normalize_cases(case) == {"mine": case}
    both = normalize_cases({"a": (_step, [x]), "b": Case(jax.jit(_step), (x,))})
    assert list(both) == ["a", "b"] and both["a"].args == (x,) and both["a"].jit
    for bad, text in [([_step, (x,)], "got list"), ((_step, x), "Case.args must be a tuple"),
                      ({}, "empty dict"), ({"a": _step}, "got function"), ({1: (_step, (x,))}, "label"),
                      ((_step, (x,), 3), "a tuple of 3")]:
        with pytest.raises(TypeError, match=text.replace("(", r"\(")):
            normalize_cases(bad)


def test_factory_names(tmp_path):
    assert factory_spec("pkg.mod:make_case") == "pkg.mod:make_case"
    assert factory_spec("sub/file.py:make_case") == os.path.abspath("sub/file.py") + ":make_case"
    assert factory_spec(_step) == f"{__name__}:_step"
    for bad in ("make_case", "mod:", ":make_case", "mod:1x"):
        with pytest.raises(ValueError, match="must be 'module:function'"):
            factory_spec(bad)
    with pytest.raises(ValueError, match="cannot be found by a worker"):
        factory_spec(lambda: None)
    with pytest.raises(TypeError, match="got int"):
        factory_spec(3)


def test_settings():
    assert parse_setting("on") is compare.SETTINGS["on"]
    mine = parse_setting("plus=--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL")
    assert mine == Setting("plus", "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL", "your own flags")
    assert compare.SETTINGS["defaults"].xla_flags is None
    assert compare.DEFAULT_SETTINGS == ("off", "on", "defaults", "while")
    with pytest.raises(ValueError, match="unknown setting 'fast'"):
        parse_setting("fast")
    with pytest.raises(ValueError, match="a setting's name"):
        Setting("a b", None)


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(rounds=0), ValueError, "rounds must be an int >= 1"),
    (dict(target_ms=0), ValueError, "target_ms must be a positive number"),
    (dict(rtol=-1), ValueError, "rtol must be a number >= 0"),
    (dict(settings=[]), ValueError, "settings is empty"),
    (dict(settings=["on", "on"]), ValueError, "two settings share a name"),
    (dict(factory_kwargs={"x": object()}), TypeError, "JSON-serializable"),
])
def test_bad_arguments_raise_before_any_process_starts(kwargs, error, text):
    with pytest.raises(error, match=text):
        compare.run("mod:make_case", **kwargs)


# ----------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------


def _result(backend="gpu"):
    settings = (compare.SETTINGS["off"], compare.SETTINGS["on"], Setting("mine", "--x=1", "your own flags"))
    res = Result("f.py:make", settings, ("step",), 3, 1e-5, 1e-8, backend=backend, devices=["cuda:0"],
                 jax_version="0.x", calls_per_sample={"step": 7})
    res.timings["step"] = {"off": Timing((2e-3, 2.2e-3, 2.1e-3), 7, 2.1e-3, 2e-3, 2.2e-3, 1.5),
                           "on": Timing((1.4e-3,) * 3, 7, 1.4e-3, 1.4e-3, 1.4e-3, 1.0)}
    res.command_buffers["step"] = {"off": 0, "on": 3}
    res.reference["step"], res.compared["step"] = "off", ["off", "on"]
    res.mismatches["step"] = {}
    res.failures.append(Failure("mine", None, "start", "Timeout", "no answer within the timeout of 5 s", "tb"))
    return res


def test_the_table_rows():
    res = _result()
    lines = str(res).splitlines()
    assert "step  (7 calls a sample)" in lines
    header = next(ln for ln in lines if ln.startswith("| setting"))
    assert [c.strip() for c in header.split("|")[1:-1]] == [
        "setting", "median (ms)", "range", "vs best", "command buffers", "results"]
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]]
            for ln in lines if ln.startswith("| ") and not ln.startswith("| setting") and "---" not in ln}
    assert rows["off"] == ["2.10", "2.00 - 2.20", "1.50x", "0", "reference"]
    assert rows["on"] == ["1.40", "1.40 - 1.40", "1.00x", "3", "agree"]
    assert rows["mine"][:2] == ["failed", "Timeout: no answer within the timeout of 5 s (start)"]
    assert not res.ok and "mine (start): Timeout" in str(res) and "tb" not in str(res)
    assert "    tb" in res.table(verbose=True)
    cpu = str(_result("cpu"))
    assert "n/a (no GPU)" in cpu and "XLA accepts the --xla_gpu_* flags and ignores them" in cpu


@pytest.mark.parametrize("seconds, text", [(3.2e-6, "3.20 us"), (4.56e-4, "456 us"), (2.1e-3, "2.10 ms"),
                                           (1.5, "1.50 s"), (1234.0, "1234 s")])
def test_seconds_are_shown_with_three_digits(seconds, text):
    assert fmt_seconds(seconds) == text


# What jax 0.11's XLA dumped on an H200 for a jitted function whose fusions and custom call ran as one
# command buffer (module_1325.jit_f.thunk_sequence_after_thunk_passes.txt): its optimized HLO had no
# command_buffer computation. The second sequence nests one under a while loop's thunk.
THUNKS = "000: kCommandBuffer [source | sink]\n"
NESTED = "000: kKernel [source]\n001: kWhile [sink]\n  000: kCommandBuffer [source | sink]\n  001: kCopy\n"


def test_command_buffers_formed_from_thunks_are_counted_from_the_thunk_sequence(tmp_path):
    assert count_command_buffer_thunks(THUNKS) == 1 and count_command_buffer_thunks(NESTED) == 1
    assert count_command_buffer_thunks("000: kKernel [source | sink]\n") == 0
    files = {
        "module_0004.jit_step.sm_9.0a_gpu_after_optimizations.txt": "HloModule jit_step\n",  # none in the HLO
        "module_0004.jit_step.thunk_sequence.txt": THUNKS + THUNKS,  # before the thunk passes: not counted
        "module_0004.jit_step.thunk_sequence_after_thunk_passes.txt": THUNKS,
        "module_0005.jit_other.thunk_sequence_after_thunk_passes.txt": NESTED + THUNKS,
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    got = command_buffers(str(tmp_path), set(), "HloModule jit_step, is_scheduled=true\n...")
    assert got == {"command_buffers": 1,
                   "command_buffers_from": "XLA dump: module_0004.jit_step.thunk_sequence_after_thunk_passes.txt"}
    assert command_buffers(str(tmp_path), set(), None)["command_buffers"] == 3  # every module that call compiled
