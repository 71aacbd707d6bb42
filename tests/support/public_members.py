"""The public methods and properties of jaxgraph's classes, for the docstring tests.

``packaging/test_public_api.py`` (every one has a docstring) and
``examples/test_api_docs.py`` (every docstring parses) walk the same members.
"""

import inspect

__all__ = ["public_members"]


def public_members(cls, *, call=False, first_only=False):
    """``(name, function)`` for each public method and property ``cls`` or a jaxgraph base defines.

    ``call``: ``__call__`` counts as public. ``first_only``: a name comes once, from the
    class nearest ``cls`` that defines it (else a base's definition comes too).
    """
    seen = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("jaxgraph"):
            continue
        for name, attr in vars(klass).items():
            if name.startswith("_") and not (call and name == "__call__"):
                continue
            if first_only:
                if name in seen:
                    continue
                seen.add(name)
            if isinstance(attr, property):
                yield name, attr.fget
            elif isinstance(attr, (staticmethod, classmethod)):
                yield name, attr.__func__
            elif inspect.isfunction(attr):
                yield name, attr
