"""The documentation a user gets with a clone: every relative link in README.md and docs/*.md
leads to a file of the repository (and to a heading that exists, when it names one), and nothing
points outside the repository (the design notes in ../shared are not part of a clone)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Markdown inline links and images: [text](target) / ![alt](target "title").
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")
EXTERNAL = ("http://", "https://", "mailto:")


def _prose_of(text: str) -> str:
    """``text`` without code blocks and code spans (a link-like text in an example is not a link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(CODE_SPAN.sub("", line))
    return "\n".join(lines)


def _prose(path: Path) -> str:
    return _prose_of(path.read_text(encoding="utf-8"))


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of the headings of a Markdown file."""
    found, fenced = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        match = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            text = match.group(1).strip().lower()
            text = re.sub(r"[^\w\- ]", "", text)
            found.add(text.replace(" ", "-"))
    return found


def _links(path: Path) -> list[str]:
    return LINK.findall(_prose(path))


def test_the_documentation_exists():
    names = {p.name for p in DOCS}
    assert {"README.md", "architecture.md", "evaluation.md", "blocks.md", "block-contract.md", "job-file.md",
            "template-header.md"} <= names


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve_inside_the_repository(path):
    broken = []
    for target in _links(path):
        if target.startswith(EXTERNAL):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if ROOT not in resolved.parents and resolved != ROOT:
            broken.append(f"{target}: leaves the repository")
        elif not resolved.is_file():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_nothing_points_to_the_shared_folder(path):
    text = path.read_text(encoding="utf-8")
    assert "../shared" not in text and "/work/shared" not in text, (
        f"{path.relative_to(ROOT)} refers to ../shared, which a clone does not have; link to docs/ instead")


def test_the_link_checker_sees_links_and_skips_code():
    sample = "see [a](docs/x.md#y) and ![i](img.png \"t\") but not `[c](d)`\n```\n[e](f)\n```\n"
    assert LINK.findall(_prose_of(sample)) == ["docs/x.md#y", "img.png"]
