"""Write ``docs/_inv/numpy.inv`` and ``docs/_inv/jax.inv``: intersphinx inventories of the NumPy
and JAX names jaxgraph's API pages refer to, each pointing at its page on the official site.

Why written here and not downloaded: the docs build reads inventories only from ``docs/_inv/``
(CI has no network), and numpy.org's and docs.jax.dev's ``objects.inv`` cannot be fetched from
the machines this project is built on; Debian ships no NumPy or JAX documentation to take them
from, as ``python.inv`` is taken (``docs/_inv/README.md``). So each name's entry is written by
hand below, in the format Sphinx writes (``sphinx.util.inventory``, version 2), with the page the
official docs give it: NumPy's ``reference/generated/<name>.html`` (its autosummary pages), JAX's
``_autosummary/<name>.html`` (``docs/jax.rst`` in jax-ml/jax) or the module page where the class
is documented in place (``jax.sharding.html``). Where a real inventory can be downloaded, it
replaces the file and this script goes.

Run ``python3 docs/inventories.py`` after adding a name. The docs build fails on a reference to
a NumPy or JAX name that no inventory holds (``nitpick_ignore_regex`` in ``docs/conf.py``), and
``tests/examples/test_docs.py`` when the committed files differ from what this script writes.
"""

import pathlib
import zlib

INVENTORIES = {
    "numpy": ("NumPy", {
        "numpy.dtype": ("py:class", "reference/generated/numpy.dtype.html#$"),
        "numpy.ndarray": ("py:class", "reference/generated/numpy.ndarray.html#$"),
    }),
    "jax": ("JAX", {
        "jax.Array": ("py:class", "_autosummary/jax.Array.html#$"),
        "jax.Device": ("py:class", "_autosummary/jax.Device.html#$"),
        "jax.ShapeDtypeStruct": ("py:class", "_autosummary/jax.ShapeDtypeStruct.html#$"),
        "jax.jit": ("py:function", "_autosummary/jax.jit.html#$"),
        "jax.sharding.Mesh": ("py:class", "jax.sharding.html#$"),
    }),
}
HERE = pathlib.Path(__file__).resolve().parent / "_inv"


def inventory(project: str, entries: dict[str, tuple[str, str]]) -> bytes:
    """The bytes of a version-2 inventory: a plain header, then the entries compressed with zlib.

    No version in the header: the entries point at the sites' current docs (``stable``,
    ``latest``), so the links say "(in NumPy)" rather than a version they may not match.
    """
    header = f"# Sphinx inventory version 2\n# Project: {project}\n# Version: \n" \
             "# The remainder of this file is compressed using zlib.\n"
    lines = "".join(f"{name} {role} 1 {uri} -\n" for name, (role, uri) in sorted(entries.items()))
    return header.encode() + zlib.compress(lines.encode(), 9)


def main() -> None:
    for name, (project, entries) in INVENTORIES.items():
        path = HERE / f"{name}.inv"
        path.write_bytes(inventory(project, entries))
        print(f"{path}: {len(entries)} names")


if __name__ == "__main__":
    main()
