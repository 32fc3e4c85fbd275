"""The checker that walks one knowledge file: every problem collected with its place, and the
source ids its facts cite."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

from envbuild.core.errors import MatrixError
from envbuild.core.models import CPU
from envbuild.core.names import shown
from envbuild.core.yamlfile import path_label, read_yaml, yaml_kind

# The shapes of the values knowledge files hold.
DRIVER = re.compile(r"[0-9]{1,4}(?:\.[0-9]{1,4}){0,2}")
CUDA_KEY = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3})?")
CUDA_MINOR = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}")
CUDA_MAJOR = re.compile(r"[0-9]{1,3}")
CC = re.compile(r"[0-9]{1,2}\.[0-9]")
PYTHON = re.compile(r"3\.[0-9]{1,3}")
SERIES = re.compile(r"\*|[0-9]{1,4}\.[0-9]{1,4}")
VARIANT_NAME = re.compile(rf"{CPU}|{CUDA_KEY.pattern}")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._+-]{0,63}")


def suggest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """A '; did you mean ...?' hint for a misspelt key, or nothing."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f"; did you mean {match[0]!r}?" if match else ""


def shorten(names: list[str], limit: int = 8) -> str:
    """The first names of a list, and how many there are in all."""
    shown_names = ", ".join(names[:limit])
    return shown_names + (f", ... ({len(names)} in all)" if len(names) > limit else "")


class Checker:
    """Collects every problem in one knowledge file, with its location."""

    def __init__(self, path: Path, data: dict[Any, Any], allowed: tuple[str, ...]) -> None:
        self.path = path
        self.label = path_label(path)
        self.problems: list[str] = []
        self.keys("", data, allowed)
        self.sources: dict[str, str] = {}
        for key, text in self.table("", data, "sources").items():
            if isinstance(text, str):
                self.sources[key] = text
            else:
                self.fail(f"sources.{key}", f"expected a string, got {yaml_kind(text)}")
        if data.get("sources") == {}:
            self.fail("sources", "empty; name the sources the facts come from")

    def fail(self, where: str, what: str) -> None:
        self.problems.append(f"{self.label}: {where or 'top level'}: {what}")

    def keys(self, where: str, item: dict[Any, Any], allowed: tuple[str, ...]) -> None:
        """Report every key that is not one of `allowed`, with a suggestion."""
        for key in item:
            place = f"{where}.{key}" if where else str(key)
            if not isinstance(key, str):
                self.fail(where, f"key {shown(str(key))} is {yaml_kind(key)}; expected a name")
            elif key not in allowed:
                self.fail(
                    shown(place) if not place.isprintable() or len(place) > 80 else place,
                    f"unknown key{suggest(key, allowed)} (allowed: {', '.join(allowed)})",
                )

    def table(
        self,
        where: str,
        item: dict[Any, Any],
        key: str,
        *,
        names: re.Pattern[str] | None = None,
        hint: str = "",
        required: bool = True,
    ) -> dict[str, Any]:
        """`item[key]`, a mapping of names to values; names must be strings matching `names`."""
        place = f"{where}.{key}" if where else key
        value = item.get(key)
        if value is None:
            if required:
                self.fail(place, "missing; see the other knowledge files for its shape")
            return {}
        if not isinstance(value, dict):
            self.fail(place, f"expected a mapping, got {yaml_kind(value)}")
            return {}
        result = {}
        for name, entry in value.items():
            if not isinstance(name, str):
                self.fail(place, f"key {shown(str(name))} is {yaml_kind(name)}; quote it")
            elif names is not None and not names.fullmatch(name):
                self.fail(place, f"key {shown(name)} is not {hint}")
            else:
                result[name] = entry
        return result

    def mapping(self, where: str, value: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
        """`value` as a mapping with only the `allowed` keys; {} after reporting otherwise."""
        if not isinstance(value, dict):
            self.fail(where, f"expected a mapping, got {yaml_kind(value)}")
            return {}
        self.keys(where, value, allowed)
        return {k: v for k, v in value.items() if isinstance(k, str)}

    def text(
        self,
        where: str,
        item: dict[str, Any],
        key: str,
        *,
        required: bool = False,
        pattern: re.Pattern[str] | None = None,
        hint: str = "",
    ) -> str | None:
        """`item[key]` as a string, None when absent; a wrong type or form is reported."""
        place = f"{where}.{key}" if where else key
        value = item.get(key)
        if value is None:
            if required:
                self.fail(place, "missing" if key not in item else "expected a string, got null")
            return None
        if not isinstance(value, str):
            self.fail(place, f"expected a string, got {yaml_kind(value)}")
            return None
        if pattern is not None and not pattern.fullmatch(value):
            self.fail(place, f"{shown(value)} is not {hint}")
            return None
        return value

    def texts(
        self,
        where: str,
        item: dict[str, Any],
        key: str,
        *,
        required: bool = False,
        pattern: re.Pattern[str] | None = None,
        hint: str = "",
    ) -> tuple[str, ...]:
        """`item[key]` as a list of strings; problems reported, bad items left out."""
        place = f"{where}.{key}" if where else key
        value = item.get(key)
        if value is None:
            if required:
                self.fail(place, "missing; give a list")
            return ()
        if not isinstance(value, list):
            self.fail(place, f"expected a list, got {yaml_kind(value)}")
            return ()
        result = []
        for i, entry in enumerate(value):
            if not isinstance(entry, str):
                self.fail(f"{place}[{i}]", f"expected a string, got {yaml_kind(entry)}")
            elif pattern is not None and not pattern.fullmatch(entry):
                self.fail(f"{place}[{i}]", f"{shown(entry)} is not {hint}")
            else:
                result.append(entry)
        return tuple(result)

    def template(self, where: str, item: dict[str, Any], key: str, placeholder: str) -> str | None:
        """A string that may use `placeholder` and no other braces."""
        value = self.text(where, item, key)
        if value is not None and (
            "{" in value.replace(placeholder, "") or "}" in value.replace(placeholder, "")
        ):
            self.fail(
                f"{where}.{key}", f"may use only the placeholder {placeholder}; remove other braces"
            )
            return None
        return value

    def source(self, where: str, item: dict[str, Any], field: str = "source") -> str:
        """Check the item's source key; return its id, qualified by the file ("torch:pypi")."""
        key = item.get(field)
        known = sorted(self.sources)
        if key is None:
            self.fail(where, f"{field}: missing; name one of sources: {shorten(known)}")
        elif not isinstance(key, str):
            self.fail(f"{where}.{field}", f"expected a string, got {yaml_kind(key)}")
        elif key not in self.sources:
            self.fail(
                where,
                f"{field} {shown(key)} is not one of sources: {shorten(known)}"
                + suggest(key, known),
            )
        return f"{self.path.stem}:{key}"

    def qualified_sources(self) -> dict[str, str]:
        return {f"{self.path.stem}:{k}": v for k, v in self.sources.items()}


def read_knowledge_file(path: Path) -> dict[Any, Any]:
    """A knowledge file's top-level mapping; MatrixError naming the file otherwise."""
    data = read_yaml(
        path,
        what="knowledge file",
        missing="restore it from envbuild's matrices/knowledge/",
    )
    if not isinstance(data, dict):
        msg = f"{path_label(path)}: expected a mapping at the top level, got {yaml_kind(data)}"
        raise MatrixError([msg])
    return data
