"""The hostile corpus of tests/hostile/test_hostile_matrix.py: broken matrix and knowledge files.

Each `Case` is one input and what must come of it: a plan, or an error naming the file (and, with
`expect`, holding a given text). The corpus is generated, never stored, so it follows the shipped
files as they change: the shipped matrices mutated key by key (deleted, renamed, duplicated,
retyped), broken encodings, deep nesting, huge numbers, control characters, YAML tags, alias bombs,
special files (FIFOs, devices, symbolic link loops, sparse 8 GiB files) and hostile package lists;
then the knowledge files mutated along the first entry of each table, and a few files broken by
hand. File contents are made when a case runs (`Case.make`), so collecting the tests stays cheap.
"""

from __future__ import annotations

import copy
import datetime
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from envbuild.core.yamlfile import MAX_YAML_BYTES
from tests.conftest import REPO

MATRICES = REPO / "matrices"
KNOWLEDGE = MATRICES / "knowledge"
SHIPPED = {
    "default": MATRICES / "default.yaml",
    **{f"example-{p.stem}": p for p in sorted((MATRICES / "examples").glob("*.yaml"))},
}


@dataclass(frozen=True)
class Case:
    """One hostile input: file bytes, or a special path made by `special`."""

    id: str
    content: bytes | Callable[[], bytes] | None = None  # bytes, or made when the case runs
    special: Callable[[Path], Path] | None = None
    fails: bool = False  # broken input: it must end in an error (exit 2)
    expect: str | None = None  # a text the error must hold (implies fails)
    name: str = "x.yaml"

    def make(self, folder: Path) -> Path:
        """The path to pass as -m (or to put in place of a knowledge file)."""
        if self.special is not None:
            return self.special(folder)
        assert self.content is not None
        path = folder / self.name
        path.write_bytes(self.content if isinstance(self.content, bytes) else self.content())
        return path


DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump(document: Any) -> bytes:
    return yaml.dump(document, Dumper=DUMPER, sort_keys=False, allow_unicode=True).encode()


