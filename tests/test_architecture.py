"""The package's shape, checked on the source (CPU, no import of jaxgraph needed).

- No private name crosses a module boundary: no ``from ._x import _name``, and
  no ``_x._name`` on a jaxgraph module another module imported. A module that
  needs something of another gets it under a name without an underscore
  (modules are private already, so their plain names are internal).
- No module of ``jaxgraph/``, and no Python file of ``tests/``, ``benchmarks/`` or
  ``examples/``, is over 400 lines: a room that grows splits by concept.
- README's "What lives where" names every module of ``jaxgraph/`` and every
  file of ``ffi/``, and nothing that does not exist.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jaxgraph"
MAX_LINES = 400


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_crossings(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for each private name ``source`` takes from another jaxgraph module."""
    tree = ast.parse(source)
    modules: set[str] = set()  # local names bound to jaxgraph modules
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            internal = node.level > 0 or (node.module or "").split(".")[0] == "jaxgraph"
            if not internal:
                continue
            for alias in node.names:
                if node.module is None or node.module == "jaxgraph":  # from . import _x: a module
                    modules.add(alias.asname or alias.name)
                elif is_private(alias.name):
                    found.append((node.lineno, f"from {'.' * node.level}{node.module} import {alias.name}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "jaxgraph" and alias.asname:
                    modules.add(alias.asname)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and is_private(node.attr)):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return sorted(found)


def package_modules() -> list[pathlib.Path]:
    return sorted(PACKAGE.glob("*.py"))


def sized_files() -> list[pathlib.Path]:
    """Every Python file the line limit holds for: the package, the tests, the benchmarks, the examples."""
    return package_modules() + [p for d in ("tests", "benchmarks", "examples") for p in sorted((ROOT / d).glob("*.py"))]


def test_the_scanner_finds_both_kinds_of_crossing():
    source = ("from . import _stream, _driver\n"
              "from ._stream import _local, current_stream\n"
              "from ._graphs import CUDAGraph as _CUDAGraph\n"
              "def f():\n"
              "    from ._kernel import _BoundLaunch\n"
              "    return _stream._set_current, _driver.driver, _stream.__name__\n")
    assert private_crossings(source) == [(2, "from ._stream import _local"), (5, "from ._kernel import _BoundLaunch"),
                                         (6, "_stream._set_current")]


@pytest.mark.parametrize("path", package_modules(), ids=lambda p: p.name)
def test_no_private_name_crosses_a_module_boundary(path):
    crossings = private_crossings(path.read_text())
    assert crossings == [], (f"{path.name} takes private names of other jaxgraph modules: {crossings}; "
                             "give them a name without an underscore (or an accessor) in their own module")


def test_the_line_limit_covers_tests_benchmarks_and_examples():
    covered = {p.relative_to(ROOT).as_posix() for p in sized_files()}
    assert {"jaxgraph/_graphs.py", "tests/test_graphs.py", "benchmarks/run.py", "examples/gray_scott.py"} <= covered


@pytest.mark.parametrize("path", sized_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_module_is_over_400_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, (f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES}): move a "
                                "concept out into its own module (tests: a file per concept)")


def test_readme_what_lives_where_matches_the_tree():
    text = (ROOT / "README.md").read_text()
    assert "\n## What lives where\n" in text
    section = text.split("\n## What lives where\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`((?:jaxgraph|ffi)/[\w./-]+)`", section))
    files = {f"jaxgraph/{p.name}" for p in package_modules()}
    files |= {f"ffi/{p.name}" for p in (ROOT / "ffi").iterdir() if p.is_file()}
    assert sorted(files - named) == [], "README's What lives where does not name these files"
    assert sorted(named - files) == [], "README's What lives where names files that do not exist"
