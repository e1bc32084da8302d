"""MkDocs hook: what the pages' Markdown needs to read the same in the site as on GitHub.

A page's link to a file of the checkout outside docs/ (`../../deploy/prometheus/alerts.yml` from a runbook)
gets a target in the site: each such file is copied to `source/<path>` and the link pointed there, so the
same link works on GitHub and in the site, and MkDocs still validates it (a link to a file that does not
exist is left alone, and `--strict` fails on it). And in a table row `\\|` inside a code span, which GitHub
needs to keep the cell whole, loses its backslash, which Python-Markdown would show.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")
SOURCE = "source"  # where the site keeps the checkout's files that pages link to
CODE_SPAN = re.compile(r"`[^`]*`")


def outside_target(page_src: str, target: str) -> PurePosixPath | None:
    """The repo path a page's relative link names when it is a file outside docs/ that exists, else None."""
    if "://" in target or target.startswith(("/", "mailto:")):
        return None
    path = (DOCS / PurePosixPath(page_src).parent / target).resolve()
    if path.is_relative_to(DOCS) or not path.is_relative_to(ROOT) or not path.is_file():
        return None
    return PurePosixPath(path.relative_to(ROOT).as_posix())


def _outside_links(page_src: str, markdown: str) -> list[PurePosixPath]:
    found = (outside_target(page_src, m.group(1)) for m in LINK.finditer(markdown))
    return [p for p in found if p is not None]


def _relative(page_src: str, repo_path: PurePosixPath) -> str:
    up = "../" * len(PurePosixPath(page_src).parent.parts)
    return f"{up}{SOURCE}/{repo_path}"


def table_code_pipes(markdown: str) -> str:
    """`a\\|b` in a table row: GitHub needs the escape to keep the cell whole, Python-Markdown shows it (a pipe
    inside a code span is no cell separator there), so the site gets the plain pipe."""
    out, fence = [], False
    for line in markdown.split("\n"):
        fence ^= line.startswith("```")
        if not fence and line.startswith("|") and "\\|" in line:
            line = CODE_SPAN.sub(lambda m: m.group(0).replace("\\|", "|"), line)
        out.append(line)
    return "\n".join(out)


def on_files(files, config):
    from mkdocs.structure.files import File

    wanted: set[PurePosixPath] = set()
    for f in files.documentation_pages():
        wanted.update(_outside_links(f.src_uri, Path(f.abs_src_path).read_text()))
    for p in sorted(wanted):
        files.append(File.generated(config, f"{SOURCE}/{p}", abs_src_path=str(ROOT / p)))
    return files


def on_page_markdown(markdown, page, config, files):
    src = page.file.src_uri

    def link(m: re.Match) -> str:
        p = outside_target(src, m.group(1))
        return m.group(0) if p is None else f"]({_relative(src, p)}{m.group(2) or ''})"

    return table_code_pipes(LINK.sub(link, markdown))
