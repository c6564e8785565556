"""The docs describe the tree as it is: the README's Layout names only paths that
exist and every package and Spark module there is, every relative link of the
README, BENCHMARKS.md and docs/ leads to a file (and heading) that exists, and
docs/index.md lists every page of docs/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]

#: Pages docs/index.md links to that other branches are writing. A link to one of
#: these is accepted while the file is missing; once it exists it must leave this
#: set (the test fails until it does), so the set cannot hide a broken link.
PENDING: set[str] = set()

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without its fenced code blocks (whose '#' lines are not headings)."""
    return FENCE.sub("", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, with GitHub's -1, -2 for repeats."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#+\s+(.+?)\s*$", _prose(path.read_text()), re.M):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _layout_block() -> list[str]:
    """The lines of the code block under the README's "## Layout" heading."""
    text = (ROOT / "README.md").read_text()
    assert "\n## Layout\n" in text, "README.md has no '## Layout' section"
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```\n(.*?)^```", section, re.S | re.M)
    assert block, "the Layout section has no code block"
    return block.group(1).splitlines()


def layout_paths() -> list[str]:
    """The paths the Layout names, each resolved against the folder it is indented under.

    A line is ``<indent><name> [<name> ...]<two or more spaces><description>``;
    two spaces of indent per level, and a name ending in '/' is a folder.
    """
    paths: list[str] = []
    parents: list[str] = []
    for line in _layout_block():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        assert indent % 2 == 0, f"odd indent in the Layout: {line!r}"
        level = indent // 2
        assert level <= len(parents), f"Layout line indented under no folder: {line!r}"
        del parents[level:]
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0].split()
        for name in names:
            path = (parents[-1] if parents else "") + name
            paths.append(path)
            if name.endswith("/"):
                folder = path
        if names[-1].endswith("/"):
            parents.append(folder)
    return paths


def test_every_path_the_layout_names_exists():
    paths = layout_paths()
    assert len(paths) >= 20, paths  # the parser found the block
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert missing == [], f"README's Layout names paths that do not exist: {missing}"


def test_the_layout_names_every_package_and_spark_module():
    named = {p.rstrip("/") for p in layout_paths()}
    expected = set()
    for folder in ("sessionstore", "sessionstore/operators"):
        for child in (ROOT / folder).iterdir():
            if (child / "__init__.py").exists():
                expected.add(f"{folder}/{child.name}")
    for child in (ROOT / "spark_integration").iterdir():
        if (child.suffix == ".py" and child.name != "__init__.py") or (
            child / "__init__.py"
        ).exists():
            expected.add(f"spark_integration/{child.name}")
    assert sorted(expected - named) == [], "README's Layout omits these"


def test_every_relative_link_resolves():
    broken = []
    for doc in DOCS:
        for target in LINK.findall(_prose(doc.read_text())):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (doc.parent / file_part).resolve() if file_part else doc
            where = f"{doc.relative_to(ROOT)}: {target}"
            if not dest.exists():
                if dest.relative_to(ROOT).as_posix() not in PENDING:
                    broken.append(f"{where} (no such file)")
                continue
            if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{where} (no such heading)")
    assert broken == [], "\n".join(broken)


def test_pending_pages_are_still_missing():
    arrived = sorted(p for p in PENDING if (ROOT / p).exists())
    assert arrived == [], f"remove {arrived} from PENDING in tests/test_docs.py"


def test_the_index_lists_every_page_of_docs():
    index = (ROOT / "docs" / "index.md").read_text()
    listed = {t.partition("#")[0] for t in LINK.findall(index)}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert sorted(pages - listed) == [], "docs/index.md does not list these"
    for pending in PENDING:
        assert Path(pending).name in listed, pending


def test_the_slugs_are_githubs():
    assert _slug("Spark at scale (`bench/spark_scale.py`)") == "spark-at-scale-benchspark_scalepy"
    assert _slug("The floor, and what it is made of (`--floor-parts`)") == (
        "the-floor-and-what-it-is-made-of---floor-parts"
    )
    assert _slug("Object-store requests over a partition's life") == (
        "object-store-requests-over-a-partitions-life"
    )
