"""The package's shape, checked on the source (CPU, no import of jaxgraph needed).

- The package is four layers, one subpackage each, lowest first: ``_cuda``
  (driver, streams, memory, arrays), ``_kernels`` (compile, load, launch),
  ``_graphs`` (capture, CUDAGraph, conditional nodes) and ``_jax_interop``
  (inside ``jax.jit``: kernel calls, replay, and what stands on replay). A module
  imports only from its own layer and those below; ``jaxgraph/__init__.py``
  re-exports from all of them.
- Tools stand on top of the public API, outside the layers: ``jaxgraph/compare/``
  (``python -m jaxgraph.compare``) imports only ``jaxgraph`` itself and its own
  modules, never a layer's module.
- No import cycles between modules.
- No private name crosses a package boundary: no ``from ..x.y import _name`` and
  no ``y._name`` on a module of another layer. A module that needs something of
  another layer gets it under a name without an underscore.
- The docs' "What lives where" (docs/architecture.md) names every module of
  ``jaxgraph/`` and every file of ``ffi/``, and nothing that does not exist.
- Outside the package, benchmarks and examples use the public API and
  ``jaxgraph.diagnostics`` only; so do the tests, except the unit tests of
  internal modules named in ``INTERNAL_UNIT_TESTS``.

Tests internals (listed in tests/README.md): the module names of ``jaxgraph/``, read as
source and never imported; the layering is a property of the source tree.

How large a module grows is docs/architecture.md's guidance (one concept per module; past
~600 lines is a question to ask), not a test.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = next(p for p in pathlib.Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
PACKAGE = ROOT / "jaxgraph"
LAYERS = ("_cuda", "_kernels", "_graphs", "_jax_interop")  # lowest first
# Public modules beside jaxgraph/__init__.py, above every layer: the diagnostics door.
FACES = ("diagnostics",)
TOOLS = ("compare",)  # above the public API: users' tools built on it, not part of the core

# The one import that goes up a layer: Kernel.jax_call is the Kernel's public
# method, and its lowering into an XLA custom call is JAX interop. The import is
# deferred to the call, so the kernel layer still loads without the JAX layer.
DEFERRED_UP = {("jaxgraph._kernels.kernel", "jaxgraph._jax_interop.kernel_call")}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_files() -> list[pathlib.Path]:
    return sorted(PACKAGE.rglob("*.py"))


def layer_of(module: str) -> int:
    """The layer's index, lowest 0; ``jaxgraph`` itself stands above every layer, a tool above it."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in TOOLS:
        return len(LAYERS) + 1
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] not in FACES else len(LAYERS)


def imports(module: str, source: str, known: set[str]) -> list[tuple[str, bool, ast.ImportFrom | ast.Import]]:
    """``(target module, deferred, node)`` for each import of a jaxgraph module in ``source``.

    ``deferred`` is True for an import inside a function. A name imported from a
    package is the module of that name where there is one (``from . import driver``).
    """
    tree = ast.parse(source)
    is_package = module.count(".") == 0 or module.rsplit(".", 1)[-1] in LAYERS + TOOLS
    here = module if is_package else module.rsplit(".", 1)[0]
    deferred_nodes = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                      for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != "jaxgraph":
                continue
            for alias in node.names:
                target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                if target in known and target != module:
                    found.append((target, id(node) in deferred_nodes, node))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known and alias.name != module:
                    found.append((alias.name, id(node) in deferred_nodes, node))
    return found


def private_crossings(module: str, source: str, known: set[str]) -> list[tuple[int, str]]:
    """``(line, what)`` for each private name ``source`` takes from a module of another package."""
    def package(name: str) -> str:
        return name if name.count(".") < 2 and name.rsplit(".", 1)[-1] in LAYERS + TOOLS + ("jaxgraph",) else \
            name.rsplit(".", 1)[0]

    tree = ast.parse(source)
    mine = package(module)
    bound: dict[str, str] = {}  # local name -> module of another package
    found = []
    for target, _, node in imports(module, source, known):
        if package(target) == mine:
            continue
        for alias in node.names:
            if isinstance(node, ast.ImportFrom) and target.endswith("." + alias.name):
                bound[alias.asname or alias.name] = target  # from ..x import y: a module
            elif isinstance(node, ast.ImportFrom) and is_private(alias.name):
                found.append((node.lineno, f"{alias.name} from {target}"))
            elif isinstance(node, ast.Import) and alias.asname:
                bound[alias.asname] = target
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and is_private(node.attr)):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return sorted(set(found))


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


