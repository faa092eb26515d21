"""The units of the parallel test run (tests/conftest.py): files that share per-process state run together."""

from __future__ import annotations

import re

from tests.conftest import LONG_FILES, REPO, SHARED_STATE_GROUPS, work_unit

TEST_FILES = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tests").rglob("test_*.py"))


def _files_using(pattern: str) -> set[str]:
    return {path for path in TEST_FILES if re.search(pattern, (REPO / path).read_text())}


def test_every_named_file_exists():
    for group, paths in SHARED_STATE_GROUPS.items():
        missing = [path for path in paths if path not in TEST_FILES]
        assert not missing, f"group {group!r} names files that do not exist: {missing}"
    for name in LONG_FILES:
        assert any(path.endswith(name) for path in TEST_FILES), f"LONG_FILES names no test file: {name}"


def test_a_group_is_one_unit_and_other_files_their_own():
    batched, exactness = "tests/model/test_batched.py", "tests/model/test_exactness.py"  # one group
    assert work_unit(f"{batched}::test_x[plain]") == work_unit(f"{exactness}::test_y") != batched
    assert work_unit("tests/model/test_validation.py::test_z") == "tests/model/test_validation.py"
    assert work_unit("tests/model/test_validation.py::test_z") != work_unit("tests/model/test_warmup.py::test_z")


def test_every_user_of_shared_state_is_in_its_group():
    """A file that takes the shared tiny models or the trained run outside its group would build them again in
    another worker: correct, but the compile or the training is paid twice."""
    def grouped(prefix: str) -> set[str]:
        return {path for group, paths in SHARED_STATE_GROUPS.items() if group.startswith(prefix) for path in paths}

    assert _files_using(r"\bshared_tiny\(") == grouped("shared tiny models")
    assert _files_using(r"\btrained_run\b") == grouped("trained tiny run")
    assert grouped("shared tiny models") | grouped("trained tiny run") == grouped("")
