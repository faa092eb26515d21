"""The model-zoo pages (model_zoo/relaygr_hstu/README.md and experiments/*.md) and their results/ directory agree.

Fast and without MindSpore. On every page (the README and each experiment page): every file it links or names in
code exists, every link stays inside the repository (and its #anchor is a heading of the page it names), it reads
as documentation rather than a run diary, and every `relaygr` command it prints exists with the options it uses.
Across the pages: every file in results/ is referenced from exactly one page. The README keeps the model-zoo
template short: at most README_MAX_LINES lines, one performance table, and a list linking every experiment page
once; each experiment page starts with its title and a link back to the README.
"""

from __future__ import annotations

import argparse
import re
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.markdown import FENCE, HEADING, INLINE_CODE, LINK, anchors, link_problems, slug

ZOO = REPO / "model_zoo" / "relaygr_hstu"
README = ZOO / "README.md"
EXPERIMENTS = ZOO / "experiments"
RESULTS = ZOO / "results"
README_MAX_LINES = 400
# Phrases of a lab notebook, not of documentation for users (matched case-insensitively, as whole words).
DIARY_PHRASES = ("this run", "earlier run", "previous run", "target met", "target missed", "this VM",
                 "this session")
CREATED = ("outputs/", ".venv/")  # made by the documented commands, not in a clone
FILE_EXTENSIONS = (".py", ".sh", ".yaml", ".yml", ".json", ".md", ".png", ".cc", ".txt", ".toml")
TOKEN_SPLIT = re.compile(r"[\s=,;\"'()\[\]{}|<>]+")
UPPER_SEGMENT = re.compile(r"^[A-Z][A-Z0-9_]*$")  # DIR, OUTPUT_DIR: placeholders (README, LICENSE are not)
RELAYGR_COMMAND = re.compile(r"(?<![\w./-])relaygr[ \t]+([a-z][\w-]*)(?:[ \t]+([a-z][\w-]*))?")
OPTION = re.compile(r"(?<![\w-])--[a-z][\w-]*")
# A Markdown table: a row of cells followed by its delimiter row (| --- | ---: |).
TABLE_START = re.compile(r"^\|.*\|[ \t]*\n\|(?:[ \t]*:?-{3,}:?[ \t]*\|)+[ \t]*$", re.M)


def _pages() -> list[Path]:
    return [README, *sorted(EXPERIMENTS.glob("*.md"))]


PAGES = _pages()


def _id(page: Path) -> str:
    return str(page.relative_to(ZOO))


def _text(page: Path = README) -> str:
    return page.read_text(encoding="utf-8")


def _code(text: str) -> list[str]:
    """The fenced code blocks and inline code spans of a Markdown text."""
    return FENCE.findall(text) + INLINE_CODE.findall(FENCE.sub("", text))


def _links(text: str) -> list[str]:
    """Targets of the Markdown links and images outside code."""
    return LINK.findall(INLINE_CODE.sub("", FENCE.sub("", text)))


def _is_placeholder(token: str) -> bool:
    if any(c in token for c in "$*~"):
        return True
    parts = [p for segment in token.split("/") for p in segment.split(".")]
    return any(UPPER_SEGMENT.match(p) and p not in ("README", "LICENSE") for p in parts)


def _resolve(token: str, page: Path = README) -> Path | None:
    """The file a code token of `page` names (results/... is the model zoo's results directory, ../... is relative
    to the page, the rest to the repository), or None for a token that is not a repository path."""
    token = token.rstrip(".:`") if token.startswith("../") else token.strip(".:`").removeprefix("./")
    if "/" not in token or "://" in token or token.startswith(("/", "-", "@")) or token.startswith(CREATED):
        return None
    if _is_placeholder(token):
        return None
    if token.startswith("../"):
        return (page.parent / token).resolve()
    top = token.split("/", 1)[0]
    if top == "results":
        return ZOO / token
    if (REPO / top).exists() or token.endswith(FILE_EXTENSIONS):
        return REPO / token
    return None


