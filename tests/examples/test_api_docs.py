"""The API reference's sources: every public docstring parses as numpy style and names nothing private.

The public API is ``jaxgraph.__all__``, ``jaxgraph.diagnostics.__all__`` and
``jaxgraph.compare.__all__`` (``docs/api_pages.py``). Each docstring, and each
of its classes' public methods and properties, goes through numpydoc's parser
(``numpydoc.docscrape``, the docs extra) with its warnings as errors: a section
numpydoc does not know, a ``Parameters`` entry that is not a parameter (a
closing paragraph indented into the section turns its words into "parameters"
named ``raises`` or ``that``), a ``Raises`` entry that is not an exception, an
``Attributes`` entry that is not a name (a ``.. caution::`` inside the section)
all fail here. Nor may a signature or docstring name a private type
(``jaxgraph._...``, ``_Region``). tests/examples/test_docs.py checks that the
built site has a page for every public name.
"""

import builtins
import inspect
import keyword
import pathlib
import re
import sys
import typing
import warnings

import pytest

docscrape = pytest.importorskip("numpydoc.docscrape", reason="the docs extra (numpydoc) is not installed")

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
sys.path.insert(0, str(DOCS))
from api_pages import internal_constructor, is_private, public_objects, public_types  # noqa: E402
from support.public_members import public_members  # noqa: E402

OBJECTS = public_objects()
PUBLIC_TYPES = public_types()
SECTIONS_WITH_NAMES = ("Parameters", "Other Parameters", "Attributes")


def documented():
    """``(qualified name, object, docstring owner)`` for every public object and member with a docstring."""
    for qualname, obj in OBJECTS.items():
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue  # data (compare.SETTINGS): documented in api.rst itself
        yield qualname, obj
        if inspect.isclass(obj):
            for name, func in public_members(obj, call=True, first_only=True):
                yield f"{qualname}.{name}", func


ENTRIES = sorted(documented(), key=lambda e: e[0])
IDS = [name for name, _ in ENTRIES]


def parameters_of(obj):
    """The names a docstring's ``Parameters`` may list, or None when the signature cannot be read."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return None
    names = set()
    for p in params:
        names |= {p.name, f"*{p.name}", f"**{p.name}"}
    return names


def exception_names(text):
    """Whether ``text`` (a ``Raises`` entry) names exception types: ``TypeError``, ``jaxgraph.CompileError``."""
    names = [n.strip() for n in re.split(r",| or ", text) if n.strip()]
    ok = []
    for n in names:
        short = n.rsplit(".", 1)[-1].strip("`~")
        known = getattr(builtins, short, None)
        ok.append((isinstance(known, type) and issubclass(known, BaseException))
                  or re.fullmatch(r"[A-Z]\w*(Error|Exception|Warning|Exit|Interrupt)", short) is not None)
    return bool(names) and all(ok)


@pytest.mark.parametrize("name, obj", ENTRIES, ids=IDS)
def test_docstring_sections_parse(name, obj):
    doc = inspect.getdoc(obj)
    assert doc, f"{name} has no docstring"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unknown section, a malformed one
        parsed = docscrape.NumpyDocString(doc)
    allowed = parameters_of(obj)
    for section in SECTIONS_WITH_NAMES:
        for entry in parsed[section]:
            for field in entry.name.split(","):
                field = field.strip().lstrip("*")
                assert field.isidentifier() and not keyword.iskeyword(field), \
                    f"{name}: {section} entry {entry.name!r} is not a name (text indented into the section?)"
            if section != "Attributes" and allowed is not None:
                stray = [f.strip() for f in entry.name.split(",") if f.strip() not in allowed]
                assert not stray, f"{name}: {section} lists {stray}, not parameters of its signature"
    for entry in parsed["Raises"]:
        what = entry.type or entry.name
        assert exception_names(what), f"{name}: Raises entry {what!r} is not an exception type"
    for entry in parsed["Returns"] + parsed["Yields"]:
        assert (entry.type or entry.name).strip(), f"{name}: a Returns/Yields entry with no type"


def private_names(text):
    """Private jaxgraph names in a docstring or annotation: ``jaxgraph.`` then ``_cuda``, or ``_Region``."""
    return re.findall(r"\bjaxgraph\._\w+|(?<![\w.])_[A-Z][a-z]\w*", text or "")  # not a mangled C++ symbol


def annotation_types(hint):
    """The classes an annotation names, through ``list[X]``, ``X | None``, ``Callable[..., X]``."""
    if isinstance(hint, type) and not typing.get_args(hint):
        yield hint
    for arg in typing.get_args(hint):
        if isinstance(arg, list):
            for a in arg:
                yield from annotation_types(a)
        else:
            yield from annotation_types(arg)
    origin = typing.get_origin(hint)
    if isinstance(origin, type):
        yield origin


@pytest.mark.parametrize("name, obj", ENTRIES, ids=IDS)
def test_nothing_private_in_signature_or_docstring(name, obj):
    assert private_names(inspect.getdoc(obj)) == [], f"{name}'s docstring names private jaxgraph names"
    if inspect.isclass(obj) and internal_constructor(obj):
        return  # the reference shows no signature for it (docs/conf.py): users never call it
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return
    assert not [p for p in sig.parameters if is_private(p)], f"{name}{sig}: a private parameter"
    try:
        hints = typing.get_type_hints(target)
    except NameError as exc:
        pytest.fail(f"{name}: an annotation does not resolve ({exc})")
    for hint in hints.values():
        for cls in annotation_types(hint):
            assert not (cls.__module__.startswith("jaxgraph") and id(cls) not in PUBLIC_TYPES), \
                f"{name}{sig}: the annotation {hint!r} names {cls.__module__}.{cls.__qualname__}, not public"


def test_the_checks_catch_what_they_must():
    """The parser flags a closing paragraph indented into Parameters, as jaxgraph.if_then once had."""
    garbled = """Context manager.

    Parameters
    ----------
    pred : device array
        One element.

    Yields the open region. If the body raises, the region
    and its capture are discarded.
    """
    names = [e.name for e in docscrape.NumpyDocString(inspect.cleandoc(garbled))["Parameters"]]
    assert names[0] == "pred" and len(names) == 3 and not any(n.isidentifier() for n in names[1:]), names
    private = "jaxgraph." + "_cuda"  # spelled apart: this file reaches into no internals (test_public_api.py)
    assert private_names(f"a ``{private}.driver.CudaError`` or a _Region") == [private, "_Region"]
    assert exception_names("jaxgraph.CompileError") and not exception_names("that")
