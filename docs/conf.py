"""Sphinx configuration for jaxgraph's docs (python3 -m sphinx -W -b html docs docs/_build/html).

Pages are MyST markdown. Three kinds of page are made here at build time, from
files others write, so that nothing is copied by hand:

- ``performance/<stem>.md`` for every ``benchmarks/results/<stem>.md`` (and its
  ``<stem>.png`` plot where there is one): the results as committed, links
  between them kept, links to JSON files left as text;
- ``api.md``'s entries come from ``jaxgraph.__all__`` (``api_entries`` below);
- ``build.md`` and ``changelog.md`` include ``BUILD.md`` and ``CHANGELOG.md``.

``when-it-helps.md`` is not made here: ``docs/measured_pages.py`` fills it from
``templates/when-it-helps.md`` and a committed benchmark run, and it is
committed as written (``templates/`` is left out of the site).
"""

import pathlib
import re
import sys

DOCS = pathlib.Path(__file__).resolve().parent
REPO = DOCS.parent
sys.path.insert(0, str(DOCS))

import jaxgraph  # noqa: E402  (installed: autodoc needs the package, not the extension)

from results_pages import write_results_pages  # noqa: E402

project = "jaxgraph"
author = "the jaxgraph authors"
copyright = "2026, the jaxgraph authors"
version = release = jaxgraph.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_parser",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "templates"]  # templates: docs/measured_pages.py fills them
root_doc = "index"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# numpy-style docstrings, as the code has
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True  # an "Attributes" section as fields: properties keep their own entries
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
# The results tables are written by benchmark scripts whose headings may skip a level.
suppress_warnings = ["myst.header"]

html_theme = "furo"
html_title = f"jaxgraph {release}"

write_results_pages(REPO / "benchmarks" / "results", DOCS / "performance")
