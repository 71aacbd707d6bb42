"""Sphinx configuration for jaxgraph's docs (python3 -m sphinx -W -b html docs docs/_build/html).

Pages are MyST markdown. Three kinds of page are made here at build time, from
files others write, so that nothing is copied by hand:

- ``performance/<stem>.md`` for every ``benchmarks/results/<stem>.md`` (and its
  ``<stem>.png`` plot where there is one): the results as committed, links
  between them kept, links to JSON files left as text;
- ``generated/jaxgraph.<name>.rst``, one page per public name, which
  ``sphinx.ext.autosummary`` writes from the tables in ``api.rst`` (with
  ``_templates/autosummary/``); ``tests/examples/test_docs.py`` checks that the
  tables list every name in ``jaxgraph.__all__``, ``jaxgraph.diagnostics.__all__``
  and ``jaxgraph.compare.__all__`` (``api_pages.py``), and
  ``tests/examples/test_api_docs.py`` that their docstrings parse;
- ``build.md`` and ``changelog.md`` include ``BUILD.md`` and ``CHANGELOG.md``.

``when-it-helps.md`` is not made here: ``docs/measured_pages.py`` fills it from
``templates/when-it-helps.md`` and a committed benchmark run, and it is
committed as written (``templates/`` is left out of the site).
"""

import enum
import inspect
import pathlib
import re
import shutil
import sys
import types

DOCS = pathlib.Path(__file__).resolve().parent
REPO = DOCS.parent
sys.path.insert(0, str(DOCS))

import jaxgraph  # noqa: E402  (installed: autodoc needs the package, not the extension)
import jaxgraph.diagnostics  # noqa: E402,F401  (DEFINED_IN below reads its names too)
from sphinx.util.inspect import safe_getattr  # noqa: E402

from api_pages import PUBLIC_MODULES, attributes_section, internal_constructor, is_private  # noqa: E402
from results_pages import write_results_pages  # noqa: E402

project = "jaxgraph"
author = "the jaxgraph authors"
copyright = "2026, the jaxgraph authors"
version = release = jaxgraph.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_parser",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "templates", "_templates", "_inv"]  # templates: docs/measured_pages.py fills them;
# _templates: autosummary's; _inv: intersphinx inventories
root_doc = "index"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# numpy-style docstrings, as the code has
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = False  # an "Attributes" section as entries of their own, each with its text
napoleon_preprocess_types = True  # "tuple of int", "numpy.dtype or None": each name linked where it can be
autodoc_typehints = "description"
autodoc_member_order = "bysource"
# Members only: no "Bases:" line (CUDAGraph's and Kernel's bases are private mixins, whose
# methods each class's page lists as its own: :inherited-members: in _templates/autosummary/).
autodoc_default_options = {"members": True}
autodoc_typehints_description_target = "documented_params"  # no "args (Any)" for a factory-made class

# One page per public name (api.rst's tables), written at build time into generated/.
autosummary_generate = True
autosummary_generate_overwrite = True
autosummary_imported_members = False
templates_path = ["_templates"]
# graph/Graph, stream/Stream, switch/Switch: distinct page names where a file system folds case.
autosummary_filename_map = {f"jaxgraph.{n}": f"jaxgraph.{n}-function"
                            for n in ("graph", "stream", "switch")}

# Links to Python, NumPy and JAX from local inventories only: the build must not need the
# network (CI has none). python.inv is Debian's copy of Python's; numpy.inv and jax.inv are
# written by docs/inventories.py, for the names our pages refer to (neither site's objects.inv
# can be fetched here). docs/_inv/README.md says how to refresh them.
_INVENTORIES = {
    "python": "https://docs.python.org/3",
    "numpy": "https://numpy.org/doc/stable",
    "jax": "https://docs.jax.dev/en/latest",
}
intersphinx_mapping = {name: (url, str(DOCS / "_inv" / f"{name}.inv"))
                       for name, url in _INVENTORIES.items() if (DOCS / "_inv" / f"{name}.inv").is_file()}
intersphinx_timeout = 5
# A reference to a NumPy or JAX name that no inventory holds is a warning (an error under -W),
# not a name shown unlinked: add it to docs/inventories.py. Other unresolved references (prose
# types such as "callable" or "device array" in numpy-style docstrings) stay plain text.
nitpicky = True
nitpick_ignore_regex = [(r".*", r"(?!(numpy|np|jax|jnp)\.).*")]


