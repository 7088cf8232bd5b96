"""The documentation holds together: every relative link in README.md, docs/ and benchmarks/ resolves (a link to a
#heading finds that heading), README.md stays short, and every page in docs/ can be reached from README.md or the
docs index. Pure file reading: no bench import, no framework, well under a second."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
INDEX = DOCS / "README.md"
BENCHMARKS = ROOT / "benchmarks"
README_MAX_LINES = 250  # issue 24: a README a newcomer reads in five minutes (torchtitan's is under 200 lines)
# Pages that code writes rather than people: docs/options.md is generated from the schema in bench/config.py. A link
# to it may point at nothing until the generator has run; once the page exists it is checked like every other page.
GENERATED = {DOCS / "options.md"}

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
INLINE_LINK = re.compile(r"\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'][^\"']*[\"'])?\s*\)")  # [text](target) and ![alt](target)
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")  # [label]: target
HTML_LINK = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""")
HTML_ANCHOR = re.compile(r"""\b(?:id|name)\s*=\s*["']([^"']+)["']""")
ATX = re.compile(r"^\s{0,3}(?:>\s?)*#{1,6}\s+(.*?)(?:\s+#+)?\s*$")
SETEXT = re.compile(r"^\s{0,3}(=+|-+)\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto: ... leave the repository


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md")), *sorted(BENCHMARKS.rglob("*.md"))]


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code spans removed: code is not a link."""
    out, fenced = [], None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fenced is None:
                fenced = m.group(1)
            elif m.group(1) == fenced:
                fenced = None
            continue
        if fenced is None:
            out.append((number, CODE_SPAN.sub("", line)))
    return out


def links(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for pattern in (INLINE_LINK, REFERENCE, HTML_LINK):
            found += [(number, target) for target in pattern.findall(line) if target]
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lowercased, punctuation other than '-' and '_' dropped,
    each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link or image: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every #anchor a markdown file has: its headings' slugs (a repeated one gets -1, -2, ... as on GitHub) and
    explicit id= / name= attributes."""
    seen: dict[str, int] = {}
    found: set[str] = set()

    def add(heading: str) -> None:
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")

    previous = ""
    for text_line in (line for _, line in prose_lines(path.read_text(encoding="utf-8"))):
        atx = ATX.match(text_line)
        if atx:
            add(atx.group(1))
        elif SETEXT.match(text_line) and previous.strip() and not re.match(r"^\s*([|>*+-]|#|\d+\.)", previous):
            add(previous.strip())
        found.update(HTML_ANCHOR.findall(text_line))
        previous = text_line
    return found


def resolve(source: Path, target: str) -> tuple[Path, str]:
    """The file a relative link points at, and its anchor ('' if none)."""
    file_part, _, anchor = target.partition("#")
    file = source if not file_part else (source.parent / unquote(file_part)).resolve()
    return file, unquote(anchor)


@pytest.mark.parametrize("path", markdown_files(), ids=rel)
def test_relative_links_resolve(path: Path):
    problems = []
    for number, target in links(path):
        if SCHEME.match(target) or target.startswith("//"):
            continue
        file, anchor = resolve(path, target)
        where = f"{rel(path)}:{number}: {target}"
        if ROOT not in file.parents and file != ROOT:
            problems.append(f"{where}: points outside the repository")
        elif not file.exists():
            if file not in GENERATED:
                problems.append(f"{where}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            problems.append(f"{where}: no heading with anchor #{anchor} in {rel(file)}")
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_is_short():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, more than {README_MAX_LINES}: move the detail to a page in docs/"
    )


def linked_files(path: Path) -> set[Path]:
    return {resolve(path, target)[0] for _, target in links(path) if not SCHEME.match(target)}


def test_every_docs_page_is_linked():
    assert INDEX.exists(), "docs/README.md, the docs index, is missing"
    reachable = linked_files(README) | linked_files(INDEX)
    assert INDEX in reachable, "README.md does not link the docs index, docs/README.md"
    pages = [page for page in sorted(DOCS.rglob("*.md")) if page != INDEX]
    orphans = [rel(page) for page in pages if page not in reachable]
    assert not orphans, f"docs pages linked from neither README.md nor docs/README.md: {', '.join(orphans)}"


@pytest.mark.parametrize(
    "heading, expected",
    [
        ("Memory, explained", "memory-explained"),
        ("Speed (`make perf`)", "speed-make-perf"),
        ("bf16 (`dtype=bf16 | bf16_pure`)", "bf16-dtypebf16--bf16_pure"),
        ("results/runs.csv", "resultsrunscsv"),
        ("The UMass forward-AD study's pathology", "the-umass-forward-ad-studys-pathology"),
        ("A ready-made W&B view", "a-ready-made-wb-view"),
        ("See [outputs](outputs.md)", "see-outputs"),
    ],
)
def test_slug_follows_github(heading: str, expected: str):
    assert slug(heading) == expected
