"""The README's Python snippets run as written, so the README cannot drift.

A ```python block whose first line starts with ``# continues`` runs after the
blocks before it, in the same process: together they form a chain. Any other
block starts a new chain, in a fresh process. On a GPU every chain runs, and it
fails on an error or on a check it prints as ``False`` (the snippets print
their comparisons with numpy). On the CPU the blocks
are found and each compiles, and ``.ci/run`` runs exactly the README's CPU
install line and test command.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
CONTINUES = "# continues"


def python_blocks(text: str = README) -> list[tuple[int, str]]:
    """Every ```python block of ``text`` as (line number of its fence, code)."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M)]


def chains(text: str = README) -> list[tuple[int, str]]:
    """The blocks joined into chains: (line of the chain's first block, the code to run)."""
    out: list[tuple[int, list[str]]] = []
    for line, code in python_blocks(text):
        if code.lstrip().startswith(CONTINUES):
            out[-1][1].append(code)
        else:
            out.append((line, [code]))
    return [(line, "\n".join(codes)) for line, codes in out]


CHAINS = chains()


# ---------------------------------------------------------------------------
# CPU: the snippets are found, compile, and the install commands match .ci/run
# ---------------------------------------------------------------------------


def test_the_snippets_are_found_and_chained():
    blocks = python_blocks()
    assert len(blocks) >= 4                      # a first kernel, capture, jit, a device loop
    assert not blocks[0][1].lstrip().startswith(CONTINUES)  # the first one stands alone
    assert len(CHAINS) >= 2 and sum(code.count("```") for _, code in CHAINS) == 0
    first = CHAINS[0][1]
    for name in ("x_host", "blocks", "add_one", "CUDAGraph", "replayable"):
        assert name in first, name               # one chain from "A first kernel" on
    assert any("graphed_loop" in code for _, code in CHAINS)


def test_the_readme_stays_a_front_door():
    assert len(README.splitlines()) <= 300, "move details into docs/"
    for target in ("docs/getting-started.md", "docs/performance.md", "docs/api.rst", "BUILD.md", "CHANGELOG.md"):
        assert f"]({target})" in README and (REPO / target).is_file(), target
    for link in re.findall(r"\]\(((?:docs|examples)/[^)#]+)\)", README):
        assert (REPO / link).is_file(), link


def test_the_offline_install_preinstalls_every_build_requirement():
    """--no-build-isolation needs the build requirements in the environment (else "Could not find nanobind")."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: pytest brings tomli
        import tomli as tomllib
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    names = {re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in requires} - {"jaxlib"}  # jax's own jaxlib serves
    for text in (README, (REPO / "docs" / "getting-started.md").read_text()):
        bash = re.findall(r"^```bash\n(.*?)^```$", text, re.S | re.M)
        block = next(b for b in bash if "--no-build-isolation" in b)
        preinstall = block.splitlines()[0]
        assert preinstall.startswith("python3 -m pip install ") and "--no-build-isolation" not in preinstall
        for name in names:
            assert f'"{name}' in preinstall or f" {name} " in f"{preinstall} ", name


def test_the_listed_skip_reasons_are_the_tests_own():
    """Each CPU skip reason the README (and docs/getting-started.md) lists is one a test gives, word for word."""
    listed = re.findall(r'"([^"]+)"', README[README.index("skip with these reasons"):README.index("With `--no-build-isolation`")])
    started = (REPO / "docs" / "getting-started.md").read_text()
    assert listed == re.findall(r'"([^"]+)"', started[started.index("with these reasons"):started.index("**Offline")])
    # The tests' text on one line, adjacent string literals joined ("a " "b" -> "a b").
    sources = " ".join(" ".join(p.read_text().split()) for p in (REPO / "tests").rglob("*.py")).replace('" "', "")
    assert len(listed) >= 5, listed
    for reason in listed:
        assert " ".join(reason.split()) in sources, reason


def test_a_continuation_joins_the_blocks_before_it():
    text = "```python\nx = 1\n```\n\n```python\n# continues the snippet above (x)\ny = x\n```\n"
    assert chains(text) == [(1, "x = 1\n\n# continues the snippet above (x)\ny = x\n")]


@pytest.mark.parametrize("line, code", python_blocks(), ids=[f"line{line}" for line, _ in python_blocks()])
def test_every_snippet_compiles(line, code):
    compile(code, f"README.md:{line}", "exec")


def test_ci_runs_exactly_the_readmes_two_commands():
    bash = "\n".join(re.findall(r"^```bash\n(.*?)^```$", README, re.S | re.M))
    install = 'python3 -m pip install -e ".[test]" && python3 examples/quickstart.py'
    gpu_install = 'python3 -m pip install -e ".[cuda13,test]" && python3 examples/quickstart.py'
    tests = "python3 -m pytest -q"
    lines = bash.splitlines()
    assert install in lines and gpu_install in lines and tests in lines
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert install in ci and tests in ci


# ---------------------------------------------------------------------------
# GPU: every chain runs
# ---------------------------------------------------------------------------


def run_chain(code, cwd):
    """Run a chain in a fresh process in ``cwd``: it must exit 0 and print no False; its stdout."""
    # This process's JAX may hold most of the GPU already: the snippet's JAX must not preallocate.
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    output = proc.stdout + proc.stderr[-4000:]
    assert proc.returncode == 0, output
    assert "False" not in proc.stdout, output     # a check the snippet printed failed
    return proc.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("line, code", CHAINS, ids=[f"line{line}" for line, _ in CHAINS])
def test_readme_snippets_run(line, code, tmp_path):
    print(f"README.md chain from line {line}:\n{run_chain(code, tmp_path)}")
