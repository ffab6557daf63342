"""Every relative link of README.md and docs/ leads somewhere: to a file that exists and, where it names an anchor in a
Markdown page, to a heading of that page (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)|^\s*\[[^\]]+\]:\s*(\S+)", re.M)


def unfenced(text: str) -> str:
    """The page without its fenced code blocks (where a ``#`` line is a comment, not a heading)."""
    return re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    names = set(re.findall(r"<a (?:name|id)=\"([^\"]+)\"", page.read_text()))
    for line in unfenced(page.read_text()).splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            slug = anchor(match.group(1))
            names.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return names


def links(page: Path) -> list[str]:
    in_prose = re.sub(r"`[^`\n]*`", "", unfenced(page.read_text()))  # brackets in code are not links
    return [a or b for a, b in LINK.findall(in_prose)]


def broken(page: Path) -> list[str]:
    wrong = []
    for link in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # https:, mailto: ...
            continue
        path, _, fragment = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            wrong.append(f"{link}: no such file")
        elif fragment and target.suffix == ".md" and fragment not in anchors(target):
            wrong.append(f"{link}: no such heading")
    return wrong


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert not broken(page)


def test_the_results_index_links_every_results_page():
    index = {(ROOT / "docs" / link).resolve() for link in links(ROOT / "docs" / "results.md")}
    assert set((ROOT / "docs" / "results").glob("*.md")) <= index


def test_the_checker_sees_a_broken_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# A `code` heading, with punctuation!\n## Twice\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-code-heading-with-punctuation) [ok](other.md#twice-1) [ok](#here)\n# Here\n"
                    "`[not a link](nowhere.md)` [gone](nowhere.md) [bad](other.md#twice-2)\n")
    assert broken(page) == ["nowhere.md: no such file", "other.md#twice-2: no such heading"]
