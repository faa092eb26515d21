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


def shipped_names() -> list[str]:
    """The shipped configs by name (tiny, ml1m, ...)."""
    return sorted(p.stem for p in config_dir().glob("*.yaml"))


def config_arg(text: str) -> str:
    """argparse type of --config: a file or a shipped config's name (`tiny`, `tiny.yaml`, `configs/tiny.yaml`),
    as the path of the file it names. argparse applies it to a default given by name too, so --help shows the
    name and the command gets the path."""
    import argparse

    from mindspore_relaygr.config import resolve_config_path
    from mindspore_relaygr.errors import ConfigError

    try:
        return str(resolve_config_path(text))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


CONFIG_HELP = "YAML config: a file, or a shipped config by name ({names}); default: %(default)s"


def config_help(extra: str = "") -> str:
    """--config's help text, naming the shipped configs."""
    return CONFIG_HELP.format(names=", ".join(shipped_names())) + extra
