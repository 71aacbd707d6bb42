"""The docs site in docs/ builds with no warnings, documents every public name, and its code runs.

Sphinx builds the site with ``-W`` (warnings are errors) from the MyST pages,
the docstrings (autodoc, numpy style), BUILD.md, CHANGELOG.md and the committed
benchmark results (docs/results_pages.py). Code blocks follow the README's
rules (tests/examples/test_readme.py): a ```python block whose first line starts with
``# continues`` runs after the blocks before it on the same page. A chain whose
first line is ``# runs without a GPU`` runs here on the CPU, up to its first block
whose first line starts with ``# continues on a GPU`` (docs/tutorial.md: the `jnp`
stage and the kernel's compilation run here, the stages after them on a GPU);
every chain runs whole on a GPU (the GPU suite).
"""

import importlib.util
import inspect
import pathlib
import re
import subprocess
import sys
import time
import zlib

import pytest

import jaxgraph
from test_readme import chains, python_blocks, run_chain

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
# The hand-written pages (docs/performance/ is generated from benchmarks/results/ at build time).
PAGES = sorted(p for p in DOCS.rglob("*.md") if not {"_build", "performance"} & set(p.relative_to(DOCS).parts))
CPU_MARK = "# runs without a GPU"
GPU_FROM = "# continues on a GPU"   # a CPU chain's part from this block on runs on a GPU only


def page_chains(pages=PAGES):
    """(page, line, code) for every chain of every page."""
    return [(page, line, code) for page in pages for line, code in chains(page.read_text())]


CHAINS = page_chains()
IDS = [f"{p.relative_to(DOCS)}:{line}" for p, line, _ in CHAINS]


def cpu_part(code: str) -> str:
    """What of a chain runs on the CPU: the blocks before the first marked ``# continues on a GPU``."""
    return re.split(rf"^{re.escape(GPU_FROM)}", code, maxsplit=1, flags=re.M)[0]


CPU_CHAINS = [(p, line, cpu_part(code)) for p, line, code in CHAINS if code.lstrip().startswith(CPU_MARK)]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The HTML site, built once with warnings as errors: (output dir, sphinx's output, seconds)."""
    missing = [m for m in ("sphinx", "myst_parser", "furo") if importlib.util.find_spec(m) is None]
    if missing:  # an offline install with --no-deps (the GPU machine) has no docs tools
        pytest.skip(f"the docs extra is not installed ({', '.join(missing)} missing)")
    out = tmp_path_factory.mktemp("html")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html",
                           "-d", str(out / ".doctrees"), str(DOCS), str(out)],
                          capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    log = proc.stdout + proc.stderr
    print(f"docs built in {seconds:.1f} s; {log.count('WARNING')} warnings")
    assert proc.returncode == 0, log[-6000:]
    return out, log, seconds


def test_the_docs_build_with_no_warnings(built):
    out, log, _ = built
    assert "WARNING" not in log, log
    for page in ("index", "getting-started", "api", "performance", "build", "architecture", "changelog",
                 "release", "guide/kernels", "guide/capture", "guide/hooks", "guide/branches-loops", "guide/jit",
                 "guide/graphed-callables", "guide/several-gpus", "guide/several-hosts", "guide/interop",
                 "guide/compare"):
        assert (out / f"{page}.html").is_file(), page


