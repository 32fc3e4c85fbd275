"""The user's places: where envbuild keeps its records (data), its locks of builds without a
matrix and its build logs (cache), and where uv on the host keeps its cache; and whether a place
a command is told to write to can take files, asked before any slow work. Read from the
environment when asked, never at import."""

from __future__ import annotations

import errno
import os
import pwd
import stat
import tempfile
from pathlib import Path

from envbuild.core.errors import BadInput
from envbuild.core.names import shown

DATA_DIR_FIX = "point ENVBUILD_DATA_DIR at a writable directory"
CACHE_DIR_FIX = "point XDG_CACHE_HOME at a writable directory"


class StateError(BadInput):
    """envbuild's local record (results.sqlite3) cannot be read or written."""


def home() -> Path | None:
    """HOME, else this user's passwd entry; None when neither names an absolute path.

    An empty HOME counts as unset: Path.home() would make it '/', and the cache '/.cache'."""
    found = os.environ.get("HOME", "")
    if not found:
        try:
            found = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:  # a uid without an entry, as `docker run -u 12345` gives
            return None
    path = Path(found)
    return path if path.is_absolute() else None


def data_dir() -> Path:
    """ENVBUILD_DATA_DIR, else $XDG_DATA_HOME/envbuild, else ~/.local/share/envbuild."""
    explicit = os.environ.get("ENVBUILD_DATA_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_DATA_HOME")
    if not base:
        user_home = home()
        if user_home is None:
            msg = f"cannot tell where to keep envbuild's records: HOME is not set; {DATA_DIR_FIX}"
            raise StateError(msg)
        base = str(user_home / ".local" / "share")
    return Path(base) / "envbuild"


def cache_base() -> Path | None:
    """$XDG_CACHE_HOME, else ~/.cache; None when neither is an absolute path.

    The XDG specification has a relative value ignored: it would put the cache wherever the
    command happens to run."""
    xdg = Path(os.environ.get("XDG_CACHE_HOME", ""))
    if xdg.is_absolute():
        return xdg
    user_home = home()
    return None if user_home is None else user_home / ".cache"


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/envbuild, else ~/.cache/envbuild: what can be made again; without a
    home, a folder of this user's own in the temporary directory."""
    base = cache_base()
    return base / "envbuild" if base is not None else _private_temporary("envbuild-cache")


def _private_temporary(name: str) -> Path:
    """`name`-<uid> in the temporary directory, made private; StateError unless it is a folder
    of this user's alone (another user could plant locks in a folder they made)."""
    try:
        path = Path(tempfile.gettempdir()) / f"{name}-{os.geteuid()}"
    except FileNotFoundError:  # gettempdir: "No usable temporary directory found"
        msg = f"cannot tell where to keep envbuild's cache: no HOME, no temporary folder; {CACHE_DIR_FIX}"
        raise StateError(msg) from None
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        found = path.lstat()
    except OSError as exc:
        msg = f"cannot make envbuild's cache {shown(str(path))} ({exc.strerror}); {CACHE_DIR_FIX}"
        raise StateError(msg) from exc
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o077:
        msg = f"{shown(str(path))} is not a private folder of this user; {CACHE_DIR_FIX}"
        raise StateError(msg)
    return path


def log_dir() -> Path:
    """Where the full build log of each entry is kept."""
    return cache_dir() / "logs"


def contexts_dir() -> Path:
    """Where BuildKit builds' contexts lie while they build, at the same path from build to
    build of an entry (envbuild.build.server.kept_context)."""
    return cache_dir() / "contexts"


def base_probes_dir() -> Path:
    """Where what a probe found in each base image is recorded, by image id
    (envbuild.engine.probe_records)."""
    return cache_dir() / "base-probes"


def lock_cache_dir() -> Path:
    """Where locks of builds without a matrix live."""
    return cache_dir() / "locks"


def uv_cache_dir() -> Path | None:
    """Where uv on the host keeps its cache: UV_CACHE_DIR as given, else $XDG_CACHE_HOME/uv or
    ~/.cache/uv when files can be made there; None when they cannot (uv then keeps a temporary
    cache for the run). StateError naming UV_CACHE_DIR when the folder it names cannot be used."""
    explicit = os.environ.get("UV_CACHE_DIR")
    if explicit:
        problem = unwritable(Path(explicit))
        if problem is not None:
            msg = (
                f"UV_CACHE_DIR {shown(explicit)}: {problem}; point it at a writable folder "
                "or unset it"
            )
            raise StateError(msg)
        return Path(explicit)
    base = cache_base()
    if base is None or unwritable(base / "uv") is not None:
        return None
    return base / "uv"


def unwritable(folder: Path, *, name_it: bool = False) -> str | None:
    """Why files cannot be made in `folder`, or in it once it is made with its parents; None
    when they can. The reason names the folder where it is not `folder` itself, or `name_it`.

    Tried, not read from permission bits, which root passes on a read-only mount or in /proc:
    a file is made and removed at once in the nearest folder that exists.
    """
    path = folder
    while True:
        try:
            mode = path.stat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            if path.is_symlink():
                return f"{shown(str(path))} is a link to nothing"
            if path.parent == path:
                return "no folder of it exists"
            path = path.parent
            continue
        except (OSError, ValueError, RuntimeError) as exc:  # ELOOP, EACCES, a NUL
            return (getattr(exc, "strerror", None) or "not a path").lower()
        break
    named = name_it or path != folder
    if not stat.S_ISDIR(mode):
        return f"{shown(str(path))} is not a folder" if named else "it is not a folder"
    try:
        fd, name = tempfile.mkstemp(dir=path, prefix=".envbuild-probe-")
    except OSError as exc:
        where = f" in {shown(str(path))}" if named else ""
        # procfs answers ENOENT for a new name in a folder that exists.
        reason = "it takes no new files" if exc.errno == errno.ENOENT else exc.strerror
        return f"cannot make files{where} ({(reason or 'refused').lower()})"
    os.close(fd)
    Path(name).unlink()
    return None


def check_output_folder(path: Path, option: str) -> Path:
    """`path`, once it is known that a folder there can be made and written; BadInput naming
    `option` otherwise, before any slow work."""
    problem = unwritable(path)
    if problem is not None:
        msg = f"{option} {shown(str(path))}: {problem}; pass a folder that can be made and written"
        raise BadInput(msg)
    return path


def check_output_file(path: Path, option: str) -> Path:
    """`path`, once it is known that a file there can be written and replaced in one step (as
    reports are); BadInput naming `option` otherwise, before any slow work.

    An existing folder, FIFO, socket or device is refused: replacing /dev/null as root would
    take it from every other program."""
    mode: int | None = None
    problem: str | None = None
    try:
        mode = path.lstat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        pass
    except (OSError, ValueError) as exc:  # ENAMETOOLONG, EACCES, a NUL
        problem = (getattr(exc, "strerror", None) or "not a path").lower()
    if mode is not None and stat.S_ISDIR(mode):
        problem = "it is a folder"
    elif mode is not None and not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        problem = "it is not a regular file"
    elif problem is None:
        problem = unwritable(path.parent, name_it=True)
    if problem is not None:
        msg = f"{option} {shown(str(path))}: {problem}; name a file in a folder that can be written"
        raise BadInput(msg)
    return path


def check_output_files(*named: tuple[str, Path | None]) -> None:
    """check_output_file for each (option, path) given a path: a command's report options,
    checked before it builds, pushes or measures anything."""
    for option, path in named:
        if path is not None:
            check_output_file(path, option)
