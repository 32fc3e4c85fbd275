"""The one reader of envbuild's YAML files, knowledge and matrices alike.

A regular file of at most 1 MiB, strict UTF-8, plain YAML only (no tags, no duplicate keys,
bounded nesting, numbers and alias expansion). Anything else is one line naming the file and
the place, raised as MatrixError.
"""

from __future__ import annotations

import codecs
import errno
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.error import Mark, MarkedYAMLError
from yaml.events import AliasEvent, Event
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader, ReaderError
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from envbuild.core.errors import MatrixError
from envbuild.core.files import FileTooLarge, NotRegularFile, read_small_file
from envbuild.core.names import shown

# Bounds on what a YAML file of envbuild's may hold: the whole knowledge base is ~75 kB, nested
# 6 levels, ~20,000 values; a matrix is far smaller.
MAX_YAML_BYTES = 1 << 20
MAX_YAML_DEPTH = 32
MAX_YAML_VALUES = 200_000  # counted through aliases, so an alias bomb stops here
MAX_NUMBER_CHARS = 64  # Python refuses str() of ints over 4,300 digits; no version needs 64
MAX_VERSION_CHARS = 64

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MERGE = "tag:yaml.org,2002:merge"


class _Refused(MarkedYAMLError):
    """A YAML construct envbuild does not read; the problem text carries the fix."""

    def __init__(self, problem: str, mark: Any) -> None:  # yaml's Mark, or libyaml's
        super().__init__(problem=problem, problem_mark=mark)


_COLLECTIONS = (SequenceNode, MappingNode)


class _StrictYaml(Composer, SafeConstructor, Resolver):
    """Safe YAML with bounded depth, expansion and numbers, and no duplicate keys or tags."""

    if TYPE_CHECKING:  # provided by the parser the loader is combined with

        def check_event(self, *choices: type[Event]) -> bool: ...
        def peek_event(self) -> Event: ...
        def dispose(self) -> None: ...

    _depth = 0

    def compose_document(self) -> Node | None:
        self._depth = 0
        self._sizes: dict[Node, int] = {}
        return super().compose_document()

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            target = self.anchors.get(event.anchor)
            if isinstance(target, _COLLECTIONS) and target not in self._sizes:
                msg = (
                    f"the alias *{event.anchor} refers to a collection that holds it; "
                    "write the values out"
                )
                raise _Refused(msg, event.start_mark)
        if self._depth >= MAX_YAML_DEPTH:
            msg = f"nested deeper than {MAX_YAML_DEPTH} levels; flatten it"
            raise _Refused(msg, event.start_mark)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, _COLLECTIONS) and node not in self._sizes:  # scalars count 1
            self._sizes[node] = self._size(node)
        return node

    def _size(self, node: Node) -> int:
        """How many values the node stands for once every alias in it is expanded."""
        size = 1
        if isinstance(node, SequenceNode):
            size += sum(self._sizes.get(child, 1) for child in node.value)
        elif isinstance(node, MappingNode):
            size += sum(self._sizes.get(k, 1) + self._sizes.get(v, 1) for k, v in node.value)
        if size > MAX_YAML_VALUES:
            msg = (
                f"holds more than {MAX_YAML_VALUES} values (each alias counted as often as it "
                "is used); write out what is meant, with fewer aliases"
            )
            raise _Refused(msg, node.start_mark)
        return size

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        first_seen: dict[Hashable, Mark] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node)
            try:
                first = first_seen.setdefault(key, key_node.start_mark)
            except TypeError:  # unhashable: the base class reports it
                continue
            if first is not key_node.start_mark:
                msg = f"duplicate key {shown(str(key))} (first on line {first.line + 1}); keep one"
                raise _Refused(msg, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def construct_bounded_int(self, node: ScalarNode) -> int:
        _check_number(node)
        return super().construct_yaml_int(node)

    def construct_bounded_float(self, node: ScalarNode) -> float:
        _check_number(node)
        return super().construct_yaml_float(node)

    def construct_checked_timestamp(self, node: ScalarNode) -> Any:
        try:
            return super().construct_yaml_timestamp(node)
        except (ValueError, OverflowError) as exc:
            msg = f"{shown(node.value)} is not a date ({exc}); quote it if it is text"
            raise _Refused(msg, node.start_mark) from exc

    def construct_refused(self, node: Node) -> NoReturn:
        tag = str(node.tag).replace("tag:yaml.org,2002:", "!!", 1)
        msg = f"the tag {shown(tag)} is not allowed (envbuild reads plain YAML); remove it"
        raise _Refused(msg, node.start_mark)


def _check_number(node: ScalarNode) -> None:
    if len(node.value) > MAX_NUMBER_CHARS:
        msg = (
            f"a number of {len(node.value)} characters is longer than envbuild reads "
            f"({MAX_NUMBER_CHARS}); quote it if it is text"
        )
        raise _Refused(msg, node.start_mark)


# What add_constructor does, without its type bound (which admits only yaml's own loaders).
_StrictYaml.yaml_constructors = {
    **SafeConstructor.yaml_constructors,
    _INT: _StrictYaml.construct_bounded_int,
    _FLOAT: _StrictYaml.construct_bounded_float,
    _TIMESTAMP: _StrictYaml.construct_checked_timestamp,
    None: _StrictYaml.construct_refused,
}


class _PureLoader(Reader, Scanner, Parser, _StrictYaml):
    """The strict loader over PyYAML's pure-Python parser."""

    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)


_LOADER: Callable[[str], _StrictYaml] = _PureLoader
_BYTE_POSITIONS = False  # whether a ReaderError's position counts UTF-8 bytes (libyaml)