def test_every_public_name_has_a_reference_page(built):
    """api.rst's tables list each public name once (jaxgraph, jaxgraph.diagnostics, jaxgraph.compare),
    each has its page (or, for data, its entry), and the pages show no private name."""
    out, _, _ = built
    sys.path.insert(0, str(DOCS))
    from api_pages import public_objects  # docs/api_pages.py, which docs/conf.py uses too

    text = (DOCS / "api.rst").read_text()
    listed, module = [], "jaxgraph"
    for line in text.splitlines():
        if m := re.match(r"\.\. currentmodule:: ([\w.]+)$", line):
            module = m.group(1)
        elif m := re.match(r"   (\w+)$", line) or re.match(r"\.\. data:: (\w+)$", line):
            listed.append(f"{module}.{m.group(1)}")
    assert len(listed) == len(set(listed)), "a name listed twice"
    assert sorted(listed) == sorted(public_objects()), set(listed) ^ set(public_objects())
    pages = {p.stem.removesuffix("-function"): p.read_text() for p in (out / "generated").glob("*.html")}
    api = (out / "api.html").read_text()
    for name in listed:
        assert f'id="{name}"' in pages.get(name, api), name
    for member in ("jaxgraph.CUDAGraph.replay", "jaxgraph.CUDAGraph.register_replay_start_hook",
                   "jaxgraph.Kernel.jax_call", "jaxgraph.Replayable.bindings", "jaxgraph.DeviceArray.nbytes",
                   "jaxgraph.Param.name", "jaxgraph.Kernel.params"):
        page = pages[member.rsplit(".", 1)[0]]
        assert page.count(f'id="{member}"') == 1, member        # methods, inherited ones too; each once
    for name, page in pages.items():
        body = re.sub(r"<[^>]+>", "", page[page.find("<article"):page.find("</article>")])
        for private in ("KernelLaunching", "GraphHookMethods", "GraphIntrospection", "ConditionalMethods",
                        "_Region", "_token", "Bases:"):
            assert private not in body, (name, private)
        assert not re.search(r"jaxgraph\._\w", body), name   # native_module's "jaxgraph._<name>" is no name
    for cls in ("Replayable", "GraphedLoop", "GraphedCallable", "ShardedGraph", "DeviceArray"):
        assert re.search(rf'id="jaxgraph\.{cls}"[^>]*>.*?</dt>', pages[f"jaxgraph.{cls}"], re.S).group(0).count("args") == 0, cls


def test_reference_pages_read_the_source_that_defines_each_name(built):
    """jaxgraph/__init__.py names ``jaxgraph`` as the module of every public class and function
    (``jaxgraph.Kernel``, not its private module's path); docs/conf.py points autodoc
    and viewcode at the module that defines each one. So every page links to its source, a
    class's members come in source order, and enum members keep their text."""
    out, _, _ = built
    sys.path.insert(0, str(DOCS))
    from api_pages import attributes_section, public_objects

    pages = {p.stem.removesuffix("-function"): p.read_text() for p in (out / "generated").glob("*.html")}
    checked = 0
    for name, obj in public_objects().items():
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        page = pages[name]
        header = re.search(rf'id="{re.escape(name)}"[^>]*>.*?</dt>', page, re.S).group(0)
        assert "viewcode-link" in header, f"{name}: no [source] link"
        if inspect.isclass(obj):  # members the "Attributes" section lists come first, from the docstring
            described = attributes_section(obj.__doc__)
            own = [m for m in vars(obj) if not m.startswith("_") and m not in described and f'id="{name}.{m}"' in page]
            where = [page.index(f'id="{name}.{m}"') for m in own]
            assert where == sorted(where), f"{name}: members not in source order: {own}"
        checked += 1
    assert checked >= 50
    assert "no copy" in pages["jaxgraph.BindingMode"] and "cudaGraphLaunch" in pages["jaxgraph.ReplayPath"]


def test_numpy_and_jax_names_link_to_their_docs(built):
    """References to NumPy and JAX names on the API pages (a docstring's type, an annotation, a
    ``:class:`` role) link to their pages on numpy.org and docs.jax.dev, through the inventories
    docs/inventories.py writes into docs/_inv/. docs/conf.py makes a reference no inventory holds
    a warning, so the build above fails on one; here, none shows as plain code."""
    out, _, _ = built
    sites = ("https://numpy.org/doc/stable/", "https://docs.jax.dev/en/latest/")
    xref = re.compile(r'(<a [^>]*>)?<code class="xref py[^"]*"><span class="pre">((?:numpy|np|jax|jnp)\.[^<]*)</span>'
                      r'(.*?)</code>')
    linked, unlinked = set(), []
    for page in sorted((out / "generated").glob("*.html")):
        text = page.read_text()
        linked |= {name for site, name in re.findall(rf'href="({"|".join(sites)})[^"#]*#([\w.]+)"', text)}
        unlinked += [f"{page.stem}: {name}{rest and ' ...'}" for link, name, rest in xref.findall(text)
                     if not link or rest]
    assert unlinked == [], f"NumPy/JAX names shown without a link (add them to docs/inventories.py): {unlinked}"
    assert {"numpy.ndarray", "numpy.dtype", "jax.Array", "jax.ShapeDtypeStruct", "jax.Device",
            "jax.sharding.Mesh"} <= linked, linked


