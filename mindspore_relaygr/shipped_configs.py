"""The YAML configs of the repository's `configs/`, wherever the package runs from.

In a source checkout (editable install) they are read from `configs/`; a built wheel carries copies
in `mindspore_relaygr/configs/` (setup.py's build step), so `relaygr` works outside the tree too.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent / "configs"  # installed from a wheel
SOURCE_DIR = Path(__file__).resolve().parents[1] / "configs"  # a checkout


def config_dir() -> Path:
    """The directory holding tiny.yaml, ml1m.yaml, bench_long.yaml, ..."""
    return PACKAGE_DIR if PACKAGE_DIR.is_dir() else SOURCE_DIR


def shipped_config(name: str) -> Path:
    """Path of a shipped config by file name (e.g. "ml1m.yaml"); it may not exist if misnamed."""
    return config_dir() / name
