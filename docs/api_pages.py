"""What the API reference (``api.rst``, ``conf.py``) and its test (``tests/examples/test_api_docs.py``) share.

The public API is ``jaxgraph.__all__`` plus the two documented submodules
``jaxgraph.diagnostics`` and ``jaxgraph.compare`` (their ``__all__``).
"""

import importlib
import inspect
import typing

PUBLIC_MODULES = ("jaxgraph", "jaxgraph.diagnostics", "jaxgraph.compare")


def is_private(name):
    """``_token``, ``_Region``: a leading underscore that is not a dunder."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def public_objects():
    """``{"jaxgraph.Kernel": Kernel, "jaxgraph.compare.run": run, ...}``: every public name once
    (``jaxgraph.diagnostics.ReplayPath`` is ``jaxgraph.ReplayPath``: listed under the first)."""
    found, seen = {}, set()
    for modname in PUBLIC_MODULES:
        module = importlib.import_module(modname)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isroutine(obj):
                if id(obj) in seen:
                    continue
                seen.add(id(obj))
            found[f"{modname}.{name}"] = obj
    return found


def public_types():
    """The ids of the classes the public API exports."""
    return {id(obj) for obj in public_objects().values() if inspect.isclass(obj)}


def internal_constructor(cls):
    """Whether users never call ``cls(...)``: its ``__init__`` takes ``(*args, **kwargs)`` only to
    refuse them (``Replayable``: made by ``jaxgraph.replayable``), an argument only jaxgraph passes
    (``DeviceArray``'s ``_token``), or a type of jaxgraph's internals (``Switch``'s region)."""
    try:
        sig = inspect.signature(cls.__init__)
        hints = typing.get_type_hints(cls.__init__)
    except (TypeError, ValueError, NameError):
        return False
    params = list(sig.parameters.values())[1:]
    if "__init__" in vars(cls) and [p.kind for p in params] == [inspect.Parameter.VAR_POSITIONAL,
                                                               inspect.Parameter.VAR_KEYWORD]:
        return True
    public = public_types()
    return any(is_private(p.name) for p in params) or any(
        isinstance(h, type) and h.__module__.startswith("jaxgraph") and id(h) not in public
        for h in hints.values())


def attributes_section(doc):
    """The names a numpy-style docstring's "Attributes" section lists (``a, b : int`` gives both)."""
    lines = inspect.cleandoc(doc or "").splitlines()
    names = []
    for i, line in enumerate(lines):
        if line.strip() == "Attributes" and i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"}:
            for entry in lines[i + 2:]:
                if entry and not entry[0].isspace():
                    if entry.startswith("..") or (entry.strip() and set(entry.strip()) == {"-"}):
                        break
                    names += [n.strip() for n in entry.split(" : ")[0].split(",")]
    return set(names)