def test_the_inventories_are_what_docs_inventories_py_writes():
    """docs/_inv/numpy.inv and jax.inv hold exactly docs/inventories.py's entries (edited there, then
    written by running it), each pointing at the page named after it."""
    sys.path.insert(0, str(DOCS))
    import inventories

    def entries(data: bytes) -> tuple[list[str], str]:
        header = data.split(b"\n", 4)
        return [h.decode() for h in header[:4]], zlib.decompress(header[4]).decode()

    assert set(inventories.INVENTORIES) == {"numpy", "jax"}
    for name, (project, table) in inventories.INVENTORIES.items():
        committed = (DOCS / "_inv" / f"{name}.inv").read_bytes()
        assert entries(committed) == entries(inventories.inventory(project, table)), \
            f"docs/_inv/{name}.inv is stale: run python3 docs/inventories.py"
        for obj, (role, uri) in table.items():
            assert obj.startswith(f"{name}.") and role in ("py:class", "py:function") and uri.endswith(".html#$")
            page = uri.removesuffix(".html#$").rsplit("/", 1)[-1]
            assert page in (obj, obj.rsplit(".", 1)[0]), (obj, uri)   # its own page, or its module's


def test_every_results_file_has_its_page(built):
    out, _, _ = built
    results_dir = REPO / "benchmarks" / "results"
    results = sorted(p.relative_to(results_dir) for p in results_dir.rglob("*.md"))
    results.remove(pathlib.Path("README.md"))
    assert len(results) >= 20
    index = (out / "performance" / "index.html").read_text()
    for rel in results:
        page = out / "performance" / rel.with_suffix(".html")
        assert page.is_file(), rel
        heading = (results_dir / rel).read_text().split("\n", 1)[0].lstrip("# ").split("`")[0][:30]
        assert heading.replace("&", "&amp;").replace("'", "&#8217;") in page.read_text(), (rel, heading)
        if (results_dir / rel).with_suffix(".png").is_file():
            assert list((out / "_images").glob(f"{rel.stem}*.png")), rel.with_suffix(".png")
        assert rel.with_suffix(".html").as_posix() in index, rel


@pytest.mark.parametrize("page, line, code", CHAINS, ids=IDS)
def test_every_code_block_compiles(page, line, code):
    compile(code, f"{page}:{line}", "exec")


def test_getting_started_has_a_cpu_snippet_and_every_guide_page_has_code():
    assert any(page.name == "getting-started.md" and "lowering_platforms" in code for page, _, code in CPU_CHAINS)
    for page in sorted((DOCS / "guide").glob("*.md")):
        assert python_blocks(page.read_text()), f"{page.name} has no python block"


@pytest.mark.parametrize("page, line, code", CPU_CHAINS, ids=[f"{p.relative_to(DOCS)}:{n}" for p, n, _ in CPU_CHAINS])
def test_cpu_snippets_run(page, line, code, tmp_path):
    out = run_chain(code, tmp_path)
    assert "True" in out, out


@pytest.mark.gpu
@pytest.mark.parametrize("page, line, code", CHAINS, ids=IDS)
def test_docs_snippets_run(page, line, code, tmp_path):
    print(f"{page.relative_to(DOCS)} chain from line {line}:\n{run_chain(code, tmp_path)}")


def test_every_repository_path_the_docs_name_exists():
    """A file named in backticks (`benchmarks/run.py`, `tests/floors.sh`) is there: moves show up here."""
    missing = []
    for page in PAGES + [REPO / "README.md", REPO / "BUILD.md"]:
        for path in re.findall(r"`((?:examples|benchmarks|tests|ffi|jaxgraph|cmake|docs)/[\w./-]*\w)`", page.read_text()):
            if "<" not in path and not list(REPO.glob(path)):
                missing.append(f"{page.relative_to(REPO)}: {path}")
    assert missing == [], missing
