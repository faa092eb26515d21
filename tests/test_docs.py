"""The user docs (README.md, docs/*.md) point at things that exist.

Fast and without MindSpore: every repository path named in backticks, code blocks or Markdown links
must exist, every link must stay inside the repository (and its #anchor must be a heading of the
page it names), and every `relaygr <command>` must be a command of the real `relaygr` parser.
"""

from __future__ import annotations

import argparse
import re
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.markdown import FENCE, INLINE_CODE, LINK, link_problems, slug

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Paths that the documented commands create (or that set-up creates): not in a fresh clone.
CREATED = ("outputs/", ".venv/")
# Extensions that make a token with a '/' a file path even when its first directory is misspelt.
FILE_EXTENSIONS = (".py", ".sh", ".yaml", ".yml", ".json", ".md", ".png", ".cc", ".txt", ".toml", ".conf", ".template")
TOKEN_SPLIT = re.compile(r"[\s=,;\"'()\[\]{}|<>]+")
RELAYGR_COMMAND = re.compile(r"(?<![\w./-])relaygr[ \t]+([a-z][\w-]*)(?:[ \t]+([a-z][\w-]*))?")
UPPER_SEGMENT = re.compile(r"^[A-Z][A-Z0-9_]*$")  # OUTPUT_DIR, PROFILE (.json): placeholders, unless a real name


def _text(doc: Path) -> str:
    return doc.read_text(encoding="utf-8")


def _code(text: str) -> list[str]:
    """Every fenced code block and inline code span of a Markdown text."""
    blocks = FENCE.findall(text)
    return blocks + INLINE_CODE.findall(FENCE.sub("", text))


def _prose(text: str) -> str:
    """The text without code blocks and inline code (where Markdown links live)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


@cache
def _top_level() -> frozenset[str]:
    return frozenset(p.name for p in REPO.iterdir() if not p.name.startswith("."))


@cache
def _upper_case_names() -> frozenset[str]:
    """Upper-case file and directory names of the repository (README...): these are not placeholders."""
    names = set()
    for top in _top_level() - {"outputs"}:
        for path in [REPO / top, *(REPO / top).rglob("*")]:
            names.update(part for part in path.name.split(".") if UPPER_SEGMENT.match(part))
    return frozenset(names)


def _is_placeholder(token: str) -> bool:
    """`$RUN_DIR/x`, `results/*.json`, `~/.cache/...`, `OUTPUT_DIR/msrun_log/`: not a literal path."""
    if any(c in token for c in "$*~"):
        return True
    parts = [p for seg in token.split("/") for p in seg.split(".")]
    return any(UPPER_SEGMENT.match(p) and p not in _upper_case_names() for p in parts)


def _looks_like_repo_path(token: str) -> bool:
    """A relative path with a directory part whose first directory is one of the repository's, or that
    names a file by extension. URLs, absolute paths and placeholders are not."""
    if "/" not in token or "://" in token or token.startswith(("/", "-", "@")) or _is_placeholder(token):
        return False
    return token.split("/", 1)[0] in _top_level() or token.endswith(FILE_EXTENSIONS)


def _paths(doc: Path) -> list[str]:
    found = []
    for code in _code(_text(doc)):
        for raw in TOKEN_SPLIT.split(code):
            token = raw.strip(".:`").removeprefix("./")
            if "..." in token:  # "results/..." names a directory's contents
                token = token.split("...", 1)[0]
                if not token.endswith("/"):
                    continue
            if token and _looks_like_repo_path(token) and not token.startswith(CREATED):
                found.append(token)
    return sorted(set(found))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_in_the_docs_exists(doc):
    missing = [p for p in _paths(doc) if not (REPO / p).exists()]
    assert not missing, f"{doc.relative_to(REPO)} names paths that do not exist in the repository: {missing}"






def _links(doc: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(_text(doc))) if not re.match(r"[a-z][a-z+.-]*:", t)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_stays_in_the_repository_and_resolves(doc):
    problems = link_problems(doc, _links(doc), REPO)
    assert not problems, f"{doc.relative_to(REPO)}: " + "; ".join(problems)


@cache
def _commands() -> dict[str, frozenset[str]]:
    """`relaygr` command -> its subcommands (empty for a command without any), from the real parser."""
    from mindspore_relaygr.cli import build_parser
    from serving.cli import register

    def choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        return next((dict(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})

    return {name: frozenset(choices(sub)) for name, sub in choices(build_parser(extend=register)).items()}


def _relaygr_calls(doc: Path) -> list[tuple[str, str | None]]:
    calls = []
    for code in _code(_text(doc)):
        calls += [(m.group(1), m.group(2)) for m in RELAYGR_COMMAND.finditer(code)]
    return calls


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relaygr_command_in_the_docs_exists(doc):
    commands = _commands()
    wrong = []
    for command, sub in _relaygr_calls(doc):
        if command not in commands:
            wrong.append(f"relaygr {command}")
        elif commands[command] and sub is not None and sub not in commands[command]:
            wrong.append(f"relaygr {command} {sub}")
    assert not wrong, f"{doc.relative_to(REPO)} uses commands that `relaygr` does not have: {sorted(set(wrong))}"


def test_the_checker_sees_what_it_checks():
    """Guard against a checker that silently finds nothing (a changed regex, an empty docs/)."""
    readme = REPO / "README.md"
    assert "configs/tiny.yaml" in _paths(readme)
    assert "scripts/run_demo.sh" in _paths(readme)
    assert "serve" in {command for command, _ in _relaygr_calls(readme)}
    assert {"serve", "cluster", "bench"} <= set(_commands()) and "overload" in _commands()["bench"]
    assert len(DOCS) > 1, "docs/*.md is empty"
    assert _looks_like_repo_path("model_zoo/relaygr_hstu/README.md") and _looks_like_repo_path("config/tiny.yaml")
    for not_a_path in ("OUTPUT_DIR/msrun_log/", "https://example.org/a.md", "/v1/rank", "~/.cache/x.json"):
        assert not _looks_like_repo_path(not_a_path), not_a_path
    heading = "Overload: admission control (`relaygr bench overload`)"
    assert slug(heading) == "overload-admission-control-relaygr-bench-overload"
