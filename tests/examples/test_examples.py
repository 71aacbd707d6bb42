"""Every example in examples/ runs to completion, and its own check passes.

Each example compares what it computed with a numpy reference and prints a
line containing "matches" when it does (and raises when it does not). Without
a GPU an example says so in one line and exits 0; the kernels it can compile
without one are still compiled. The long ones run here with small sizes, so
each takes seconds; the table of compare_command_buffers.py is also checked on
the CPU, from made-up worker records.
"""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

import jaxgraph

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Modules beside the examples that are not examples: run, each says so in one line (and whose it is).
HELPERS = {"poisson_block": "examples/poisson_solver.py", "poisson_kernels": "examples/poisson_solver.py",
           "compare_factory": "python -m jaxgraph.compare examples/compare_factory.py:make_case"}
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py") if p.stem not in HELPERS)
HAS_GPU = jaxgraph.device_count() > 0

# Small sizes, so each example runs in seconds.
SMALL = {
    "gray_scott": ["--quick"],
    "poisson_solver": ["--quick"],
    "adaptive_ode": ["--quick"],
    "inverse_diffusion": ["--quick"],
    "compare_command_buffers": ["--ns", "10", "--repeats", "1", "--target-ms", "1", "--settings", "off,on"],
}
# What else a GPU run must print (beyond "matches").
PRINTS = {
    "quickstart": ["3 kernel"],                                  # print(g): the graph's summary
    "gray_scott": ["[4/4]", "vs idiomatic JAX", "XLA: fused kernels as jax_calls", "columns x3 (12x12 tiles, 32x8 threads) device loop in jax.jit",
                   "GraphedLoop", "vs the same kernels via jax_call"],
    "poisson_solver": ["every Jacobi solution matches", "every CG solution is within tolerance",
                       "idiomatic JAX: jnp sweep in a jitted lax.while_loop", "jax.scipy.sparse.linalg.cg",
                       "jaxgraph: CG device loop, exact stop, in jax.jit",
                       "jaxgraph: single block, exact stop, in jax.jit",
                       "jaxgraph: single-block CG, every-4 stop, eager",
                       "idiomatic JAX, fair: 8 sweeps a while_loop trip", "XLA: the cg_fused kernel as 8 jax_calls",
                       "XLA (single block): the kernel as a jax_call in a while_loop",
                       "vs the same kernels via jax_call"],
    "inverse_diffusion": ["the device gradient matches jax.grad and finite differences", "gradient descent"],
    "adaptive_ode": ["matches the numpy model", "t_end reached exactly", "vs same kernel"],
    "compare_command_buffers": ["N = 10 kernels", "| off: XLA command buffers off", "| on: XLA command buffers on"],
    "interop_cupy_torch": ["mixing kernels of jaxgraph", "eager replay of the mixed graph matches numpy",
                           "kernels replayed inside jax.jit matches numpy"],
}


def run_example(path, *args):
    env = dict(os.environ, PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    result = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, env=env,
                            timeout=600)
    return result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_and_checks_itself(path):
    code, output = run_example(path, *SMALL.get(path.stem, []))
    assert code == 0, output
    if HAS_GPU:
        assert "matches" in output, output
        for text in PRINTS.get(path.stem, []):
            assert text in output, output
        # A run that succeeded ends without coordination-service errors at shutdown (multi_process.py): the
        # only watch message allowed is the CANCELLED one JAX's GPU client logs when shutdown() ends its watch.
        assert "Connection refused" not in output and "UNAVAILABLE" not in output, output
        for line in output.splitlines():
            if "WatchTasksAsync" in line:
                assert "CANCELLED" in line, output
    else:
        assert "none found" in output, output


