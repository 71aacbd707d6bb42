"""The public API: ``jaxgraph.__all__`` lists it, ``help(jaxgraph)`` shows it, and every part of it has a docstring."""

import ast
import inspect
import pathlib
import pydoc
import re
import types

import jaxgraph
from support.public_members import public_members


def public_names():
    """Every public name the package exposes, whether or not ``__all__`` lists it."""
    return {n for n, v in vars(jaxgraph).items()
            if not n.startswith("_") and not isinstance(v, types.ModuleType)}


def test_all_lists_every_public_name_once_and_each_imports():
    assert len(jaxgraph.__all__) == len(set(jaxgraph.__all__))
    assert set(jaxgraph.__all__) == public_names()
    namespace = {}
    exec("from jaxgraph import *", namespace)
    assert {n for n in namespace if n != "__builtins__"} == set(jaxgraph.__all__)


def test_help_shows_the_api():
    text = pydoc.render_doc(jaxgraph, renderer=pydoc.plaintext)
    for name in ("class Kernel", "class CUDAGraph", "make_graphed_callables(", "replayable(", "capture_per_device("):
        assert name in text, name


def test_every_public_function_class_method_and_property_has_a_docstring():
    missing = []
    for name in jaxgraph.__all__:
        obj = getattr(jaxgraph, name)
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if inspect.isclass(obj):
            missing += [f"{name}.{m}" for m, f in public_members(obj) if not (f.__doc__ or "").strip()]
    assert missing == [], f"public API without a docstring: {missing}"


# What counts as reaching into jaxgraph's internals from a test file.
PRIVATE_USE = re.compile(r"jaxgraph\._[a-z]|from jaxgraph import [\w, ]*\b_[a-z]|from support\.internals import|from support import internals\b"
                         r"|\._create\(")


def test_tests_of_internals_are_listed():
    """A test file that reaches into jaxgraph's private modules says so, in its docstring and in
    tests/README.md's table (so that moving a private name shows which tests to edit)."""
    tests = pathlib.Path(__file__).resolve().parents[1]
    files = {p.relative_to(tests).as_posix(): p for p in tests.rglob("*.py")}
    listed = set(re.findall(r"^\| `([\w./]+\.py)` \|", (tests / "README.md").read_text(), re.M))
    me = pathlib.Path(__file__).resolve().relative_to(tests).as_posix()
    users = {name for name, p in files.items() if PRIVATE_USE.search(p.read_text())} - {me}
    assert "support/internals.py" in users and "jax_interop/test_jax_lowering.py" in users  # the pattern finds what it must
    missing = sorted(users - listed)
    assert not missing, f"list these in tests/README.md's table of tests of internals: {missing}"
    assert listed <= set(files), "tests/README.md lists a file that is gone"
    for name in sorted(users - {"support/internals.py"}):
        doc = ast.get_docstring(ast.parse(files[name].read_text())) or ""
        assert "Tests internals" in doc, f"{name}: say in the module docstring which internals it tests and why"


def test_dir_shows_the_public_api_not_the_private_modules():
    names = dir(jaxgraph)
    assert set(jaxgraph.__all__) <= set(names)
    assert [n for n in names if n.startswith("_") and not n.startswith("__")] == []
    text = pydoc.render_doc(jaxgraph, renderer=pydoc.plaintext)
    assert "SUBMODULES" not in text


def exception_classes():
    """Every exception class defined in jaxgraph/, outside the comparison tool (whose ``StartError`` and
    ``WorkerGone`` never leave it: ``jaxgraph.compare.run`` reports them as a ``Failure``)."""
    package = pathlib.Path(jaxgraph.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        if "compare" in path.relative_to(package).parts:
            continue
        found += re.findall(r"^class (\w+)\((?:\w+\.)*\w*(?:Error|Exception|Warning)\b", path.read_text(), re.M)
    return found


def test_errors_are_public_and_named_as_users_import_them():
    classes = exception_classes()
    assert {"CompileError", "CudaError", "CudaUnavailableError"} <= set(classes)   # the scan finds them
    for name in classes:
        assert name in jaxgraph.__all__, f"{name} is raised to users but not importable as jaxgraph.{name}"
        cls = getattr(jaxgraph, name)
        assert cls.__module__ == "jaxgraph" and f"{cls.__module__}.{cls.__qualname__}" == f"jaxgraph.{name}"
        assert repr(cls) == f"<class 'jaxgraph.{name}'>", repr(cls)
    assert str(jaxgraph.CompileError) == "<class 'jaxgraph.CompileError'>"
    text = pydoc.render_doc(jaxgraph, renderer=pydoc.plaintext)
    for private in ("jaxgraph._kernels.compile.CompileError", "jaxgraph._cuda.driver.CudaError",
                    "jaxgraph._cuda.driver.CudaUnavailableError"):
        assert private not in text, private
