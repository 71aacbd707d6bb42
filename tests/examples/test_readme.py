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
    assert len(blocks) >= 6                      # a first kernel ... gradients, at least
    assert not blocks[0][1].lstrip().startswith(CONTINUES)  # the first one stands alone
    assert len(CHAINS) >= 2 and sum(code.count("```") for _, code in CHAINS) == 0
    first = CHAINS[0][1]
    for name in ("x_host", "blocks", "add_one", "replayable", "capture_per_device"):
        assert name in first, name               # one chain from "A first kernel" on


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


@pytest.mark.gpu
@pytest.mark.parametrize("line, code", CHAINS, ids=[f"line{line}" for line, _ in CHAINS])
def test_readme_snippets_run(line, code, tmp_path):
    # This process's JAX may hold most of the GPU already: the snippet's JAX must not preallocate.
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    output = proc.stdout + proc.stderr[-4000:]
    print(f"README.md chain from line {line}:\n{output}")
    assert proc.returncode == 0, output
    assert "False" not in proc.stdout, output     # a check the snippet printed failed