def test_compare_command_buffers_table_from_worker_records():
    path = ROOT / "examples" / "compare_command_buffers.py"
    spec = importlib.util.spec_from_file_location("compare_command_buffers", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    stats = example.stats

    def record(setting, factors):
        modes = {mode: {"unit": "us_per_kernel", "by_n": {"10": {
            "samples": [2.0 * f, 2.2 * f], "check": "x + 10 on 4096 random floats matches numpy"}}}
            for mode, f in factors.items()}
        return {"setting": setting, "modes": modes, "errors": []}

    off = record("off", {"raw": 1.0, "jax_calls": 6.0, "jit_loop": 30.0})
    off["modes"]["jit_loop"]["by_n"]["10"]["steady_samples"] = [21.0, 23.1]  # the harness's streaming calls
    results = stats.merge({}, {"off": off, "on": record("on", {"raw": 1.0, "jax_calls": 4.5, "jit_fori": 1.5})})
    text = example.table(results, (10,))
    lines = text.splitlines()
    assert "N = 10 kernels: us per kernel (ratio to the raw floor of the same process)" in lines
    header = next(line for line in lines if line.startswith("| XLA setting"))
    assert all(name in header for name in example.COLUMNS.values())
    off = next(line for line in lines if line.startswith("| off:"))
    assert "12.60 (6.00x)" in off and "63.00 (30.00x; streaming 10.50x)" in off and "| 2.100 " in off
    on = next(line for line in lines if line.startswith("| on:"))
    assert "9.450 (4.50x)" in on and "3.150 (1.50x)" in on and "| – " in on  # jit_loop not measured there
    checked, problems = example.checks(results)
    assert checked == 6 and problems == []
    failed = stats.merge({}, {"off": {"setting": "off", "failed": "exit code 1", "output_tail": "Traceback"}})
    assert example.checks(failed) == (0, ["off: exit code 1\nTraceback"])


@pytest.mark.parametrize("name", ["gray_scott", "poisson_solver"])
def test_help_prints_the_whole_description(name):
    path = ROOT / "examples" / f"{name}.py"
    code, output = run_example(path, "--help")
    assert code == 0, output
    spec = importlib.util.spec_from_file_location(name, path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    paragraphs = [p for p in example.__doc__.strip().split("\n\n") if p.strip()]
    assert len(paragraphs) >= 4
    for paragraph in paragraphs:  # every paragraph, verbatim (argparse keeps its lines)
        assert paragraph.strip() in output, paragraph
    assert "--quick" in output and "--command-buffers" in output


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_help_describes_it_and_runs_nothing(path):
    code, output = run_example(path, "--help")
    assert code == 0, output
    assert output.startswith("usage:"), output
    first = " ".join(path.read_text().split('"""')[1].split("\n\n")[0].split())  # the docstring's first paragraph
    assert first[:60] in " ".join(output.split()), (first, output)
    assert "none found" not in output and "matches" not in output, output  # --help ran nothing


@pytest.mark.skipif(HAS_GPU, reason="checks what a CPU-only machine says")
def test_multi_process_worker_without_a_gpu_says_so_and_exits_0():
    # The mode a launcher (torchrun, srun) starts in every process: no GPU is a message, not a traceback.
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "multi_process.py"), "--worker"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "a CUDA GPU is needed" in result.stdout and "Traceback" not in result.stderr, result.stderr


def test_every_example_takes_help_and_every_helper_is_listed():
    """A module of examples/ is an example (argparse: --help says what it shows) or one of HELPERS."""
    for path in EXAMPLES:
        assert "argparse" in path.read_text(), f"{path.name}: an example without --help, or a helper missing from HELPERS"


@pytest.mark.parametrize("name", sorted(HELPERS))
def test_a_helper_module_run_says_what_it_is_and_exits_0(name):
    code, output = run_example(ROOT / "examples" / f"{name}.py")
    assert code == 0, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and f"examples/{name}.py is a" in lines[0] and "not an example" in lines[0], output
    assert HELPERS[name] in lines[0], output


def test_multi_process_shutdown_on_the_cpu_ends_every_process_quietly():
    """multi_process.finish (final barrier, then jax.distributed.shutdown) over two CPU processes (gloo)."""
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import jax, multi_process; multi_process.initialize(); "
              "print('joined', jax.process_index(), jax.process_count(), flush=True); multi_process.finish(); "
              "print('shut down', flush=True); print('initialized after:', jax.distributed.is_initialized())")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                   JAX_PLATFORMS="cpu", JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo", PYTHONUNBUFFERED="1")
        env.pop("LOCAL_RANK", None)
        procs.append(subprocess.Popen([sys.executable, "-c", script, str(ROOT / "examples")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (proc, output) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, output
        assert f"joined {rank} 2" in output and "shut down" in output and "initialized after: False" in output, output
        assert "WatchTasksAsync" not in output and "Connection refused" not in output, output