SOURCES = {module_name(p): p.read_text() for p in package_files()}
KNOWN = set(SOURCES)


def import_edges(sources: dict[str, str], known: set[str]) -> dict[str, set[str]]:
    return {m: {t for t, _, _ in imports(m, s, known)} for m, s in sources.items()}


def upward_imports(sources: dict[str, str], known: set[str]) -> list[tuple[str, str, bool]]:
    return sorted((m, t, deferred) for m, s in sources.items() for t, deferred, _ in imports(m, s, known)
                  if layer_of(t) > layer_of(m))


def test_the_scanners_find_what_they_look_for():
    sources = {
        "jaxgraph": "from ._jax_interop.replay import run\n",
        "jaxgraph._cuda": "",
        "jaxgraph._cuda.driver": "from . import stream as _stream\nx = _stream._private\n",
        "jaxgraph._cuda.stream": "from .driver import check\n",
        "jaxgraph._graphs": "",
        "jaxgraph._graphs.capture_contexts": ("from .._cuda import driver as _driver, stream\n"
                                     "from .._cuda.driver import _check, check\n"
                                     "y = _driver._handle, stream.__name__\n"
                                     "def f():\n    from .._jax_interop.replay import run\n"),
        "jaxgraph._jax_interop": "",
        "jaxgraph._jax_interop.replay": "from .._graphs.capture_contexts import f\n",
    }
    known = set(sources)
    assert upward_imports(sources, known) == [("jaxgraph._graphs.capture_contexts", "jaxgraph._jax_interop.replay", True)]
    assert cycles(import_edges(sources, known)) == [
        ["jaxgraph._cuda.driver", "jaxgraph._cuda.stream"],
        ["jaxgraph._graphs.capture_contexts", "jaxgraph._jax_interop.replay"]]
    capture = "jaxgraph._graphs.capture_contexts"
    assert private_crossings(capture, sources[capture], known) == [(2, "_check from jaxgraph._cuda.driver"),
                                                                   (3, "_driver._handle")]
    # Within one package, private names are the package's own business.
    driver = "jaxgraph._cuda.driver"
    assert private_crossings(driver, sources[driver], known) == []


def test_every_module_lives_in_a_layer():
    stray = sorted(m for m in KNOWN if m != "jaxgraph" and m.split(".")[1] not in LAYERS + FACES + TOOLS)
    assert stray == [], f"modules outside the layers {LAYERS}: {stray}; move each into the layer it belongs to"
    assert {f"jaxgraph.{layer}" for layer in LAYERS} <= KNOWN


def test_layers_import_only_downward():
    found = upward_imports(SOURCES, KNOWN)
    unexpected = [(m, t) for m, t, deferred in found if not (deferred and (m, t) in DEFERRED_UP)]
    assert unexpected == [], (f"imports that go up a layer (order {LAYERS}): {unexpected}; move the code "
                              "into the lower layer or hand the lower layer what it needs")
    assert {(m, t) for m, t, _ in found} == DEFERRED_UP, "DEFERRED_UP names an import that is gone: drop it"


def test_tools_use_only_the_public_api():
    tools = [m for m in KNOWN if m.count(".") >= 1 and m.split(".")[1] in TOOLS]
    assert tools, f"no tool modules found under {TOOLS}"
    into_layers = sorted((m, t) for m in tools for t, _, _ in imports(m, SOURCES[m], KNOWN)
                         if layer_of(t) < len(LAYERS))
    assert into_layers == [], f"a tool imports jaxgraph's layers (use the public jaxgraph API): {into_layers}"


