"""The documentation holds together: README.md stays a short entry point (at most 320 lines)
whose Documentation map lists every page of docs/, and every relative link in the
repository's Markdown (README.md, docs/, BENCHMARKS.md, the folders' READMEs) points to a file
of the repository and, with a #fragment, to a heading of that file (GitHub's anchors). Needs
no build."""

import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 320

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+).*?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")


def guide():
    """The user guide: the pages of docs/ that README.md's map must list."""
    return sorted((REPO / "docs").glob("*.md"))


def pages():
    """Every Markdown file of the source tree: build trees, Bazel's output links, dot folders
    and third_party/ are pruned before the walk enters them."""
    out = []
    for root, dirs, files in os.walk(REPO):
        if Path(root) == REPO:
            dirs[:] = [d for d in dirs
                       if not d.startswith(("build", "bazel-", ".")) and d != "third_party"]
        out += [Path(root) / f for f in files if f.endswith(".md")]
    return sorted(out)


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    in_fence = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield n, line


def slug(heading):
    """GitHub's anchor for a heading (github-slugger): the rendered text, lower-cased, with
    punctuation dropped (letters, digits, '_', '-' and spaces stay) and spaces as '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    seen = {}
    out = set()
    for _, line in prose_lines(path):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path):
    for n, line in prose_lines(path):
        for m in LINK.finditer(CODE_SPAN.sub("", line)):
            yield n, m.group(1)


def broken_links(path):
    """'file:line: target (why)' for each relative link of `path` that leads nowhere."""
    out = []
    for n, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:
            continue
        where = f"{path.relative_to(REPO)}:{n}: {target}"
        file_part, _, fragment = target.partition("#")
        if file_part.startswith("/"):
            out.append(f"{where} (absolute: links are relative to the page)")
            continue
        dest = (path.parent / file_part).resolve() if file_part else path
        if REPO not in dest.parents and dest != REPO:
            out.append(f"{where} (outside the repository)")
        elif not dest.exists():
            out.append(f"{where} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            out.append(f"{where} (no heading with anchor #{fragment} in {dest.name})")
    return out


def test_readme_is_short():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail into docs/")


def test_readme_maps_every_page_of_docs():
    readme = {t.partition("#")[0] for _, t in links(REPO / "README.md")}
    unlisted = [p.relative_to(REPO).as_posix() for p in guide()
                if p.relative_to(REPO).as_posix() not in readme]
    assert not unlisted, f"README.md's Documentation map lacks {unlisted}"


def test_every_relative_link_resolves():
    broken = [b for p in pages() for b in broken_links(p)]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_checker_sees_a_broken_link(tmp_path, monkeypatch):
    """The check itself: a missing file, a missing heading and a path out of the tree fail."""
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# Page A\n\n## C++ API: `x`\n\n```sh\n# not a heading\n[in code](nowhere.md)\n```\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md#c-api-x) [ok](docs/a.md) [ok](#top) `[code](nowhere.md)`\n"
        "[gone](docs/b.md) [no heading](docs/a.md#not-a-heading) [out](../x.md)\n\n# Top\n")
    broken = broken_links(page)
    assert [b.split(": ", 1)[1] for b in broken] == [
        "docs/b.md (no such file)",
        "docs/a.md#not-a-heading (no heading with anchor #not-a-heading in a.md)",
        "../x.md (outside the repository)",
    ], broken
