"""docs/troubleshooting.md quotes the messages as the code writes them, so it cannot drift.

Every ``**Message:**`` line of the page quotes, in backticks, a stable part of
an error or warning, with ``…`` where the text names the user's values. Each
must still be in jaxgraph's sources: a Python or C++ string literal, or a CMake
message, where ``…`` stands for one placeholder (``{...}`` in an f-string,
``${...}`` in CMake). Lines marked ``**Message (...'s own):**`` quote other
programs (CMake, XLA, gRPC) and are not looked up.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"
SOURCES = sorted([*(ROOT / "jaxgraph").rglob("*.py"), *(ROOT / "ffi").rglob("*.h"), *(ROOT / "ffi").rglob("*.cc"),
                  *(ROOT / "cmake").glob("*.cmake"), ROOT / "CMakeLists.txt"])
PLACEHOLDER = r"\$?\{[^{}\n]*\}"  # {expr} in an f-string, ${var} in CMake


def quoted(marker: str) -> list[str]:
    return [frag for line in PAGE.read_text().splitlines() if line.startswith(marker)
            for frag in re.findall(r"`([^`]+)`", line)]


def pattern(fragment: str) -> re.Pattern:
    return re.compile(PLACEHOLDER.join(re.escape(part) for part in fragment.split("…")))


def found(fragment: str, texts: list[str]) -> bool:
    regex = pattern(fragment)
    return any(regex.search(text) for text in texts)


@pytest.fixture(scope="module")
def sources():
    texts = [p.read_text() for p in SOURCES]
    assert len(texts) > 50 and any("CompileError" in t for t in texts)
    return texts


FRAGMENTS = quoted("**Message:**")


def test_the_page_quotes_messages_of_every_kind():
    assert len(FRAGMENTS) >= 40, FRAGMENTS
    text = PAGE.read_text()
    for section in ("## Building", "## Importing and running", "## Compiling kernels: NVRTC", "## Launching kernels",
                    "## Capturing graphs", "XLA's command buffers", "## Several processes", "## The kernel cache",
                    "preserve=", "Gradients through a loop"):
        assert section in text, section
    for fragment in FRAGMENTS:
        assert len(fragment.replace("…", "").strip()) >= 12, f"too short to be stable: {fragment!r}"


@pytest.mark.parametrize("fragment", FRAGMENTS)
def test_every_quoted_message_is_in_the_sources(fragment, sources):
    assert found(fragment, sources), (f"docs/troubleshooting.md quotes {fragment!r}, which no longer appears in "
                                      "jaxgraph/, ffi/ or cmake/: update the entry to the message the code gives")


def test_the_lookup_fails_on_a_message_that_is_not_there(sources):
    assert found("kernel … takes … arguments ", sources)
    assert not found("kernel … takes … parameters ", sources)
    assert not found("NVRTC could not compile the kernel", sources)


def test_every_entry_says_what_to_do():
    entries = re.split(r"\n### ", PAGE.read_text())[1:]
    assert len(entries) >= 25
    for entry in entries:
        title = entry.splitlines()[0]
        assert "**Message" in entry, title
        assert "**Fix:**" in entry or "nothing to do" in entry, title


def test_other_programs_messages_are_marked_and_few():
    own = [line for line in PAGE.read_text().splitlines() if re.match(r"\*\*Message \([^)]+'s own\):\*\*", line)]
    assert 1 <= len(own) <= 8, own


def test_build_md_points_to_the_page_and_keeps_no_copy_of_its_entries():
    build = (ROOT / "BUILD.md").read_text()
    assert "troubleshooting.md" in build
    assert "found no CUDA headers and static runtime" not in build  # the page holds the build errors now
    index = (ROOT / "docs" / "index.md").read_text()
    assert "\ntroubleshooting\n" in index


def test_build_errors_name_the_page():
    """The errors a failed or missing build gives point to the page by its title (the docs have no fixed URL)."""
    cmake = (ROOT / "cmake" / "cuda_runtime.cmake").read_text()
    native = (ROOT / "jaxgraph" / "_cuda" / "native.py").read_text()
    assert "Troubleshooting page (docs/troubleshooting.md)" in cmake
    assert "the docs' Troubleshooting page" in native
    assert PAGE.read_text().startswith("# Troubleshooting\n")