def test_no_import_cycles():
    assert cycles(import_edges(SOURCES, KNOWN)) == []


@pytest.mark.parametrize("module", sorted(KNOWN))
def test_no_private_name_crosses_a_package_boundary(module):
    crossings = private_crossings(module, SOURCES[module], KNOWN)
    assert crossings == [], (f"{module} takes private names of another package: {crossings}; give them a name "
                             "without an underscore (or an accessor) in their own module")


def test_docs_what_lives_where_matches_the_tree():
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert "\n## What lives where\n" in text
    section = text.split("\n## What lives where\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`((?:jaxgraph|ffi)/[\w./-]+)`", section))
    files = {p.relative_to(ROOT).as_posix() for p in package_files()}
    files |= {p.relative_to(ROOT).as_posix() for p in (ROOT / "ffi").rglob("*") if p.is_file()}
    files |= {f"ffi/{p.name}/" for p in (ROOT / "ffi").iterdir() if p.is_dir()}  # an extension's folder
    files |= {f"jaxgraph/{layer}/" for layer in LAYERS + TOOLS}  # each folder, named where its table starts
    assert sorted(files - named) == [], "docs/architecture.md's What lives where does not name these files"
    assert sorted(named - files) == [], "docs/architecture.md's What lives where names files that do not exist"


# ----------------------------------------------------------------------------
# ffi/: one folder an extension, the shared headers at the top
# ----------------------------------------------------------------------------

EXTENSIONS = ("replay", "launch", "device_loop")  # ffi/<name>/<name>.cc builds jaxgraph._<name>


def ffi_includes() -> dict[str, set[str]]:
    """ffi file (relative to ffi/) -> the project headers it includes, resolved as the compiler does
    (the including file's folder first, then ffi/ on the include path)."""
    ffi = ROOT / "ffi"
    found = {}
    for path in ffi.rglob("*"):
        if path.suffix not in (".h", ".cc"):
            continue
        names = set()
        for name in re.findall(r'^#include "([^"]+)"', path.read_text(), re.M):
            for candidate in (path.parent / name, ffi / name):
                if candidate.is_file():
                    names.add(candidate.resolve().relative_to(ffi.resolve()).as_posix())
                    break
        found[path.relative_to(ffi).as_posix()] = names
    return found


def test_ffi_has_a_folder_per_extension_and_shared_headers_at_the_top():
    ffi = ROOT / "ffi"
    assert sorted(p.name for p in ffi.iterdir() if p.is_dir()) == sorted(EXTENSIONS)
    for name in EXTENSIONS:
        assert (ffi / name / f"{name}.cc").is_file()
    assert all(p.suffix == ".h" for p in ffi.iterdir() if p.is_file()), "only shared headers at ffi/'s top"


def test_ffi_includes_stay_in_their_extension():
    includes = ffi_includes()
    assert includes, "no ffi sources found"
    for source, headers in includes.items():
        home = source.split("/", 1)[0] if "/" in source else None  # None: a shared header
        for header in headers:
            owner = header.split("/", 1)[0] if "/" in header else None
            if home is None:
                assert owner is None, f"shared header ffi/{source} includes ffi/{header} of an extension"
            else:
                assert owner in (None, home), f"ffi/{source} includes ffi/{header}, another extension's header"


# ----------------------------------------------------------------------------
# Outside the package: jaxgraph.diagnostics is the door to the internals
# ----------------------------------------------------------------------------