def load_shipped(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


Path_ = tuple[str | int, ...]


def key_paths(node: Any, prefix: Path_ = ()) -> Iterator[Path_]:
    """Every place in a document: mapping keys and list items, depth first."""
    items: list[tuple[str | int, Any]] = []
    if isinstance(node, dict):
        items = list(node.items())
    elif isinstance(node, list):
        items = list(enumerate(node))
    for key, child in items:
        yield (*prefix, key)
        yield from key_paths(child, (*prefix, key))


def get(document: Any, path: Path_) -> Any:
    for key in path:
        document = document[key]
    return document


def replaced(document: Any, path: Path_, value: Any) -> Any:
    result = copy.deepcopy(document)
    get(result, path[:-1])[path[-1]] = value
    return result


def deleted(document: Any, path: Path_) -> Any:
    result = copy.deepcopy(document)
    del get(result, path[:-1])[path[-1]]
    return result


def renamed(document: Any, path: Path_, new: str) -> Any:
    result = copy.deepcopy(document)
    parent = get(result, path[:-1])
    items = list(parent.items())
    parent.clear()
    parent.update({(new if k == path[-1] else k): v for k, v in items})  # order kept
    return result


def dump_replaced(document: Any, path: Path_, value: Any) -> bytes:
    return dump(replaced(document, path, value))


def dump_deleted(document: Any, path: Path_) -> bytes:
    return dump(deleted(document, path))


def dump_renamed(document: Any, path: Path_, new: str) -> bytes:
    return dump(renamed(document, path, new))


def typo(key: str) -> str:
    """A misspelling close enough for a did-you-mean: 'framework' -> 'framewrk'."""
    middle = len(key) // 2
    return key[:middle] + key[middle + 1 :]


RETYPES: dict[str, Any] = {
    "null": None,
    "bool": True,
    "int": 12,
    "float": 3.10,
    "bigint": 10**60,
    "empty": "",
    "long": "9" * 5000,
    "newline": "2.13.0\n",
    "bell": "cpu\x07",
    "list": [],
    "nested-list": [["torch"]],
    "mapping": {"a": {"b": "c"}},
    "date": datetime.date(2024, 1, 1),
    "bytes": b"\x00\xff",
}


def must_fail(path: Path_, old: Any, new: Any) -> bool:
    """Whether replacing `old` at `path` with `new` surely breaks a matrix."""
    if path == ("description",):
        return new is not None and not isinstance(new, str)
    if isinstance(old, str):
        return not isinstance(new, str)
    if isinstance(old, dict | list) and new is not None:
        if isinstance(new, dict | list) and type(new) is type(old):
            # an empty list for an axis builds nothing; for include/exclude it is fine
            return isinstance(new, list) and len(path) == 2 and path[0] == "axes"
        return True
    return False


def mutation_cases(stem: str, document: Any) -> Iterator[Case]:
    for path in key_paths(document):
        where = ".".join(map(str, path))
        old = get(document, path)
        for name, value in RETYPES.items():
            yield Case(
                f"{stem}:{where}={name}",
                partial(dump_replaced, document, path, value),
                fails=must_fail(path, old, value),
            )
        yield Case(f"{stem}:{where}:deleted", partial(dump_deleted, document, path))
        if isinstance(path[-1], str):
            yield Case(
                f"{stem}:{where}:misspelt",
                partial(dump_renamed, document, path, typo(path[-1])),
                expect="unknown key; did you mean",
            )
        if isinstance(path[-1], int):  # a list item twice
            items = [*get(document, path[:-1]), old]
            yield Case(f"{stem}:{where}:twice", partial(dump_replaced, document, path[:-1], items))


def duplicate_key_cases(stem: str, document: dict[str, Any]) -> Iterator[Case]:
    text = dump(document)
    for key, value in document.items():
        yield Case(
            f"{stem}:duplicate-top-{key}",
            text + dump({key: value}),
            expect=f"duplicate key {key!r}",
        )
    for parent in ("axes", "defaults"):
        mapping = document.get(parent)
        if not isinstance(mapping, dict):
            continue
        for key, value in mapping.items():
            lines = dump({parent: mapping}).decode().splitlines()
            lines.insert(1, "  " + dump({key: value}).decode().rstrip().replace("\n", "\n  "))
            rest = {k: v for k, v in document.items() if k != parent}
            yield Case(
                f"{stem}:duplicate-{parent}-{key}",
                ("\n".join(lines) + "\n").encode() + dump(rest),
                expect=f"duplicate key {key!r}",
            )


DEFAULT_TEXT = SHIPPED["default"].read_text(encoding="utf-8")
VALID = "axes:\n  framework: [torch]\n  framework_version: ['2.13.0']\n  cuda: [cpu]\n"


def encoding_cases() -> Iterator[Case]:
    for codec in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"):
        yield Case(
            f"encoding-{codec}",
            DEFAULT_TEXT.encode(codec),
            expect="is not UTF-8 text (it looks like UTF-",
        )
    yield Case(
        "encoding-latin-1", (VALID + "description: caf\xe9\n").encode("latin-1"), expect="not UTF-8"
    )
    for name, junk in {
        "ff": b"\xff",
        "truncated": b"\xc3",
        "overlong": b"\xc0\xaf",
        "surrogate": b"\xed\xa0\x80",
        "past-unicode": b"\xf4\x90\x80\x80",
    }.items():
        yield Case(
            f"encoding-invalid-{name}",
            VALID.encode() + b"description: '" + junk + b"'\n",
            expect="is not UTF-8 text",
        )
    yield Case("encoding-utf-8-bom", b"\xef\xbb\xbf" + VALID.encode())
    yield Case("encoding-crlf", VALID.replace("\n", "\r\n").encode())
    yield Case("encoding-nul", VALID.encode() + b"\x00", expect="NUL byte")


def structure_cases() -> Iterator[Case]:
    for depth in (40, 1000, 100_000):
        yield Case(f"deep-flow-{depth}", b"[" * depth, fails=True)
        yield Case(f"deep-axes-{depth}", b"axes: " + b"[" * depth + b"]" * depth, fails=True)
        yield Case(f"deep-map-{depth}", b"{a: " * depth + b"1" + b"}" * depth, fails=True)
    yield Case(
        "deep-block-100", "".join("  " * i + "- \n" for i in range(100)).encode(), fails=True
    )
    yield Case("deep-100000-expect", b"[" * 100_000, expect="nested deeper than")
    for text in ("", "# only a comment\n", "null\n", "~\n", "[]\n", "42\n", "'axes'\n", "---\n"):
        yield Case(f"top-{text.strip() or 'empty'}", text.encode(), expect="expected a mapping")
    yield Case("two-documents", (VALID + "---\n" + VALID).encode(), expect="not valid YAML")
    yield Case("tab-indent", b"axes:\n\tframework: [torch]\n", expect="not valid YAML")
    yield Case("unclosed", b"axes: {framework: [torch]\n", expect="not valid YAML")
    yield Case(
        "null-axis", b"axes: {framework: [torch], cuda: null}\n", expect="axes.cuda: is null"
    )
    yield Case(
        "empty-framework-with-include",
        b"axes: {framework: [], cuda: [cpu]}\ninclude:\n  - {framework_version: '2.13.0'}\n",
        expect="axes.framework: is an empty list",
    )
    yield Case(
        "description-mapping",
        (VALID + "description: {a: b}\n").encode(),
        expect="description: expected a string",
    )
    yield Case(
        "trailing-newline-version",
        b'axes: {framework: [torch], framework_version: ["2.13.0\\n"], cuda: [cpu]}\n',
        expect="has a space or line break at an end; write '2.13.0'",
    )
    yield Case(
        "trailing-newline-python",
        (VALID + 'defaults: {python: "3.11\\n"}\n').encode(),
        expect="has a space or line break at an end; write '3.11'",
    )
    yield Case(
        "include-version-of-another-framework",
        (VALID + "include:\n  - {framework: jax, framework_version: '2.13.0'}\n").encode(),
        expect="no release of jax matches '2.13.0'",
    )
    yield Case(
        "include-version-of-no-framework",
        (VALID + "include:\n  - {framework: torch, framework_version: '0.10.0'}\n").encode(),
        expect="no release of torch matches '0.10.0'",
    )
    yield Case(
        "axes-version-of-no-axis-framework",
        b"axes: {framework: [torch], framework_version: ['0.10'], cuda: [cpu]}\n",
        expect="no release of torch matches '0.10'",
    )
    many = ", ".join(f"'3.{i}'" for i in range(400))
    yield Case(
        "axes-multiply-too-far",
        f"axes: {{framework: [torch, jax, tensorflow], framework_version: [latest, '2', '0'], "
        f"cuda: [cpu, '12', '13', '11'], python: [{many}], os: [bookworm, trixie]}}\n".encode(),
        expect="combinations, more than",
    )
    points = "".join("  - {framework: torch, cuda: cpu}\n" for _ in range(1001))
    yield Case(
        "too-many-includes", (VALID + "include:\n" + points).encode(), expect="split the matrix"
    )
    for name, value in {
        "placeholder": "'{foo}'",
        "format-attr": "'{framework.__class__}'",
        "upper": "Team/Torch",
        "long": "a" * 300,
        "empty": "''",
    }.items():
        yield Case(
            f"repository-{name}",
            (VALID + f"defaults: {{repository: {value}}}\n").encode(),
            expect="defaults.repository:",
        )
    yield Case("key-not-a-string", (VALID + "1: x\n").encode(), expect="unknown key")
    yield Case("key-null", (VALID + "~: x\n").encode(), expect="unknown key")
    yield Case("key-newline", (VALID + '"a\\nb": x\n').encode(), expect="unknown key")
    yield Case("key-unhashable", (VALID + "? [a]\n: x\n").encode(), expect="not valid YAML")


def number_cases() -> Iterator[Case]:
    digits = "1" * 5000
    for name, value in {
        "decimal": digits,
        "negative": "-" + digits,
        "hex": "0x" + "f" * 5000,
        "octal": "0" + "7" * 5000,
        "binary": "0b" + "1" * 5000,
        "float": digits + ".5",
        "exponent": "1e" + digits,
        "sexagesimal": "1" + ":30" * 2000,
        "underscores": "1_" * 2500 + "1",
    }.items():
        for place in (
            "framework_version: [{v}]", "cuda: [{v}]", "python: [{v}]", "platform: [{v}]"
        ):  # fmt: skip
            axis = place.split(":")[0]
            text = "axes: {framework: [torch], " + place.format(v=value) + "}\n"
            # YAML 1.1 reads "1e5" as a string (its floats need a dot): then it is too long
            expect = "is too long" if name == "exponent" else "number of"
            yield Case(f"number-{name}-{axis}", text.encode(), expect=expect)
        # a plain key of over 1,024 characters is no YAML at all
        yield Case(f"number-{name}-key", f"{value}: x\naxes: {{}}\n".encode(), fails=True)
    yield Case(
        "number-short-key",
        b"axes: {framework: [torch]}\n" + b"9" * 60 + b": x\n",
        expect="unknown key",
    )
    yield Case(
        "number-tagged-int", f"axes: {{framework: [!!int '{digits}']}}\n".encode(), fails=True
    )
    yield Case(
        "number-quoted", f"axes: {{framework: [torch], cuda: ['{digits}']}}\n".encode(), fails=True
    )
    yield Case(
        "number-64-chars",
        f"axes: {{framework: [torch], cuda: [{'9' * 64}]}}\n".encode(),
        fails=True,
    )


def control_cases() -> Iterator[Case]:
    for code in [*range(1, 32), 0x7F, 0x85, 0x2028, 0xFEFF, 0xFFFE]:
        char = chr(code)
        if char in "\t\n\r":
            continue
        text = VALID + f"description: 'a{char}b'\n"
        yield Case(f"control-{code:04x}-raw", text.encode("utf-8", "surrogatepass"))
        escaped = f"\\u{code:04x}"
        yield Case(
            f"control-{code:04x}-in-version",
            f'axes: {{framework: [torch], cuda: ["cpu{escaped}"]}}\n'.encode(),
            fails=True,
        )
        yield Case(
            f"control-{code:04x}-in-platform",
            f'axes: {{framework: [torch], platform: ["linux/arm64{escaped}"]}}\n'.encode(),
            fails=True,
        )


def tag_cases() -> Iterator[Case]:
    for tag in (
        "!!python/object:os.system",
        "!!python/object/apply:os.system",
        "!!python/object/new:os.system",
        "!!python/name:os.system",
        "!!python/module:os",
        "!!python/tuple",
        "!custom",
        "!<tag:example.com,2000:x>",
    ):
        yield Case(
            f"tag-{tag}",
            f"axes: {tag} ['echo pwned']\n".encode(),
            expect="is not allowed (envbuild reads plain YAML)",
        )
    yield Case(
        "tag-directive",
        b"%TAG !e! tag:example.com,2000:\n---\naxes: !e!x [a]\n",
        expect="is not allowed",
    )
    yield Case("tag-yaml-directive", b"%YAML 1.1\n---\n" + VALID.encode())
    yield Case("tag-binary", (VALID + "description: !!binary aGVsbG8=\n").encode(), fails=True)
    yield Case("tag-binary-bad", (VALID + "description: !!binary '***'\n").encode(), fails=True)
    yield Case("tag-set", b"axes: {framework: !!set {torch: null}}\n", fails=True)
    yield Case("tag-omap", b"axes: !!omap [{framework: [torch]}]\n", fails=True)
    yield Case("tag-omap-bad", b"axes: !!omap [a]\n", fails=True)
    yield Case("tag-timestamp", (VALID + "description: 2024-01-01\n").encode(), fails=True)
    yield Case(
        "tag-bad-date", (VALID + "description: 2024-13-45\n").encode(), expect="is not a date"
    )
    yield Case(
        "tag-bad-tz", (VALID + "description: 2001-12-14t21:59:43.10-99:99\n").encode(), fails=True
    )
    yield Case("tag-str", b"axes: {framework: [!!str torch], cuda: [!!str cpu]}\n")
    yield Case("tag-float-nan", b"axes: {framework: [torch], cuda: [.nan]}\n", fails=True)


def alias_cases() -> Iterator[Case]:
    lines = ['a0: &a0 ["lol"]']
    for level in range(1, 10):
        previous = f"*a{level - 1}"
        lines.append(f"a{level}: &a{level} [{', '.join([previous] * 10)}]")
    bomb = "\n".join(lines) + "\naxes: {framework: *a9}\n"
    yield Case("alias-billion-laughs", bomb.encode(), expect="holds more than")
    yield Case(
        "alias-bomb-in-include",
        ("\n".join(lines) + "\naxes: {framework: [torch]}\ninclude: *a9\n").encode(),
        expect="holds more than",
    )
    merge = ["m0: &m0 {framework: [torch]}"]
    for level in range(1, 30):
        merge.append(f"m{level}: &m{level} {{<<: *m{level - 1}, k{level}: *m{level - 1}}}")
    yield Case(
        "alias-merge-bomb", ("\n".join(merge) + "\naxes: *m29\n").encode(), expect="holds more than"
    )
    yield Case(
        "alias-recursive-list", b"axes: &a {framework: [*a]}\n", expect="refers to a collection"
    )
    yield Case(
        "alias-recursive-map", b"axes: &a {framework: [torch], cuda: *a}\n", expect="refers to"
    )
    yield Case("alias-undefined", b"axes: {framework: *nothing}\n", expect="not valid YAML")
    yield Case(
        "alias-reuse-is-fine",
        b"defaults: {python: &p '3.11'}\naxes: {framework: [torch], python: [*p], cuda: [cpu]}\n",
    )
    yield Case(
        "alias-merge-is-fine",
        b"x: &x {framework: torch}\naxes: {framework: [torch]}\ninclude: [{<<: *x, cuda: cpu}]\n",
        fails=True,  # `x` is no top-level key of a matrix
    )


def size_cases() -> Iterator[Case]:
    padding = b"# " + b"x" * 1021 + b"\n"  # 1 KiB a line
    near = VALID.encode() + padding * ((MAX_YAML_BYTES - len(VALID) - 2048) // 1024)
    yield Case("size-just-under-the-limit", near)
    yield Case("size-over-the-limit", VALID.encode() + padding * 1025, expect="too large")
    yield Case("size-one-long-line", VALID.encode() + b"description: " + b"y" * 1_000_000 + b"\n")
    yield Case("size-long-key", VALID.encode() + b"k" * 900_000 + b": x\n", fails=True)
    yield Case(
        "size-long-quoted-key",
        VALID.encode() + b"? " + b"k" * 900_000 + b"\n: x\n",
        expect="unknown key",
    )


def fifo(folder: Path) -> Path:
    path = folder / "pipe.yaml"
    os.mkfifo(path)
    return path


def directory(folder: Path) -> Path:
    path = folder / "dir.yaml"
    path.mkdir()
    return path


def symlink_loop(folder: Path) -> Path:
    first, second = folder / "loop-a.yaml", folder / "loop-b.yaml"
    first.symlink_to(second)
    second.symlink_to(first)
    return first


def dangling(folder: Path) -> Path:
    path = folder / "dangling.yaml"
    path.symlink_to(folder / "nowhere.yaml")
    return path


def link_to(target: str) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / "link.yaml"
        path.symlink_to(target)
        return path

    return make


def link_to_fifo(folder: Path) -> Path:
    path = folder / "to-pipe.yaml"
    path.symlink_to(fifo(folder))
    return path


def unix_socket(folder: Path) -> Path:
    path = folder / "s.yaml"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()  # the socket file stays
    return path


def sparse_huge(folder: Path) -> Path:
    path = folder / "huge.yaml"
    with path.open("wb") as stream:
        stream.truncate(8 * 1024**3)  # 8 GiB of holes: reading it would be the bug
    return path


def unreadable(folder: Path) -> Path:
    path = folder / "secret.yaml"
    path.write_text(VALID)
    path.chmod(0)  # root reads it anyway: then it is a valid matrix
    return path


def newline_name(folder: Path) -> Path:
    path = folder / "a\nb.yaml"
    path.write_text("axes: [")
    return path


def fixed(target: str) -> Callable[[Path], Path]:
    return lambda _folder: Path(target)


def special_cases() -> Iterator[Case]:
    yield Case("special-fifo", special=fifo, expect="named pipe (FIFO)")
    yield Case("special-link-to-fifo", special=link_to_fifo, expect="named pipe (FIFO)")
    yield Case("special-directory", special=directory, expect="is a directory")
    yield Case("special-dev-zero", special=fixed("/dev/zero"), expect="is a character device")
    yield Case("special-dev-null", special=fixed("/dev/null"), expect="is a character device")
    yield Case("special-dev-stdin", special=fixed("/dev/stdin"), fails=True)
    yield Case("special-link-to-dev-zero", special=link_to("/dev/zero"), expect="character device")
    yield Case("special-symlink-loop", special=symlink_loop, expect="loop of symbolic links")
    yield Case("special-dangling-link", special=dangling, expect="no such matrix file")
    yield Case("special-missing", special=lambda f: f / "nope.yaml", expect="no such matrix file")
    yield Case("special-socket", special=unix_socket, expect="is a socket")
    yield Case("special-sparse-8-gib", special=sparse_huge, expect="too large")
    yield Case("special-unreadable", special=unreadable)
    yield Case("special-name-too-long", special=lambda f: f / ("n" * 300 + ".yaml"), fails=True)
    yield Case("special-newline-in-name", special=newline_name, fails=True)
    yield Case("special-proc-mem", special=fixed("/proc/self/mem"), fails=True)
    yield Case("special-proc-environ", special=fixed("/proc/self/environ"), fails=True)
    yield Case("special-root", special=fixed("/"), expect="is a directory")


def package_cases() -> Iterator[Case]:
    """defaults.packages / requirements / numpy with hostile values, and an include's packages."""
    head = VALID + "defaults:\n"
    values = {
        "list": (
            "packages: [numpy, 'transformers>=4.40', 'rich[jupyter]; python_version>\"3\"']",
            None,
        ),
        "huge-list": ("packages: [" + ", ".join(f"p{i}" for i in range(2_000)) + "]", "more than"),
        "long-item": ("packages: ['" + "a" * 100_000 + "']", "characters long"),
        "null-items": ("packages: [~, ~]", "expected a string"),
        "number-item": ("packages: [1.10]", "expected a string"),
        "mapping": ("packages: {numpy: 1}", "expected a list"),
        "text": ("packages: numpy", "expected a list"),
        "bad-pep508": ("packages: ['numpy>=>1']", "not a PEP 508"),
        "framework": ("packages: ['torch==2.6.0']", "the entry fixes the framework"),
        "option": ("packages: ['--extra-index-url=https://x']", "is an option"),
        "url": ("packages: ['x @ https://e.example/x.whl']", "direct URL"),
        "requirements-number": ("requirements: 5", "expected a file path"),
        "requirements-list": ("requirements: [a.txt]", "expected a file path"),
        "requirements-missing": ("requirements: absent.txt", "no such file"),
        "requirements-dev-zero": ("requirements: /dev/zero", "not a regular file"),
        "requirements-proc-mem": ("requirements: /proc/self/mem", "requirements"),
        "requirements-root": ("requirements: /", "not a regular file"),
        "requirements-control": ('requirements: "a\\x1b.txt"', "expected a file path"),
        "numpy-text": ("numpy: 'no'", "expected true or false"),
        "numpy-false": ("numpy: false", None),
    }
    for name, (line, expect) in values.items():
        yield Case(f"packages-{name}", (head + f"  {line}\n").encode(), expect=expect)
    yield Case(
        "packages-include",
        (VALID + "include:\n  - {framework: jax, cuda: cpu, packages: [optax, jaxlib]}\n").encode(),
        expect="include[0].packages[1]",
    )


# Strings that are no user envbuild makes: near misses of its two, other users and ids, and text
# no Dockerfile or one-line message may take as it is.
NOT_USERS = (
    "Root", "ROOT", "root ", " root", "root\n", "Envbuild", "nobody", "ubuntu", "0", "1000",
    "0:0", "1000:1000", "root:root", "~root", "$USER", "root; rm -rf /", "r\u043e\u043et",
    "envbuild\u200b", "root\x07", "root\x00", "\x1b[31mroot", "-", "r" * 5000,
)  # fmt: skip
# One entry spelt five ways (the newest torch's CPU image, an include's default release).
SAME_ENTRY = (
    {"framework": "torch", "cuda": "cpu"},
    {"framework": "torch", "framework_version": "latest", "cuda": "cpu"},
    {"framework": "torch", "cuda": "cpu", "python": "3.11"},
    {"framework": "torch", "cuda": "cpu", "os": "bookworm"},
    {"cuda": "cpu"},
)


def user_cases() -> Iterator[Case]:
    """`user` in defaults and in an include: envbuild's two users plan, anything else (every YAML
    type, every near miss) is one line naming the place; two spellings of one entry that give it
    different users are refused."""
    valid = load_shipped_text(VALID)
    for place in ("defaults", "include"):
        for user in ("envbuild", "root"):
            yield Case(f"user-{place}-{user}", dump(with_user(valid, place, user)))
        values = {**{f"type-{n}": v for n, v in RETYPES.items()}, **dict(enumerate(NOT_USERS))}
        for name, value in values.items():
            where = "defaults.user" if place == "defaults" else "include[0].user"
            yield Case(
                f"user-{place}-{name}",
                partial(dump, with_user(valid, place, value)),
                expect=f"{where}: expected envbuild or root, got ",
            )
    for i, first in enumerate(SAME_ENTRY):
        for j, second in enumerate(SAME_ENTRY):
            document = {
                **valid,
                "include": [{**first, "user": "root"}, {**second, "user": "envbuild"}],
            }
            yield Case(f"user-twice-{i}-{j}", dump(document), expect="give that entry one user")


def bytecode_cases() -> Iterator[Case]:
    """defaults.bytecode: true or false plan; any other YAML type, and the words YAML 1.1 once
    read as booleans (quoted, so strings), are one line naming the place; in an include it is
    no key at all (it is the matrix's choice, like numpy)."""
    valid = load_shipped_text(VALID)
    for value in (True, False):
        yield Case(f"bytecode-{value}", dump({**valid, "defaults": {"bytecode": value}}))
    words = ("no", "off", "false", "False", "0", "n", "yes", "on", "")
    values = {
        **{f"type-{n}": v for n, v in RETYPES.items() if not isinstance(v, bool)},
        **{f"word-{i}": word for i, word in enumerate(words)},
    }
    for name, value in values.items():
        yield Case(
            f"bytecode-{name}",
            partial(dump, {**valid, "defaults": {"bytecode": value}}),
            expect="defaults.bytecode: expected true or false, got ",
        )
    include = {"framework": "torch", "cuda": "cpu", "bytecode": False}
    yield Case("bytecode-include", dump({**valid, "include": [include]}), expect="include[0]")


def load_shipped_text(text: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(text)
    return document


def with_user(document: dict[str, Any], place: str, user: Any) -> dict[str, Any]:
    """`document` with `user` in its defaults, or in an include of its torch CPU entry."""
    if place == "defaults":
        return {**document, "defaults": {"user": user}}
    return {**document, "include": [{"framework": "torch", "cuda": "cpu", "user": user}]}


def matrix_corpus() -> list[Case]:
    cases: list[Case] = []
    for stem, path in SHIPPED.items():
        document = load_shipped(path)
        cases += mutation_cases(stem, document)
        cases += duplicate_key_cases(stem, document)
        cases.append(Case(f"{stem}:as-shipped", path.read_bytes()))
    for generate in (
        encoding_cases,
        structure_cases,
        number_cases,
        control_cases,
        tag_cases,
        alias_cases,
        size_cases,
        special_cases,
        package_cases,
        user_cases,
        bytecode_cases,
    ):
        cases += generate()
    return cases


MATRIX_CORPUS = matrix_corpus()


TABLES = {"sources", "indexes", "releases", "variants", "families", "toolkits", "bases", "gpus"}
TABLES |= {"cuda_targets", "builds"}


def representative_paths(document: Any) -> Iterator[Path_]:
    """The places along the first entry of every table and list: one of each shape."""
    for path in key_paths(document):
        node, node_key = document, None
        for key in path:
            in_table = node_key in TABLES or isinstance(node, list)
            if in_table and key != (next(iter(node)) if isinstance(node, dict) else 0):
                break
            node, node_key = node[key], key
        else:
            yield path


KNOWLEDGE_RETYPES = ("int", "mapping", "nested-list", "null", "bell", "bool")


def knowledge_mutations(stem: str, document: dict[str, Any]) -> Iterator[Case]:
    """Along the first entry of each table: a key retyped (in turn), deleted, misspelt."""
    name = f"{stem}.yaml"
    for i, path in enumerate(representative_paths(document)):
        where = ".".join(map(str, path))
        old = get(document, path)
        retype = KNOWLEDGE_RETYPES[i % len(KNOWLEDGE_RETYPES)]
        value = RETYPES[retype]
        yield Case(
            f"knowledge-{stem}:{where}={retype}",
            partial(dump_replaced, document, path, value),
            name=name,
            # null stands for "absent", which optional keys allow
            fails=value is not None and not isinstance(value, str if old is None else type(old)),
        )
        if isinstance(path[-1], int):
            continue
        yield Case(
            f"knowledge-{stem}:{where}:deleted", partial(dump_deleted, document, path), name=name
        )
        parent = get(document, path[:-1])
        if (len(path) < 2 or path[-2] not in TABLES) and path[-1] == next(iter(parent)):
            yield Case(
                f"knowledge-{stem}:{where}:misspelt",
                partial(dump_renamed, document, path, typo(path[-1])),
                name=name,
                expect="unknown key",
            )


def knowledge_corpus() -> list[Case]:
    cases: list[Case] = []
    for path in sorted(KNOWLEDGE.glob("*.yaml")):
        if path.stem not in ("jax", "tensorflow"):  # read by the same code as torch.yaml
            cases += knowledge_mutations(path.stem, load_shipped(path))
    torch = (KNOWLEDGE / "torch.yaml").read_text(encoding="utf-8")
    cases += [
        Case(
            "knowledge-misspelt-cudnn",
            torch.replace("cudnn:", "cudn:", 1).encode(),
            name="torch.yaml",
            expect="unknown key; did you mean 'cudnn'?",
        ),
        Case("knowledge-utf-16", torch.encode("utf-16"), name="torch.yaml", expect="UTF-16"),
        Case("knowledge-deep", b"[" * 100_000, name="cuda.yaml", expect="nested deeper"),
        Case(
            "knowledge-duplicate-release",
            torch.replace("releases:\n", 'releases:\n  "2.0.0": {}\n', 1).encode(),
            name="torch.yaml",
            expect="duplicate key '2.0.0'",
        ),
        Case(
            "knowledge-huge-number",
            b"sources: {a: b}\nfamilies: {'12': {min_driver: " + b"5" * 5000 + b", source: a}}\n",
            name="cuda.yaml",
            expect="number of 5000 characters",
        ),
        Case(
            "knowledge-python-object",
            b"sources: !!python/object/apply:os.system ['true']\n",
            name="os.yaml",
            expect="is not allowed",
        ),
        Case("knowledge-bomb", alias_bomb_text(), name="gpus.yaml", expect="holds more than"),
        Case(
            "knowledge-directory",
            special=lambda f: directory_named(f, "os.yaml"),
            expect="is a directory",
        ),
        Case("knowledge-fifo", special=lambda f: fifo_named(f, "os.yaml"), expect="named pipe"),
        Case("knowledge-missing", special=lambda f: f / "os.yaml", expect="no such knowledge file"),
        Case(
            "knowledge-python-as-string",
            torch.replace('python: ["3.8", "3.9", "3.10", "3.11"]', 'python: "3.11"', 1).encode(),
            name="torch.yaml",
            fails=True,
        ),
        Case(
            "knowledge-format-in-template",
            (KNOWLEDGE / "os.yaml")
            .read_text(encoding="utf-8")
            .replace("python:{python}-slim-bookworm", "python:{python.__class__}", 1)
            .encode(),
            name="os.yaml",
            expect="may use only the placeholder {python}",
        ),
    ]
    return cases


def alias_bomb_text() -> bytes:
    lines = ['sources: {a: "x"}', 'a0: &a0 ["lol"]']
    lines += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 10)}]" for n in range(1, 10)]
    return ("\n".join(lines) + "\ngpus: *a9\n").encode()


def directory_named(folder: Path, name: str) -> Path:
    (folder / name).mkdir()
    return folder / name


def fifo_named(folder: Path, name: str) -> Path:
    os.mkfifo(folder / name)
    return folder / name


KNOWLEDGE_CORPUS = knowledge_corpus()