def _signature_as_called(app, what, name, obj, options, signature, return_annotation):
    """Signatures as users call them: none for a class whose constructor is internal (its page
    says which function makes one), and no argument only jaxgraph passes (``_token``)."""
    if signature is None or not name.startswith("jaxgraph"):
        return None
    if what in ("class", "exception"):
        return ("", return_annotation) if internal_constructor(obj) else None
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return None
    for p in params:  # "(x, *, _token=None)" -> "(x)"; keeps what autodoc wrote for the rest
        if is_private(p.name):
            signature = signature.replace(f", {p.name}={p.default!r}", "").replace(f", {p.name}", "")
    return signature.replace(", *)", ")").replace("(*)", "()"), return_annotation


_documented_attributes = set()  # the class being documented: its "Attributes" section's names


def _note_attributes(app, what, name, obj, options, lines):
    if what in ("class", "exception"):
        _documented_attributes.clear()
        _documented_attributes.update(attributes_section(obj.__doc__))


def _skip_foreign_and_bare(app, what, name, obj, skip, options):
    """Document a class's own members and those of jaxgraph's private mixins as its own, but not
    what Python's ``RuntimeError``, ``tuple`` or ``str`` give it, and each attribute once: a
    property or field that the class's "Attributes" section describes is not listed again, nor
    one with no text of its own."""
    if skip or is_private(name):
        return None
    if what in ("class", "exception") and name in _documented_attributes and not callable(obj):
        return True
    func = getattr(obj, "fget", None) or getattr(obj, "__func__", None) or obj
    module = getattr(func, "__module__", None) or getattr(getattr(func, "__objclass__", None), "__module__", None)
    if callable(func) and not (module or "").startswith("jaxgraph"):  # str.maketrans, tuple.count
        return True
    if (getattr(obj, "__doc__", None) or "").startswith("Alias for field number"):  # a NamedTuple's field
        return True
    if not callable(func) and not isinstance(obj, (property, enum.Enum)):
        doc = getattr(obj, "__doc__", None)
        if not (doc or "").strip() or doc is getattr(type(obj), "__doc__", None):  # a slot, a bare annotation
            return True
    return None


def _defined_in() -> dict[int, str]:
    """``{id(obj): module}``: for each class and function that ``jaxgraph/__init__.py`` names
    under a public module (``jaxgraph.Kernel``'s ``__module__`` is ``"jaxgraph"``), and each
    private base of theirs, the private module whose source defines it."""
    found = {}
    for name, module in list(sys.modules.items()):
        source = pathlib.Path(getattr(module, "__file__", "") or "")
        if not name.startswith("jaxgraph._") or source.suffix != ".py":
            continue
        text = source.read_text()
        for attr, obj in vars(module).items():
            if ((inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__ in PUBLIC_MODULES
                    and re.search(rf"^(class|def) {attr}\b", text, re.M)):
                found[id(obj)] = name
    return found


DEFINED_IN = _defined_in()


def _module_of_source(obj, name, *default):
    """autodoc's ``getattr``: the ``__module__`` of a name shown as ``jaxgraph.X`` is, for
    autodoc alone, the private module that defines it, whose source gives the order of a class's
    members (``autodoc_member_order``); pages and type hints still say ``jaxgraph.X``. Sphinx looks
    up an attribute's doc-comment without this getter, so a public class describes its attributes
    and enum members in its docstring's "Attributes" section (``BindingMode``)."""
    if name == "__module__" and id(obj) in DEFINED_IN:
        return DEFINED_IN[id(obj)]
    return safe_getattr(obj, name, *default)


def _defining_module(app, modname, fullname):
    """The [source] link of a name shown under a public module: the private module whose source
    defines it (``jaxgraph.Kernel`` or ``jaxgraph.Kernel.launch``: ``jaxgraph._kernels.kernel``)."""
    if modname not in PUBLIC_MODULES or not fullname:
        return None
    return DEFINED_IN.get(id(getattr(sys.modules[modname], fullname.split(".")[0], None)))


def setup(app):
    app.add_autodoc_attrgetter(type, _module_of_source)
    app.add_autodoc_attrgetter(types.FunctionType, _module_of_source)
    app.connect("viewcode-follow-imported", _defining_module)
    app.connect("autodoc-process-signature", _signature_as_called)
    app.connect("autodoc-process-docstring", _note_attributes)
    app.connect("autodoc-skip-member", _skip_foreign_and_bare)


html_theme = "furo"
html_title = f"jaxgraph {release}"

# generated/ holds only what this build writes: a name gone from api.rst leaves no stale page.
shutil.rmtree(DOCS / "generated", ignore_errors=True)
write_results_pages(REPO / "benchmarks" / "results", DOCS / "performance")