# Tests that unit-test an internal module (its own functions, or one stood in for) and so import
# jaxgraph's private modules, each with what for. Anything else a test, benchmark or example needs
# of the internals (counters, the capture policy, native handles, live pools, a graph's template,
# kernel ids, the loop settings, stand-ins for a machine without a GPU) is jaxgraph.diagnostics.
INTERNAL_UNIT_TESTS = {
    "tests/cuda/test_array.py": "_cuda.memory's deferred frees (hold_frees, when_no_capture, release_frees)",
    "tests/cuda/test_driver.py": "_cuda.driver and _cuda.native themselves, the extensions as modules",
    "tests/graphs/test_capture_end_errors.py": "capture bookkeeping with the driver stood in for",
    "tests/graphs/test_capture_threads.py": "per-thread streams and captures, a capture faked",
    "tests/graphs/test_conditional_errors.py": "conditional predicates and views, NVRTC stood in for",
    "tests/graphs/test_generator.py": "the generator's own CUDA source compiled on a CPU",
    "tests/graphs/test_graph_views.py": "_graphs.inspect_render on made-up node data",
    "tests/graphs/test_graphs.py": "the native graph launch stood in for (a failing launch)",
    "tests/jax_interop/test_agreement.py": "_jax_interop.processes' agreement on a fake key-value store",
    "tests/jax_interop/test_copy_ring.py": "_graphs.copy_ring's kernels compiled on a CPU",
    "tests/jax_interop/test_graphed.py": "graphed callables' JAX plumbing (_vjp_backward)",
    "tests/jax_interop/test_jax_kernel_call.py": "kernel_call's raw jaxgraph_launch binding (a wrong parameter count)",
    "tests/jax_interop/test_jax_callback.py": "the host-callback path over a stand-in ReplaySource",
    "tests/jax_interop/test_loop_counts.py": "_graphed_loops._check_count",
    "tests/jax_interop/test_loop_exact_stop.py": "the exact stop's checks, snapshot and watch kernels",
    "tests/jax_interop/test_loop_grad.py": "_graphs.checkpoint_loop and _jax_interop.loop_grad themselves",
    "tests/jax_interop/test_loop_stops.py": "_graphed_loops._check_every, a loop over a spec replayable",
    "tests/jax_interop/test_loops.py": "_graphed_loops' argument checks, _graphs.loop_build's kernels",
    "tests/jax_interop/test_recorded_lifetime.py": "what replayable and kernel_call keep for XLA's recordings",
    "tests/jax_interop/test_multiprocess.py": "_jax_interop.processes, sharded.device_ordinals",
    "tests/jax_interop/test_replay_boundary.py": "replay_boundary's typed codes (binding_from_row, paths_from_codes)",
    "tests/jax_interop/test_replay_state.py": "replay_boundary.ReplayState",
    "tests/jax_interop/test_sharded.py": "sharded.cuda_ordinal, device_ordinals, replay_boundary.varying_axes",
    "tests/kernels/test_arguments.py": "_kernels.signature.scalar_word",
    "tests/kernels/test_kernel.py": "_kernels.signature's parser",
    "tests/kernels/test_kernel_cache.py": "_kernels.cubin_cache, its NVRTC identity replaced",
    "tests/kernels/test_kernel_errors.py": "_kernels.compile with NVRTC patched, _kernels.cubin",
    "tests/kernels/test_kernel_launch.py": "eager launches' kept configurations, the driver call stubbed",
    "tests/kernels/test_launch_devices.py": "eager launches' device checks with arrays and streams made by hand",
    "tests/kernels/test_launch_limits.py": "_kernels.launch_limits, device limits stood in for",
    "tests/kernels/test_packer.py": "_kernels.packer, the driver call stubbed",
    "tests/kernels/test_signature_properties.py": "_kernels.signature's parser on generated signatures",
    "tests/support/conditional_helpers.py": "hand-made conditional nodes patched into a replay",
    "tests/support/internals.py": "replayables and sharded graphs from specs, with no graph behind them",
    "tests/support/launch_stubs.py": "the stubbed launch of test_kernel_launch.py and test_launch_limits.py",
    "tests/support/loop_grad_helpers.py": "checkpoint_loop's programs on a numpy machine",
}

_DOTTED_PRIVATE = re.compile(r"jaxgraph\._[a-z]\w*(\.\w+)*")
_CODE_IMPORTING_PRIVATE = re.compile(r"^\s*(from|import)\s+jaxgraph\._[a-z]", re.M)


