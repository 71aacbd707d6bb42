"""Property-based tests of the signature and template parser (hypothesis; CPU, runs in CI).

Whatever text reaches the parser (a ``signature=``, a source, a kernel name
with template arguments) it answers with a parameter list or a ``ValueError``
naming what is wrong: never another exception, never a hang. And a
``signature=`` whose parameter count differs from the compiled kernel's is
never accepted. Empty entries (``"int* counter,, int n"``) are named.

Tests internals (listed in tests/README.md): ``_kernels.signature.parse_signature``
and ``_signature.find_signature``, the parser behind ``Kernel(signature=...)``.
"""

import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import jaxgraph
from jaxgraph._kernels.signature import find_signature, parse_signature
from support.kernel_sources import SAXPY

# Bounded sizes and a deadline per example: a parser that backtracks badly fails the deadline.
FUZZ = settings(max_examples=int(os.environ.get("JAXGRAPH_FUZZ_EXAMPLES", "300")), deadline=1000, suppress_health_check=[HealthCheck.too_slow])

# Text made mostly of what parameter lists are made of, so the parser's branches are reached.
PIECES = ["int", "float", "double", "unsigned", "long", "const", "void", "__half", "int64_t", "size_t",
          "float4", "struct", "T", "N", "*", "&", "[", "]", "[4]", "<", ">", "(", ")", "{", "}", ",", ",",
          "=", "0", "1.5f", " ", " ", "y", "x", "n", "a", "__restrict__", "__grid_constant__", "template",
          "typename", "__global__", "__launch_bounds__(128)", "extern \"C\"", ";", "/*", "*/", "//", "\n"]

CHARS = st.characters(exclude_categories=("Cs",))  # no lone surrogates: source text is valid UTF-8
TEXT = st.one_of(st.text(CHARS, max_size=120), st.lists(st.sampled_from(PIECES), max_size=40).map("".join))
DECLS = ["float* y", "const float* x", "float a", "int n", "int64_t m", "double d", "unsigned int u",
         "const int* __restrict__ p", "void* v", "bool flag", "int", "float*"]


@FUZZ
@given(TEXT)
def test_parse_signature_answers_a_list_or_a_value_error(text):
    try:
        params = parse_signature(text)
    except ValueError as exc:
        assert str(exc)  # a message, naming what is wrong
        return
    assert isinstance(params, tuple)
    for p in params:
        assert p.name and p.ctype
        assert p.is_pointer or p.dtype is not None  # a scalar always has a type to pack


@FUZZ
@given(TEXT, st.one_of(st.sampled_from(["k", "axpy", "axpy<float>", "k<1, 2>", "f<T>", "k<>", "<", "k<(>"]),
                       st.text(CHARS, min_size=1, max_size=20)))
def test_find_signature_answers_a_string_or_a_value_error(source, name):
    try:
        found = find_signature(source, name)
    except ValueError as exc:
        assert str(exc)
        return
    assert isinstance(found, str)


@FUZZ
@given(st.lists(st.sampled_from(DECLS), max_size=6), st.lists(st.booleans(), max_size=7))
def test_empty_entries_are_named_and_counts_are_kept(decls, empties):
    # Entries joined by commas, an empty entry inserted wherever `empties` says.
    entries = []
    for i, d in enumerate(decls):
        if i < len(empties) and empties[i]:
            entries.append("  ")
        entries.append(d)
    text = ", ".join(entries)
    if any(not e.strip() for e in entries) and len(entries) > 1:
        with pytest.raises(ValueError, match=r"kernel parameter \d+ of \d+ in .* is empty"):
            parse_signature(text)
    else:
        assert len(parse_signature(text)) == len(decls)


def test_an_empty_entry_is_named_with_its_position():
    with pytest.raises(ValueError, match=r"kernel parameter 2 of 3 in 'int\* counter,, int n' is empty"):
        parse_signature("int* counter,, int n")
    with pytest.raises(ValueError, match=r"kernel parameter 2 of 2 in 'int n,' is empty"):
        parse_signature("int n,")
    assert parse_signature("") == parse_signature("void") == ()


def test_launch_bounds_do_not_hide_the_parameter_list():
    src = "__global__ void __launch_bounds__(128, 2) k(float* y, int n) { }"
    assert [p.name for p in parse_signature(find_signature(src, "k"))] == ["y", "n"]


@pytest.fixture(scope="module")
def saxpy_cache(tmp_path_factory):
    """One cubin of saxpy (4 parameters: 8, 8, 4, 4 bytes) compiled for sm_90; every example reads it back."""
    cache = tmp_path_factory.mktemp("cubins")
    k = jaxgraph.Kernel(SAXPY, "saxpy", arch="sm_90", cache_dir=cache)
    assert len(k.params) == 4
    return cache


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(DECLS), max_size=7), st.booleans())
def test_a_signature_whose_count_differs_from_the_cubin_is_never_accepted(saxpy_cache, decls, empty):
    text = ", ".join(decls) + (", " if empty else "")
    try:
        k = jaxgraph.Kernel(SAXPY, "saxpy", arch="sm_90", cache_dir=saxpy_cache, signature=text)
    except (TypeError, ValueError) as exc:
        assert str(exc)
        return
    assert len(k.params) == 4, (text, k.params)  # accepted only with the cubin's four parameters
    assert k.cache_hit