if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _FastLoader(_StrictYaml, CParser):
        """The strict loader over libyaml's parser (~10x faster); composing stays in Python."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    _LOADER = _FastLoader
    _BYTE_POSITIONS = True


def path_label(path: Path) -> str:
    """The path as messages show it: as given, or quoted when it would break the line."""
    text = str(path)
    return text if text.isprintable() and len(text) <= 200 else shown(text, 200)


def read_yaml(path: Path, *, what: str, missing: str) -> Any:
    """The document in one of envbuild's YAML files; MatrixError with one line when it is none.

    `what` names the file's kind ("matrix file"); `missing` says what to do when it is absent.
    """
    label = path_label(path)
    text = _decode(label, _read_capped(path, label, what, missing))
    loader = None
    try:
        loader = _LOADER(text)  # the pure-Python reader checks the characters here
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise MatrixError([_yaml_problem(label, exc, text)]) from exc
    except RecursionError as exc:  # the depth bound should make this unreachable
        raise MatrixError([f"{label}: nested too deeply to read; flatten it"]) from exc
    finally:
        if loader is not None:
            loader.dispose()


def _read_capped(path: Path, label: str, what: str, missing: str) -> bytes:
    try:
        return read_small_file(path, MAX_YAML_BYTES)
    except FileNotFoundError as exc:
        raise MatrixError([f"{label}: no such {what}; {missing}"]) from exc
    except NotRegularFile as exc:
        raise MatrixError([f"{label}: is {exc.kind}, not a {what}; pass a YAML file"]) from exc
    except FileTooLarge as exc:
        raise MatrixError([_too_large(label, what, exc.size)]) from exc
    except (OSError, ValueError) as exc:
        raise MatrixError([_unreadable(label, what, exc)]) from exc


def _too_large(label: str, what: str, size: int | None) -> str:
    amount = f"{size} bytes; at most {MAX_YAML_BYTES}" if size else f"over {MAX_YAML_BYTES} bytes"
    return f"{label}: is too large for a {what} ({amount}); pass the right file"


def _unreadable(label: str, what: str, exc: OSError | ValueError) -> str:
    if isinstance(exc, ValueError):
        return f"{label}: is not a usable file name ({exc}); pass the path of a {what}"
    if exc.errno == errno.ELOOP:
        return f"{label}: is a loop of symbolic links; point it at a {what}"
    reason = exc.strerror or type(exc).__name__
    if exc.errno == errno.EACCES:
        return f"{label}: cannot read it ({reason}); make it readable, or pass another {what}"
    return f"{label}: cannot read it ({reason}); pass a readable {what}"


def _decode(label: str, data: bytes) -> str:
    boms = (
        (codecs.BOM_UTF32_LE, "UTF-32"),
        (codecs.BOM_UTF32_BE, "UTF-32"),
        (codecs.BOM_UTF16_LE, "UTF-16"),
        (codecs.BOM_UTF16_BE, "UTF-16"),
    )
    wide = next((name for bom, name in boms if data.startswith(bom)), None)
    if wide is None and b"\x00" in data:
        wide = _wide_encoding(data[:4096])
        if wide is None:
            line = data.count(b"\n", 0, data.index(b"\x00")) + 1
            msg = f"{label}:{line}: holds a NUL byte, so it is no text file; pass a YAML file"
            raise MatrixError([msg])
    if wide is not None:
        raise MatrixError([f"{label}: is not UTF-8 text (it looks like {wide}); save it as UTF-8"])
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        msg = (
            f"{label}:{line}: is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}); save it as UTF-8"
        )
        raise MatrixError([msg]) from exc


def _wide_encoding(sample: bytes) -> str | None:
    """'UTF-16' or 'UTF-32' when NUL bytes fall where those encodings put them, else None."""
    half = len(sample) // 2
    if half == 0:
        return None
    shares = sorted(sample[i : 2 * half : 2].count(0) / half for i in (0, 1))
    if shares[1] < 0.6:
        return None
    return "UTF-32" if shares[0] >= 0.4 else "UTF-16"


def _one_line(text: str, limit: int = 300) -> str:
    words = " ".join(text.split())
    return words if len(words) <= limit else words[:limit] + "..."


def _yaml_problem(label: str, exc: yaml.YAMLError, text: str) -> str:
    """One line: FILE:LINE:COLUMN, what is wrong and what to do."""
    place = label
    if isinstance(exc, MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        if mark is not None:
            place = f"{label}:{mark.line + 1}:{mark.column + 1}"
        problem = _one_line(str(exc.problem or exc.context or "unreadable"))
        if "nesting depth" in problem:  # libyaml's own bound, met before ours
            return f"{place}: nested deeper than {MAX_YAML_DEPTH} levels; flatten it"
        if isinstance(exc, _Refused):
            return f"{place}: {problem}"
        return f"{place}: not valid YAML: {problem}; fix the YAML there"
    if isinstance(exc, ReaderError):
        before = (
            text.encode("utf-8")[: exc.position].decode("utf-8", "ignore")
            if _BYTE_POSITIONS
            else text[: exc.position]
        )
        line = before.count("\n") + 1
        column = len(before) - (before.rfind("\n") + 1) + 1
        return (
            f"{label}:{line}:{column}: not valid YAML: character #x{int(exc.character):04x} is "
            f"not allowed ({_one_line(str(exc.reason))}); remove it, or write it as an escape "
            'in a "double-quoted" string'
        )
    return f"{label}: not valid YAML: {_one_line(str(exc))}; fix the YAML"


def yaml_kind(value: Any) -> str:
    """What a YAML value was read as, for messages: 'expected a string, got a mapping'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number (quote it)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    return f"a {type(value).__name__}"
