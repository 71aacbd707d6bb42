"""benchmarks/vs_idiomatic.py on the CPU: its arguments, and its report on synthetic worker records.

The timings need the GPU (``python benchmarks/vs_idiomatic.py``). Here the
merge of the processes (each mode's best setting, its speed against the
idiomatic program's best), the target verdicts and the markdown are checked
on made-up samples whose answers are known.
"""

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import vs_idiomatic as bench  # noqa: E402
from benchmarks.reports import vs_idiomatic_report as report  # noqa: E402


def record(samples, steps=None, check="matches numpy"):
    return {"unit": "us_per_call", "clock": "wall", "check": check, "samples": samples, "steps": steps}


def process(setting, scale):
    """gray_scott/256 and poisson_jacobi/64; the idiomatic modes scale with the setting, ours do not."""
    return {"setting": setting, "xla_flags": f"--flags-{setting}", "device": {"name": "NVIDIA H100 80GB HBM3"},
            "groups": {
                "gray_scott/256": {"modes": {
                    "jnp": record([2000.0 * scale, 2100.0 * scale, 1900.0 * scale], 100),
                    "loop_blocked_jit": record([1000.0, 1100.0, 900.0], 100),
                    "loop_fused_jit": {"error": "setup: RuntimeError: boom | pipe"}}},
                "poisson_jacobi/64": {"modes": {
                    "jnp_jacobi": record([90000.0 * scale] * 3, 4500),
                    "jacobi_exact": record([30000.0, 29000.0, 31000.0], 4500),
                    "jacobi_every": record([10000.0] * 3, 4500)}}}}


def results():
    procs = {"off": process("off", 2.0), "on": process("on", 1.0), "defaults": process("defaults", 1.5),
             "while": {"setting": "while", "xla_flags": "--w", "failed": "exit code 1", "output_tail": "Traceback"}}
    cfg = {"steps": 100, "substeps": 10, "rtol": 1e-4, "per_step": 8, "check_every": 8, "repeats": 3,
           "target_ms": 20.0}
    return report.summarize({"date": "2026-11-27T09:00:00+00:00", "git": "abc123", "command": "python x",
                             "config": cfg, "device": "NVIDIA H100 80GB HBM3", "wall_s": 12.0, "processes": procs})


def test_best_settings_and_speeds():
    r = results()
    best = r["best"]["gray_scott/256"]
    assert best["jnp"]["setting"] == "on" and best["jnp"]["median"] == 2000.0
    assert best["loop_blocked_jit"]["median"] == 1000.0
    speed = r["speed"]["gray_scott/256"]["loop_blocked_jit"]
    assert speed["median"] == pytest.approx(2.0)
    assert speed["min"] == pytest.approx(1900.0 / 1100.0) and speed["max"] == pytest.approx(2100.0 / 900.0)
    assert r["speed"]["gray_scott/256"]["jnp"]["median"] == pytest.approx(1.0)
    assert "loop_fused_jit" not in r["speed"]["gray_scott/256"]  # its setup failed everywhere
    jacobi = r["speed"]["poisson_jacobi/64"]
    assert jacobi["jacobi_exact"]["median"] == pytest.approx(3.0) and jacobi["jacobi_every"]["median"] == 9.0


def test_target_verdicts():
    verdicts = {(t["group"], t.get("mode", t.get("modes", [None])[0])): t for t in results()["targets"]}
    assert verdicts["gray_scott/256", "loop_blocked_jit"]["status"] == "met"
    assert verdicts["gray_scott/256", "loop_blocked_jit"]["idiomatic_setting"] == "on"
    assert verdicts["poisson_jacobi/64", "jacobi_exact"]["status"] == "met"  # 3.0x against 3x
    assert verdicts["poisson_jacobi/64", "jacobi_every"]["status"] == "met"
    assert verdicts["poisson_cg/64", "cg_exact"]["status"] == "not measured"
    slow = results()
    for p in slow["processes"].values():
        if "groups" in p:
            p["groups"]["poisson_jacobi/64"]["modes"]["jacobi_every"]["samples"] = [20000.0] * 3
        for g in p.get("groups", {}).values():
            for rec in g["modes"].values():
                rec.pop("stats", None)
    slow = report.summarize(slow)
    every = next(t for t in slow["targets"] if t.get("mode") == "jacobi_every")
    assert every["got"] == pytest.approx(4.5) and every["status"] == "missed by 25% (4.50x of 6x)"


def test_markdown_leads_with_idiomatic_and_says_what_failed():
    text = report.markdown(results())
    lines = text.splitlines()
    table = lines.index("## gray_scott, 256 x 256")
    rows = [ln for ln in lines[table:] if ln.startswith("| `")]
    assert rows[0].startswith("| `jnp` |")  # the idiomatic program first
    assert "| 4.00 ms (3.80 ms-4.20 ms) | 2.00 ms (1.90 ms-2.10 ms) | 3.00 ms (2.85 ms-3.15 ms) | – |" in rows[0]
    blocked = next(r for r in rows if r.startswith("| `loop_blocked_jit` |"))
    assert "**2.00x** (1.73-2.33) at off" in blocked  # ours: the same in every setting, the first is kept
    assert "setup: RuntimeError: boom / pipe" in text
    assert "**while failed**: exit code 1" in text
    assert "| gray_scott/256 | `loop_blocked_jit` | 1.5x | **2.00x** (1.73-2.33) | off / on | met |" in text
    assert "| poisson_cg/64 | cg_exact | 3x | – | – | not measured |" in text
    assert json.dumps(results())  # the document stays JSON


