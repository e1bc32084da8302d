"""The README is a front page and the manual is docs/, built by MkDocs (mkdocs.yml). `make lint` builds the site
with --strict (links and anchors between pages); these checks hold without MkDocs: the README stays short and
links only to what exists, the nav and the pages agree, and every figure a page asks for renders from
benchmarks/results/ (docs/hooks/figures.py)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[3]
DOCS = REPO_ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


class _Loader(yaml.SafeLoader):
    """mkdocs.yml names Python objects (`!!python/name:...`, the mermaid fence); they are read as None here."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def config() -> dict:
    return yaml.load((REPO_ROOT / "mkdocs.yml").read_text(), Loader=_Loader)


def nav_files(nav) -> list[str]:
    """Every page the nav names, in order (an entry is "page.md", {title: "page.md"} or {title: [entries]})."""
    out = []
    for entry in nav if isinstance(nav, list) else [nav]:
        if isinstance(entry, str):
            out.append(entry)
        else:
            for value in entry.values():
                out += [value] if isinstance(value, str) else nav_files(value)
    return out


def pages() -> list[str]:
    excluded = tuple(line.strip().rstrip("/") + "/" for line in config()["exclude_docs"].splitlines() if line.strip())
    return sorted(
        p.relative_to(DOCS).as_posix()
        for p in DOCS.rglob("*.md")
        if not p.relative_to(DOCS).as_posix().startswith(excluded)
    )


def hook(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_hooks_{name}", DOCS / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_a_front_page_whose_links_exist():
    text = (REPO_ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200, "the README is the front page: the rest belongs in the manual (docs/)"
    for target in ("make demo", "make test", "```mermaid"):
        assert target in text, target
    links = LINK.findall(text)
    assert any(t.startswith("docs/") for t in links), "the README says where to read next"
    for target in links:
        if "://" in target:
            continue
        path = target.split("#", 1)[0]
        assert path and (REPO_ROOT / path).exists(), f"README links to {target}, which does not exist"


def test_the_nav_names_every_page_and_only_pages_that_exist():
    cfg = config()
    assert cfg["strict"] is True and cfg["docs_dir"] == "docs"
    named = nav_files(cfg["nav"])
    assert len(named) == len(set(named)), "a page is in the nav twice"
    missing = [p for p in named if not (DOCS / p).is_file()]
    assert not missing, f"the nav names pages that do not exist: {missing}"
    left_out = sorted(set(pages()) - set(named))
    assert not left_out, f"pages not in mkdocs.yml's nav: {left_out}"
    assert "runbooks/README.md" in named  # the runbooks keep their paths: alerts' runbook_url names them


def test_the_build_validates_links_and_anchors():
    validation = config()["validation"]
    assert set(validation["nav"].values()) == {"warn"}  # --strict turns each warning into a failure
    assert {validation["links"][k] for k in ("not_found", "anchors", "unrecognized_links")} == {"warn"}


def test_every_figure_a_page_asks_for_renders_from_the_results():
    figures = hook("figures")
    asked = set()
    for page in pages():
        text = (DOCS / page).read_text()
        asked |= set(figures.MARKER.findall(text))
        rendered = figures.render(text)
        assert "<!-- figure:" not in rendered, page
    assert asked == set(figures.FIGURES), f"figures no page asks for: {set(figures.FIGURES) - asked}"
    bench = figures.bench()
    for result in (REPO_ROOT / "benchmarks" / "results").glob("*.json"):
        assert f"| {result.stem} |" in bench, f"{result.name} is not in the benchmarks table"


def test_links_out_of_the_docs_are_copied_into_the_site():
    links = hook("links")
    assert links.outside_target("runbooks/ReplicaDown.md", "../../deploy/prometheus/alerts.yml").as_posix() == (
        "deploy/prometheus/alerts.yml"
    )
    assert links.outside_target("runbooks/ReplicaDown.md", "../../deploy/no-such-file.yml") is None
    assert links.outside_target("index.md", "gateway.md") is None  # a page: MkDocs resolves it
    assert links.table_code_pipes("| `a\\|b` | c\\|d |") == "| `a|b` | c\\|d |"


def test_every_figure_is_a_whole_table_or_a_printed_block():
    """Each figure renders as one Markdown table whose rows have the header's cells (an empty cell is kept, not
    dropped), or as a fenced block as the command prints it."""
    figures = hook("figures")
    cell_sep = re.compile(r"(?<!\\)\|")
    for name, render in figures.FIGURES.items():
        text = render()
        if text.startswith("```"):
            assert text.endswith("```") and text.count("```") == 2, name
            continue
        rows = [line for line in text.splitlines() if line.startswith("|")]
        assert rows and text.startswith(rows[0]), name
        widths = {len(cell_sep.findall(row)) for row in rows}
        assert len(widths) == 1, f"{name}: rows of different widths {widths}"
        assert set(rows[1].strip("|").split("|")) == {"---"}, name


def test_records_recovered_from_git_history_name_their_source_and_command():
    """A figure once typed by hand whose run left no record gets one only from the file a commit landed: the
    record says which file at which commit, and the command that wrote it."""
    records = REPO_ROOT / "benchmarks" / "results" / "records"
    recovered = [p for p in records.glob("*.json") if "source" in json.loads(p.read_text())]
    assert {p.name for p in recovered} >= {"delta_inplace_alone.json", "learning_one_pass.json"}
    for p in recovered:
        rec = json.loads(p.read_text())
        assert re.fullmatch(r"[0-9a-f]{7,40}", rec["commit"]), p.name
        assert rec["commit"] in rec["source"] and rec["command"].startswith("python -m benchmarks"), p.name


def test_figure_helpers_round_as_written():
    figures = hook("figures")
    assert [figures._pct(x) for x in (1, 0.5475, 0.54, 0.9577)] == ["100%", "54.8%", "54.0%", "95.8%"]
    assert figures._ratio(0.715) == "0.72x" and str(figures._round(0.8935, 3)) == "0.894"
    assert figures._mean_59_459([[0, 0.0], [59, 0.5], [459, 1.0], [460, 0.0]]) == 0.75
