"""Where templates/ and matrices/ live: in the installed package, or beside it in a checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # envbuild/


def data_dir(name: str) -> Path:
    """The `templates` or `matrices` folder this envbuild was installed or checked out with."""
    installed = _PACKAGE / "_data" / name
    if installed.is_dir():
        return installed
    return _PACKAGE.parent / name


def templates_dir() -> Path:
    """Folder of the Jinja Dockerfile templates."""
    return data_dir("templates")


def matrices_dir() -> Path:
    """Folder of the knowledge base and the shipped matrices."""
    return data_dir("matrices")


def payload_dir() -> Path:
    """The folder of the payloads: the scripts that run inside containers, and their harnesses."""
    return _PACKAGE / "payload"
