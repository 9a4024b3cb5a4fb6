"""Every relative link in the README and the manual in docs/ resolves: the file exists and, where
the link names an anchor, the target has that heading (GitHub's slugs). And the README stays one a
user reads in ten minutes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    h = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return h.replace(" ", "-")


def prose(text: str):
    """The lines outside fenced code blocks."""
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced:
            yield line


def anchors(text: str) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(text):
        m = re.match(r"^#+ (.*)$", line)
        if m:
            s = slug(m.group(1))
            seen[s] = seen.get(s, -1) + 1
            out.add(s if seen[s] == 0 else f"{s}-{seen[s]}")
    return out


def links(text: str):
    for line in prose(text):
        for m in LINK.finditer(line):
            target = m.group(2)
            if not re.match(r"^[a-z]+:", target):
                yield target


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_relative_link_resolves(doc):
    text = doc.read_text()
    broken = []
    for target in links(text):
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target}: no such file {dest}")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            broken.append(f"{target}: {dest.relative_to(ROOT)} has no heading #{anchor}")
    assert not broken, "\n".join(broken)


def test_the_readme_is_read_in_ten_minutes():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 400, len(lines)


def test_the_manual_pages_are_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    for page in ("patching", "servers", "preflight", "fleets", "containers", "bench", "security", "faults",
                 "reference"):
        assert f"](docs/{page}.md" in readme, page
