"""The public API: ``jaxgraph.__all__`` lists it, ``help(jaxgraph)`` shows it, and every part of it has a docstring."""

import ast
import sys
import inspect
import pathlib
import pickle
import pkgutil
import pydoc
import re
import types
import typing

import numpy as np

import jaxgraph
import jaxgraph.diagnostics
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


def help_sections(text):
    """``{"NAME": ..., "PACKAGE CONTENTS": ..., "CLASSES": ...}``: pydoc's plain-text sections."""
    return dict(re.findall(r"^([A-Z][A-Z ]+)\n(.*?)(?=^[A-Z][A-Z ]+\n|\Z)", text, re.M | re.S))


def test_help_names_the_public_api_and_no_private_module():
    """``help(jaxgraph)`` shows each class and function as ``jaxgraph`` exports it: no
    ``jaxgraph._kernels.kernel.Kernel`` in the class tree, the method resolution orders or the
    "Methods inherited from" lines, and no private module named outside PACKAGE CONTENTS."""
    text = pydoc.render_doc(jaxgraph, renderer=pydoc.plaintext)
    assert "jaxgraph._" not in text, re.findall(r"jaxgraph\._[\w.]*", text)[:5]
    sections = help_sections(text)
    assert {"CLASSES", "FUNCTIONS", "PACKAGE CONTENTS"} <= set(sections), list(sections)
    # PACKAGE CONTENTS is every module file on __path__ (pkgutil.iter_modules), with no hook to leave
    # the private ones out (jaxgraph/__init__.py, _name_the_public_module): it lists them, and only there.
    private = {name for _, name, _ in pkgutil.iter_modules(jaxgraph.__path__) if name.startswith("_")}
    assert {"_cuda", "_kernels", "_graphs", "_jax_interop"} <= private
    contents = sections.pop("PACKAGE CONTENTS")
    assert "compare (package)" in contents and "diagnostics" in contents
    named = {m for m in private for body in sections.values() if re.search(rf"(?<![\w.]){m}\b", body)}
    assert named == set(), f"help(jaxgraph) names private modules outside PACKAGE CONTENTS: {named}"
    for entry in ("class Kernel(KernelLaunching)", "class CUDAGraph(GraphHookMethods", "inherited from KernelLoading:"):
        assert entry in text, entry  # the private bases, named without their modules
    # 3,852 lines for 58 names (of which about 900 are str's methods, listed for the two str enums);
    # a private module's namespace or a large value leaking in would pass this limit.
    assert len(text.splitlines()) < 4500, len(text.splitlines())


def test_diagnostics_help_names_no_private_module():
    text = pydoc.render_doc(jaxgraph.diagnostics, renderer=pydoc.plaintext)
    assert not re.search(r"jaxgraph\._\w+\.", text), re.findall(r"jaxgraph\._\w+\.[\w.]*", text)[:5]
    assert "class CapturePolicy(" in text
    assert jaxgraph.diagnostics.CapturePolicy.__module__ == "jaxgraph.diagnostics"


def exported():
    """``(module, name, object)`` for every class and function of ``jaxgraph`` and ``jaxgraph.diagnostics``."""
    for module in (jaxgraph, jaxgraph.diagnostics):
        for name in module.__all__:
            yield module, name, getattr(module, name)


def test_every_public_name_says_where_users_import_it_and_pickles_by_it():
    for module, name, obj in exported():
        assert obj.__module__ in ("jaxgraph", module.__name__), (module.__name__, name, obj.__module__)
        assert getattr(sys.modules[obj.__module__], obj.__qualname__) is obj, name
        assert pickle.loads(pickle.dumps(obj)) is obj, name       # by reference to jaxgraph.X
    assert repr(jaxgraph.Kernel) == "<class 'jaxgraph.Kernel'>"
    assert pickle.dumps(jaxgraph.BindingMode.BOUND).count(b"jaxgraph\x94") == 1  # the enum's class, by its public name
    assert pickle.loads(pickle.dumps(jaxgraph.BindingMode.BOUND)) is jaxgraph.BindingMode.BOUND
    binding = jaxgraph.BufferBinding("input", 0, jaxgraph.BindingMode.COPIED, 3, "why")
    assert pickle.loads(pickle.dumps(binding)) == binding


def test_class_annotations_still_resolve():
    """A renamed class's string annotations name what its defining module imports (``np.dtype``):
    they are resolved before the renaming, so ``typing.get_type_hints`` still reads them."""
    checked = 0
    for _, name, obj in exported():
        for cls in getattr(obj, "__mro__", ()):
            if cls.__module__.startswith("jaxgraph") and vars(cls).get("__annotations__"):
                typing.get_type_hints(cls)
                checked += 1
    assert checked >= 5
    assert typing.get_type_hints(jaxgraph.Param)["dtype"] == (np.dtype | None)