def _named_paths(page: Path) -> dict[str, Path]:
    """Every repository path the page names in code or links to: token -> resolved path."""
    text = _text(page)
    found = {}
    for code in _code(text):
        for raw in TOKEN_SPLIT.split(code):
            path = _resolve(raw, page)
            if path is not None:
                found[raw] = path
    for target in _links(text):
        path_part = target.partition("#")[0]
        if path_part and not re.match(r"[a-z][a-z+.-]*:", path_part):
            found[target] = (page.parent / path_part).resolve()
    return found


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_named_file_exists(page):
    missing = sorted(token for token, path in _named_paths(page).items() if not path.exists())
    assert not missing, f"{page.relative_to(REPO)} names files that do not exist: {missing}"


def test_every_result_file_is_referenced_from_exactly_one_page():
    referenced_by: dict[Path, list[str]] = {}
    for page in PAGES:
        for path in {p.resolve() for p in _named_paths(page).values()}:
            referenced_by.setdefault(path, []).append(_id(page))
    problems = []
    for result in sorted(p for p in RESULTS.iterdir() if p.is_file()):
        pages = referenced_by.get(result.resolve(), [])
        if not pages:
            problems.append(f"{result.name}: referenced from no page (link it next to the command that makes it, "
                            f"or delete it)")
        elif len(pages) > 1:
            problems.append(f"{result.name}: referenced from {len(pages)} pages {sorted(pages)} (keep the link "
                            f"in the experiment page and link that page from the others)")
    assert not problems, f"files in {RESULTS.relative_to(REPO)}: " + "; ".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_link_stays_in_the_repository_and_resolves(page):
    targets = _links(_text(page))
    problems = [f"{t}: links outside the repository" for t in targets if re.match(r"[a-z][a-z+.-]*:", t)]
    problems += link_problems(page, [t for t in targets if not re.match(r"[a-z][a-z+.-]*:", t)], REPO)
    assert not problems, f"{page.relative_to(REPO)}: " + "; ".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_no_diary_phrases(page):
    text = _text(page)
    found = sorted({m.group(0) for phrase in DIARY_PHRASES
                    for m in re.finditer(rf"\b{re.escape(phrase)}\b", text, re.I)})
    assert not found, (f"{page.relative_to(REPO)} reads like a run diary ({found}): describe the current "
                       f"result for its users, with its date, machine and command")


