"""A wheel's METADATA read out of the remote zip by HTTP range, for wheels PyPI serves no
PEP 658 `.metadata` for: the end-of-central-directory record, the directory, one entry."""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from envbuild.knowledge.refresh.errors import PypiError

RangeReader = Callable[[str, str], tuple[bytes, int]]  # (url, "a-b" or "-n") -> (bytes, size)


def metadata_from_zip(url: str, get_range: RangeReader) -> str:
    """The wheel's `*.dist-info/METADATA`, read with a few range requests."""
    tail, size = get_range(url, "-65536")
    cd_offset, cd_size = _central_directory(tail, tail_start=size - len(tail), url=url)
    tail_start = size - len(tail)
    if cd_offset >= tail_start:
        cd = tail[cd_offset - tail_start : cd_offset - tail_start + cd_size]
    else:
        cd, _ = get_range(url, f"{cd_offset}-{cd_offset + cd_size - 1}")
    entry = _metadata_entry(cd, url=url)
    header, _ = get_range(url, f"{entry.header_offset}-{entry.header_offset + 29}")
    if header[:4] != b"PK\x03\x04":
        msg = f"{url}: no zip local header at {entry.header_offset}; the wheel looks damaged"
        raise PypiError(msg)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    start = entry.header_offset + 30 + name_len + extra_len
    data, _ = get_range(url, f"{start}-{start + entry.compressed_size - 1}")
    if entry.method == 8:
        data = zlib.decompress(data, -15)
    elif entry.method != 0:
        msg = f"{url}: {entry.name} uses zip compression method {entry.method}; cannot read it"
        raise PypiError(msg)
    return metadata_text(data)


def metadata_text(data: bytes) -> str:
    """METADATA's bytes as text (UTF-8; an undecodable byte does not stop the refresh)."""
    return data.decode("utf-8", errors="replace")


@dataclass(frozen=True, kw_only=True)
class _ZipEntry:
    name: str
    method: int
    compressed_size: int
    header_offset: int


def _central_directory(tail: bytes, *, tail_start: int, url: str) -> tuple[int, int]:
    """(offset, size) of the zip's central directory, from the last bytes of the file."""
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) < at + 22:
        msg = f"{url}: no zip end-of-central-directory record in the last {len(tail)} bytes"
        raise PypiError(msg)
    _, _, _, _, count, cd_size, cd_offset, _ = struct.unpack("<IHHHHIIH", tail[at : at + 22])
    if 0xFFFFFFFF not in (cd_size, cd_offset) and count != 0xFFFF:
        return cd_offset, cd_size
    locator = tail.rfind(b"PK\x06\x07", 0, at)
    if locator < 0:
        msg = f"{url}: zip64 archive without a zip64 end-of-central-directory locator"
        raise PypiError(msg)
    record_offset = struct.unpack("<Q", tail[locator + 8 : locator + 16])[0] - tail_start
    if record_offset < 0 or tail[record_offset : record_offset + 4] != b"PK\x06\x06":
        msg = f"{url}: zip64 end-of-central-directory record not found where its locator says"
        raise PypiError(msg)
    cd_size, cd_offset = struct.unpack("<QQ", tail[record_offset + 40 : record_offset + 56])
    return int(cd_offset), int(cd_size)


def _metadata_entry(cd: bytes, *, url: str) -> _ZipEntry:
    """The central-directory entry of the top-level `*.dist-info/METADATA`."""
    pos = 0
    while pos + 46 <= len(cd) and cd[pos : pos + 4] == b"PK\x01\x02":
        fields = struct.unpack("<IHHHHHHIIIHHHHHII", cd[pos : pos + 46])
        method, csize, usize = fields[4], fields[8], fields[9]
        name_len, extra_len, comment_len, offset = fields[10], fields[11], fields[12], fields[16]
        name = cd[pos + 46 : pos + 46 + name_len].decode("utf-8", errors="replace")
        if re.fullmatch(r"[^/]+\.dist-info/METADATA", name):
            extra = cd[pos + 46 + name_len : pos + 46 + name_len + extra_len]
            csize, offset = _zip64_sizes(extra, usize=usize, csize=csize, offset=offset)
            return _ZipEntry(name=name, method=method, compressed_size=csize, header_offset=offset)
        pos += 46 + name_len + extra_len + comment_len
    msg = f"{url}: the wheel has no .dist-info/METADATA in its zip directory"
    raise PypiError(msg)


def _zip64_sizes(extra: bytes, *, usize: int, csize: int, offset: int) -> tuple[int, int]:
    """Compressed size and local-header offset, read from the zip64 extra field when saturated."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, size = struct.unpack("<HH", extra[pos : pos + 4])
        if tag == 0x0001:  # zip64: the saturated fields' real values, in this order
            values = iter(struct.unpack(f"<{size // 8}Q", extra[pos + 4 : pos + 4 + size // 8 * 8]))
            if usize == 0xFFFFFFFF:
                next(values, None)
            if csize == 0xFFFFFFFF:
                csize = next(values, csize)
            if offset == 0xFFFFFFFF:
                offset = next(values, offset)
        pos += 4 + size
    return csize, offset