def test_plot_when_matplotlib_is_there(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: the PNG is rendered elsewhere")
    path = report.render(results(), tmp_path / "plot.png")
    assert pathlib.Path(path).stat().st_size > 1000


def test_arguments():
    args = bench.parse_args([])
    assert args.settings == ("off", "on", "defaults", "while") and args.grids == (64, 256, 1024)
    assert args.poisson_grids == (64, 256) and args.repeats == 5
    quick = bench.parse_args(["--quick"])
    assert quick.grids == (64,) and quick.repeats == 3 and quick.steps == 20
    for bad in (["--settings", "fast"], ["--grids", "2"], ["--grids", "x"], ["--check-every", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path, capsys):
    import jaxgraph

    if jaxgraph.device_count() > 0:
        pytest.skip("this machine has a GPU")
    assert bench.main(["--out", str(tmp_path)]) == 0
    assert "no CUDA device" in capsys.readouterr().out and not list(tmp_path.iterdir())


def test_the_single_block_modes_join_the_poisson_cases_up_to_64():
    args = bench.parse_args(["--block-per-launch", "32"])
    assert args.block_per_launch == 32 and bench.parse_args([]).block_per_launch == 256
    with pytest.raises(SystemExit):
        bench.parse_args(["--block-per-launch", "0"])
    keys = lambda n, method: [k for k, _ in bench.poisson_factories(args, n, method)]  # noqa: E731
    assert keys(64, "jacobi")[-2:] == ["jacobi_block_exact", "jacobi_block_every"]
    assert keys(33, "cg")[-3:] == ["cg_block_exact", "cg_block_exact_eager", "cg_block_every"]
    assert not any("_block" in k for k in keys(65, "cg"))  # above 64 x 64 the single block cannot hold the grid
    assert "jnp_jacobi" == keys(64, "jacobi")[0] and "jax_scipy_cg" == keys(64, "cg")[0]  # idiomatic first
    for case in ("poisson_jacobi", "poisson_cg"):
        assert all(k in report.MODES[case] for k in keys(64, case.split("_")[1]))  # each row described
    assert {(g, m[0]) for g, m, _ in report.TARGETS} >= {("poisson_jacobi/64", "jacobi_block_exact"),
                                                         ("poisson_cg/64", "cg_block_every")}


def test_tiling_option_reads_each_grid_and_names_a_bad_entry():
    from benchmarks.vs_idiomatic import tiling

    assert tiling(None) == {} and tiling("") == {}
    assert tiling("64=10/16/16,1024=5/32/8") == {64: (10, 16, 16, None), 1024: (5, 32, 8, None)}
    assert tiling("64=5/6/w8,256=5/22/w4") == {64: (5, 6, 16, 8), 256: (5, 22, 16, 4)}  # the columns kernel
    assert tiling("64=5/6/w0") == {64: (5, 6, 16, 0)}  # read as given: CudaGrayScott names warps 0 as out of range
    for bad in ("256=10/16", "256=5/22/x8", "256=5/22/w", "x=5/22/16"):
        with pytest.raises(ValueError, match=f"'{bad}' is not GRID=SUBSTEPS/TILE/THREADS or GRID=SUBSTEPS/TILE/wWARPS"):
            tiling("64=10/16/16," + bad)


def test_every_settings_process_gets_the_same_seed(tmp_path, monkeypatch):
    # A Jacobi or CG solve's sweeps depend on its random problem: each setting's process must solve the same
    # one, or comparing settings compares problems.
    import jaxgraph
    from benchmarks import run

    commands = []

    def fake_worker(env, device, tmp, timeout, command):
        commands.append(command)
        return {"setting": command[-1], "failed": "not run: a test"}

    monkeypatch.setattr(jaxgraph, "device_count", lambda: 1)
    monkeypatch.setattr(run, "run_worker", fake_worker)
    assert bench.main(["--out", str(tmp_path), "--settings", "off,on"]) == 1  # the processes "failed"
    assert not list(tmp_path.glob("*.png"))  # nothing measured: no plot, and no error for the lack of one
    seeds = {c[c.index("--seed") + 1] for c in commands}
    assert len(commands) == 2 and len(seeds) == 1, commands
    written = json.loads(next(tmp_path.glob("*-vs-idiomatic.json")).read_text())
    assert str(written["config"]["seed"]) == seeds.pop() and "--seed" in written["command"]
    commands.clear()
    bench.main(["--out", str(tmp_path), "--settings", "off", "--seed", "7"])  # given: passed on as it is
    assert commands[0].count("--seed") == 1 and commands[0][commands[0].index("--seed") + 1] == "7"
