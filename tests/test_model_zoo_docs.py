"""The model-zoo page (model_zoo/relaygr_hstu/README.md) and its results/ directory agree.

Fast and without MindSpore: every file the page links or names in code exists, every link stays inside the
repository (and its #anchor is a heading of the page it names), every file in results/ is referenced from the
page, the page reads as documentation rather than a run diary, and every `relaygr` command it prints exists
with the options it uses.
"""

from __future__ import annotations

import argparse
import re
from functools import cache
from pathlib import Path

from tests.conftest import REPO
from tests.markdown import FENCE, INLINE_CODE, LINK, anchors, link_problems, slug

ZOO = REPO / "model_zoo" / "relaygr_hstu"
README = ZOO / "README.md"
RESULTS = ZOO / "results"
# Phrases of a lab notebook, not of documentation for users (matched case-insensitively, as whole words).
DIARY_PHRASES = ("this run", "earlier run", "previous run", "target met", "target missed", "this VM",
                 "this session")
CREATED = ("outputs/", ".venv/")  # made by the documented commands, not in a clone
FILE_EXTENSIONS = (".py", ".sh", ".yaml", ".yml", ".json", ".md", ".png", ".cc", ".txt", ".toml")
TOKEN_SPLIT = re.compile(r"[\s=,;\"'()\[\]{}|<>]+")
UPPER_SEGMENT = re.compile(r"^[A-Z][A-Z0-9_]*$")  # DIR, OUTPUT_DIR: placeholders (README, LICENSE are not)
RELAYGR_COMMAND = re.compile(r"(?<![\w./-])relaygr[ \t]+([a-z][\w-]*)(?:[ \t]+([a-z][\w-]*))?")
OPTION = re.compile(r"(?<![\w-])--[a-z][\w-]*")


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


def _resolve(token: str) -> Path | None:
    """The file a code token names (results/... is relative to the page, the rest to the repository), or None
    for a token that is not a repository path."""
    token = token.strip(".:`").removeprefix("./")
    if "/" not in token or "://" in token or token.startswith(("/", "-", "@")) or token.startswith(CREATED):
        return None
    if _is_placeholder(token):
        return None
    top = token.split("/", 1)[0]
    if top == "results":
        return ZOO / token
    if (REPO / top).exists() or token.endswith(FILE_EXTENSIONS):
        return REPO / token
    return None


def _named_paths(text: str) -> dict[str, Path]:
    """Every repository path the page names in code or links to: token -> resolved path."""
    found = {}
    for code in _code(text):
        for raw in TOKEN_SPLIT.split(code):
            path = _resolve(raw)
            if path is not None:
                found[raw] = path
    for target in _links(text):
        path_part = target.partition("#")[0]
        if path_part and not re.match(r"[a-z][a-z+.-]*:", path_part):
            found[target] = (README.parent / path_part).resolve()
    return found


def test_every_named_file_exists():
    missing = sorted(token for token, path in _named_paths(_text()).items() if not path.exists())
    assert not missing, f"{README.relative_to(REPO)} names files that do not exist: {missing}"


def test_every_result_file_is_referenced():
    named = {path.resolve() for path in _named_paths(_text()).values()}
    unreferenced = sorted(p.name for p in RESULTS.iterdir() if p.is_file() and p.resolve() not in named)
    assert not unreferenced, (f"files in {RESULTS.relative_to(REPO)} that {README.relative_to(REPO)} never "
                              f"references (link them next to the command that makes them, or delete them): "
                              f"{unreferenced}")






def test_every_link_stays_in_the_repository_and_resolves():
    targets = _links(_text())
    problems = [f"{t}: links outside the repository" for t in targets if re.match(r"[a-z][a-z+.-]*:", t)]
    problems += link_problems(README, [t for t in targets if not re.match(r"[a-z][a-z+.-]*:", t)], REPO)
    assert not problems, f"{README.relative_to(REPO)}: " + "; ".join(problems)


def test_no_diary_phrases():
    text = _text()
    found = sorted({m.group(0) for phrase in DIARY_PHRASES
                    for m in re.finditer(rf"\b{re.escape(phrase)}\b", text, re.I)})
    assert not found, (f"{README.relative_to(REPO)} reads like a run diary ({found}): describe the current "
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


def test_every_relaygr_command_and_option_exists():
    parsers = _parsers()
    wrong = set()
    for command, options in _relaygr_calls(_text()):
        parser = parsers.get(command)
        if parser is None:
            wrong.add(f"relaygr {command}")
            continue
        wrong.update(f"relaygr {command} {o}" for o in options if o not in parser._option_string_actions)
    assert not wrong, f"{README.relative_to(REPO)} prints commands or options `relaygr` does not have: {sorted(wrong)}"


def test_the_checker_sees_what_it_checks():
    """Guard against a checker that silently finds nothing (a changed regex, a moved page)."""
    text = _text()
    named = _named_paths(text)
    assert ZOO / "results" / "max_seq.json" in named.values()
    assert REPO / "configs" / "ml1m.yaml" in {p.resolve() for p in named.values()}
    assert _resolve("outputs/ml1m/best.ckpt") is None and _resolve("OUTPUT_DIR/x.json") is None
    assert _resolve("results/missing.json") == ZOO / "results" / "missing.json"
    options: dict[str, set[str]] = {}
    for command, opts in _relaygr_calls(text):
        options.setdefault(command, set()).update(opts)
    assert "--lengths" in options.get("bench max-seq", set()) and "train" in options
    assert slug("Overload: admission control (`relaygr bench overload`)") == \
        "overload-admission-control-relaygr-bench-overload"
    assert "overload-admission-control-relaygr-bench-overload" in anchors(README)  # linked from README.md