def private_uses(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for each use of a private jaxgraph module in a file outside the package.

    An import of one (``import jaxgraph._x``, ``from jaxgraph._x import y``,
    ``from jaxgraph import _x``), an attribute ``jaxgraph._x``, a name
    ``"jaxgraph._x..."`` handed to a call (``monkeypatch.setattr``,
    ``importlib.import_module``, ``parametrize``), or Python source in a string
    (for a subprocess) that imports one. Docstrings and comments that name a
    private module are no use of it.
    """
    tree = ast.parse(source)
    call_arguments = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.Call)
                      for arg in [*node.args, *(k.value for k in node.keywords)] for sub in ast.walk(arg)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names
                      if a.name.split(".")[0] == "jaxgraph" and "." in a.name and is_private(a.name.split(".")[1])]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            parts = node.module.split(".")
            if parts[0] == "jaxgraph" and len(parts) > 1 and is_private(parts[1]):
                found.append((node.lineno, f"from {node.module} import"))
            elif node.module == "jaxgraph":
                found += [(node.lineno, f"from jaxgraph import {a.name}") for a in node.names if is_private(a.name)]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "jaxgraph"
              and is_private(node.attr)):
            found.append((node.lineno, f"jaxgraph.{node.attr}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) in call_arguments and _DOTTED_PRIVATE.fullmatch(node.value):
                found.append((node.lineno, repr(node.value)))
            elif _CODE_IMPORTING_PRIVATE.search(node.value):
                found.append((node.lineno, "source in a string that imports jaxgraph._*"))
    return sorted(set(found))


def files_using_internals(*folders: str) -> dict[str, list[tuple[int, str]]]:
    """Repository-relative path -> its private uses, for every Python file under ``folders`` that has any."""
    found = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            uses = private_uses(path.read_text())
            if uses:
                found[path.relative_to(ROOT).as_posix()] = uses
    return found


def test_the_private_use_scanner_finds_what_it_looks_for():
    source = "\n".join([
        '"""A docstring naming jaxgraph._cuda.driver is no use of it."""',  # 1
        "import jaxgraph",                                                 # 2
        "import jaxgraph._launch as ext",                                  # 3
        "from jaxgraph._cuda import driver",                               # 4
        "from jaxgraph import _replay, diagnostics",                       # 5
        "from jaxgraph.diagnostics import counters",                       # 6
        "x = jaxgraph._graphs.cuda_graph",                                 # 7
        "monkeypatch.setattr('jaxgraph._kernels.compile.nvrtc_version', f)",  # 8
        "SCRIPT = 'import sys\\nfrom jaxgraph._jax_interop import kernel_call\\n'",  # 9
        "NAMES = ('jaxgraph._cuda.driver.CudaError',)  # data, not handed to a call",  # 10
        "y = jaxgraph.__version__, jaxgraph.diagnostics.counters()",       # 11
        "",
    ])
    assert [line for line, _ in private_uses(source)] == [3, 4, 5, 7, 8, 9]
    assert private_uses("import jaxgraph\nfrom jaxgraph import diagnostics\n") == []


def test_benchmarks_and_examples_use_only_the_public_api_and_diagnostics():
    found = files_using_internals("benchmarks", "examples")
    assert found == {}, (f"benchmarks and examples reach into jaxgraph's private modules: {found}; use the public "
                         "API, or jaxgraph.diagnostics for what only the internals show or set (add it there, "
                         "documented, if it is missing)")


def test_only_unit_tests_of_internal_modules_import_them():
    found = files_using_internals("tests")
    found.pop(pathlib.Path(__file__).resolve().relative_to(ROOT).as_posix())  # its scanner test's sources: data
    listed = set(INTERNAL_UNIT_TESTS)
    unlisted = {name: uses for name, uses in found.items() if name not in listed}
    assert unlisted == {}, (f"tests that reach into jaxgraph's private modules: {unlisted}; read or set what they "
                            "need through jaxgraph.diagnostics, or, for a unit test of an internal module, add the "
                            "file to INTERNAL_UNIT_TESTS with what it tests")
    stale = sorted(name for name in INTERNAL_UNIT_TESTS if name not in found)
    assert stale == [], f"INTERNAL_UNIT_TESTS names files that no longer import jaxgraph's internals: {stale}"
