"""The docs as a reader meets them: written pages in sections, the generated benchmark pages last.

A guide page is read by section: each has ``##`` headings and no stretch of
prose longer than ``MOST_WORDS`` without one (code blocks aside). The sidebar
(docs/index.md's toctrees) leads with the written pages; the pages generated
from benchmarks/results/ (docs/results_pages.py) sit under one caption, last.
"""

import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
SECTIONED = sorted(DOCS.glob("guide/*.md")) + [DOCS / "getting-started.md", DOCS / "performance.md",
                                                DOCS / "examples.md"]
MOST_WORDS = 500


def sections(text: str) -> list[tuple[str, int]]:
    """(heading, words of prose under it) for a markdown page, code blocks left out."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    parts = re.split(r"^(#{1,4} .*)$", prose, flags=re.M)
    return [("(top)", len(parts[0].split()))] + [(parts[i], len(parts[i + 1].split())) for i in range(1, len(parts), 2)]


@pytest.mark.parametrize("page", SECTIONED, ids=[p.relative_to(DOCS).as_posix() for p in SECTIONED])
def test_a_written_page_is_in_sections(page):
    found = sections(page.read_text())
    assert sum(1 for heading, _ in found if heading.startswith("## ")) >= 2, found
    long = [(heading, words) for heading, words in found if words > MOST_WORDS]
    assert long == [], f"{page.name}: sections over {MOST_WORDS} words without a heading: {long}"


def test_the_section_counter_sees_a_long_section():
    assert sections("# T\n\n" + "word " * 600 + "\n```python\n" + "x = 1\n" * 900 + "```\n## A\n\nb\n") == \
        [("(top)", 0), ("# T", 600), ("## A", 1)]


def toctrees(text: str) -> list[tuple[str, list[str]]]:
    """(caption, entries) of each toctree of a MyST page."""
    out = []
    for body in re.findall(r"^```\{toctree\}\n(.*?)^```", text, flags=re.S | re.M):
        caption = re.search(r"^:caption: (.*)$", body, flags=re.M)
        entries = [line.strip() for line in body.splitlines() if line.strip() and not line.startswith(":")]
        out.append((caption.group(1) if caption else "", entries))
    return out


def test_the_sidebar_leads_with_the_written_pages_and_ends_with_the_generated_ones():
    trees = toctrees((DOCS / "index.md").read_text())
    captions = [c for c, _ in trees]
    assert captions == ["Start", "User guide", "Performance", "Reference", "Benchmark results"], captions
    assert trees[-1][1] == ["performance/index"]
    listed = [e for _, entries in trees[:-1] for e in entries]
    assert not any(e.startswith("performance/") for e in listed), listed
    assert {"when-it-helps", "guide/compare", "performance"} <= set(dict(trees)["Performance"])
    assert "troubleshooting" in dict(trees)["Reference"]
    # performance.md links the generated pages but does not nest them (they would show twice in the sidebar).
    perf = (DOCS / "performance.md").read_text()
    assert "performance/index.md" in perf
    assert all("performance/index" not in entries for _, entries in toctrees(perf))
