"""``jaxgraph.compare`` on a GPU: XLA's command buffers counted from its dump, and the guide's factory
(``examples/compare_factory.py``: the jnp loop, the kernel through ``jax_call`` and the device loop) agreeing
under every setting."""

import pathlib

import pytest

import jaxgraph.compare as compare

pytestmark = pytest.mark.gpu

HERE = pathlib.Path(__file__).resolve().parent
FACTORIES = str(HERE / "compare_factories.py")
EXAMPLE = str(HERE.parents[1] / "examples" / "compare_factory.py")


def test_command_buffers_are_counted_per_setting_on_a_gpu():
    res = compare.run(f"{FACTORIES}:make_pair", ["off", "on"], rounds=2, target_ms=2.0, timeout_s=300.0)
    assert res.ok, str(res)
    assert res.backend == "gpu"
    for label in ("fori", "scan"):
        assert res.command_buffers[label]["off"] == 0, res.command_buffers_from[label]
        assert res.command_buffers[label]["on"] >= 1, res.command_buffers_from[label]  # the loop body's fusions
        assert res.command_buffers_from[label]["on"].startswith("XLA dump: module_")
    table = str(res)
    assert "n/a (no GPU)" not in table and "XLA accepts the --xla_gpu_* flags" not in table


def test_the_guide_s_factory_agrees_under_every_setting():
    res = compare.run(f"{EXAMPLE}:make_case", rounds=2, target_ms=5.0, timeout_s=300.0, compare_functions=True,
                      factory_kwargs={"steps": 200})
    print(res)
    assert res.ok, str(res)
    assert res.labels == ("jnp", "jax_call", "device loop") and res.function_mismatches == {}
    assert all(set(res.timings[label]) == {"off", "on", "defaults", "while"} for label in res.labels)
    assert res.command_buffers["jnp"]["off"] == 0 and res.command_buffers["jax_call"]["off"] == 0