@cache
def _parsers() -> dict[str, argparse.ArgumentParser]:
    """'train', 'bench model', ... -> its parser, from the real `relaygr` parser (no MindSpore import)."""
    from mindspore_relaygr.cli import build_parser
    from serving.cli import register

    def choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        return next((dict(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})

    parsers = {}
    for name, sub in choices(build_parser(extend=register)).items():
        parsers[name] = sub
        parsers.update({f"{name} {leaf}": parser for leaf, parser in choices(sub).items()})
    return parsers


def _relaygr_calls(text: str) -> list[tuple[str, list[str]]]:
    """(command, options) of every `relaygr ...` in the page's code; continued lines joined, comments cut."""
    calls = []
    for code in _code(text):
        for line in code.replace("\\\n", " ").splitlines():
            for m in RELAYGR_COMMAND.finditer(line):
                command = m.group(1) if m.group(2) is None or f"{m.group(1)} {m.group(2)}" not in _parsers() \
                    else f"{m.group(1)} {m.group(2)}"
                rest = line[m.end(1):].split(" #", 1)[0]
                calls.append((command, OPTION.findall(rest)))
    return calls


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_relaygr_command_and_option_exists(page):
    parsers = _parsers()
    wrong = set()
    for command, options in _relaygr_calls(_text(page)):
        parser = parsers.get(command)
        if parser is None:
            wrong.add(f"relaygr {command}")
            continue
        wrong.update(f"relaygr {command} {o}" for o in options if o not in parser._option_string_actions)
    assert not wrong, (f"{page.relative_to(REPO)} prints commands or options `relaygr` does not have: "
                       f"{sorted(wrong)}")


def _section(text: str, title: str, level: int = 1) -> str:
    """The body of the heading `title` of `level` (#, ##, ...) up to the next heading of that level or higher;
    code blocks removed (a `# comment` in a shell block is no heading)."""
    text = FENCE.sub("", text)
    headings = [(m.start(), m.end(), len(m.group(1)), m.group(2)) for m in HEADING.finditer(text)]
    start = next((end for _, end, lvl, t in headings if lvl == level and t == title), None)
    assert start is not None, f"no {'#' * level} {title} heading"
    stop = next((s for s, _, lvl, _ in headings if s > start and lvl <= level), len(text))
    return text[start:stop]


def _tables(text: str) -> int:
    """How many Markdown tables a text holds (a row followed by its delimiter row starts one)."""
    return len(TABLE_START.findall(text))


def test_readme_is_short():
    lines = _text(README).count("\n")
    assert lines <= README_MAX_LINES, (f"{README.relative_to(REPO)} has {lines} lines (at most {README_MAX_LINES}): "
                                       f"move experiment write-ups into {EXPERIMENTS.relative_to(REPO)}/")


def test_readme_performance_section_has_one_table():
    """The `# Performance` section, its subsections included, holds exactly one Markdown table (the template's
    performance table); every other table lives in an experiment page."""
    count = _tables(_section(_text(README), "Performance"))
    assert count == 1, (f"{README.relative_to(REPO)}: the # Performance section holds {count} tables, not one; "
                        f"merge them or move them into the experiment pages")


def test_readme_lists_every_experiment_page_once():
    """`## Experiments` of the Performance section links each page of experiments/ exactly once and nothing else
    there."""
    experiments = _section(_section(_text(README), "Performance"), "Experiments", level=2)
    linked = [(README.parent / t.partition("#")[0]).resolve() for t in _links(experiments)
              if t.startswith("experiments/")]
    pages = sorted(p.resolve() for p in EXPERIMENTS.glob("*.md"))
    assert pages, f"{EXPERIMENTS.relative_to(REPO)} holds no page"
    missing = [p.name for p in pages if p not in linked]
    twice = sorted({p.name for p in linked if linked.count(p) > 1})
    assert not missing and not twice, (f"{README.relative_to(REPO)} ## Experiments: pages not listed {missing}, "
                                       f"listed more than once {twice}")


@pytest.mark.parametrize("page", PAGES[1:], ids=_id)
def test_experiment_page_starts_with_title_and_back_link(page):
    lines = [line for line in _text(page).splitlines() if line.strip()]
    assert lines and re.match(r"# \S", lines[0]), f"{page.relative_to(REPO)} does not start with a `# Title`"
    assert len(lines) > 1 and "](../README.md" in lines[1], (f"{page.relative_to(REPO)}: the line after the title "
                                                             f"is no link back to ../README.md")


def test_the_checker_sees_what_it_checks():
    """Guard against a checker that silently finds nothing (a changed regex, a moved page)."""
    assert len(PAGES) > 10, "experiments/ lost its pages"
    max_seq = EXPERIMENTS / "max_seq.md"
    assert ZOO / "results" / "max_seq.json" in {p.resolve() for p in _named_paths(max_seq).values()}
    assert REPO / "configs" / "ml1m.yaml" in {p.resolve() for p in _named_paths(README).values()}
    assert _resolve("outputs/ml1m/best.ckpt") is None and _resolve("OUTPUT_DIR/x.json") is None
    assert _resolve("results/missing.json") == ZOO / "results" / "missing.json"
    assert _resolve("../results/missing.json", max_seq) == ZOO / "results" / "missing.json"
    options: dict[str, set[str]] = {}
    for command, opts in _relaygr_calls(_text(max_seq)):
        options.setdefault(command, set()).update(opts)
    assert "--lengths" in options.get("bench max-seq", set())
    assert "train" in {command for command, _ in _relaygr_calls(_text(README))}
    assert slug("Overload: admission control (`relaygr bench overload`)") == \
        "overload-admission-control-relaygr-bench-overload"
    assert (EXPERIMENTS / "overload.md").exists()  # linked from docs/serving.md
    assert "headline-method-longest-sequence-slo-throughput-ablations" in anchors(README)  # linked from pages
    two = "| a | b |\n| --- | ---: |\n| 1 | 2 |\n\ntext | not a table\n\n| c |\n|---|\n| 3 |\n"
    assert _tables(two) == 2 and _tables("| a | b |\n| 1 | 2 |\n") == 0
    assert _section("# A\n\n```bash\n# not a heading\n```\n| x |\n# B\n| y |\n", "A").strip() == "| x |"
