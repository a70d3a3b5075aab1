"""The README and docs/ point only inside the repository (issue 24, part 7): every
markdown link resolves to a file (and heading) of the checkout, no path climbs out of it,
no page sends the reader to the web, and every repository path they name exists, so a
moved or renamed file shows up here rather than in a reader's dead end."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# top-level folders of the checkout: a path that starts with one of them is the repo's
TOP = ("frontend", "scheduler", "shm", "workers", "scripts", "tests", "deploy",
       "examples", "docs")

LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
# a repo path in prose or a code span: TOP/..., not inside a longer path or a URL
REPO_PATH = re.compile(r"(?<![\w/.$-])(?:\./)?((?:%s)/[\w./*-]*)" % "|".join(TOP))
# "../" that starts a path (".../infer" is Triton's URL shorthand, not a path)
CLIMB = re.compile(r"(?<![\w./])\.\./")


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but '-' and '_' dropped, spaces
    to '-'."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def links(page: Path):
    return LINK.findall(page.read_text())


def test_the_pages_exist_and_docs_are_linked_from_the_readme():
    """Every docs/ page is reachable from the README (else it is lost to readers)."""
    assert len(PAGES) > 1
    linked = {(ROOT / target.split("#")[0]).resolve()
              for _, target in links(ROOT / "README.md") if not target.startswith("#")}
    for page in PAGES[1:]:
        assert page.resolve() in linked, f"{page.name} is not linked from README.md"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_resolve_inside_the_repository(page):
    bad = []
    for text, target in links(page):
        if re.match(r"[a-z][a-z+.-]*:", target):
            bad.append(f"[{text}]({target}): a link out of the repository")
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page.resolve()
        if not dest.is_relative_to(ROOT):
            bad.append(f"[{text}]({target}): leaves the repository")
        elif not dest.exists():
            bad.append(f"[{text}]({target}): no such file")
        elif anchor and anchor not in anchors(dest):
            bad.append(f"[{text}]({target}): no heading #{anchor}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_web_addresses_and_no_paths_out_of_the_repository(page):
    text = LINK.sub("", page.read_text())  # links are checked above
    assert not re.findall(r"\bhttps?://\S+", text)
    climbs = [text[max(0, m.start() - 30):m.end() + 30] for m in CLIMB.finditer(text)]
    assert not climbs, climbs


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_named_repository_paths_exist(page):
    missing = []
    for path in REPO_PATH.findall(page.read_text()):
        path = path.rstrip(".,")
        found = list(ROOT.glob(path)) if "*" in path else [ROOT / path]
        if not any(p.exists() for p in found):
            missing.append(path)
    assert not missing, missing
