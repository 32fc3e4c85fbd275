"""What a container prints reaches envbuild bounded: the engine's log answer is read at most
RUN_OUTPUT_MAX bytes of output deep, whatever the container (a framework image pushed by hand,
any image `smoke` is asked to test) prints, and what is kept is still Docker's framing, which
the engine's answer check (`_check_log_frames`) and docker-py's reader take apart as before.

Generated: frames of any stream, size and split into reads, against small limits."""

from __future__ import annotations

import io
import struct

import requests
from hypothesis import given
from hypothesis import strategies as st

from envbuild.engine.docker_engine import _bounded_log, _check_log_frames

frames = st.lists(st.tuples(st.sampled_from([1, 2]), st.binary(max_size=64)), max_size=12)


def framed(items: list[tuple[int, bytes]]) -> bytes:
    return b"".join(bytes([s, 0, 0, 0]) + struct.pack(">L", len(p)) + p for s, p in items)


def answer(body: bytes) -> requests.Response:
    response = requests.Response()
    response.status_code = 200
    response.raw = io.BytesIO(body)
    response.raw.read = lambda amount, decode_content=True, _r=response.raw.read: _r(min(amount, 7))  # type: ignore[method-assign]
    return response


def payloads(body: bytes) -> bytes:
    out, at = bytearray(), 0
    while at < len(body):
        size = struct.unpack(">L", body[at + 4 : at + 8])[0]
        out += body[at + 8 : at + 8 + size]
        at += 8 + size
    return bytes(out)


@given(frames, st.integers(min_value=1, max_value=200))
def test_a_log_is_kept_whole_within_the_bound_and_cut_with_a_note_beyond_it(
    items: list[tuple[int, bytes]], limit: int
) -> None:
    body = framed(items)
    kept = _bounded_log(answer(body), limit)
    _check_log_frames(kept)  # still Docker's framing, every frame whole
    printed = b"".join(p for _, p in items)
    note = f"\n[envbuild: output cut at {limit} bytes]\n".encode()
    if len(printed) <= limit:
        assert kept == body
    else:
        assert payloads(kept) == printed[:limit] + note


def test_an_endless_log_is_read_no_deeper_than_the_bound() -> None:
    class Endless(io.RawIOBase):
        read_bytes = 0

        def read(self, amount: int = -1, decode_content: bool = True) -> bytes:
            chunk = (b"\x01\x00\x00\x00" + struct.pack(">L", 1000) + b"x" * 1000) * 4
            self.read_bytes += len(chunk)
            return chunk

    response = requests.Response()
    response.status_code = 200
    endless = Endless()
    response.raw = endless
    kept = _bounded_log(response, 100_000)
    _check_log_frames(kept)
    assert payloads(kept).endswith(b"\n[envbuild: output cut at 100000 bytes]\n")
    assert len(payloads(kept)) == 100_000 + len(b"\n[envbuild: output cut at 100000 bytes]\n")
    assert endless.read_bytes <= 2 * 100_000 + 64 * 1024 + 4 * 1008  # twice the bound at most
