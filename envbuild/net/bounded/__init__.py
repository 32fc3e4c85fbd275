"""Bounded HTTP for servers that may be broken or hostile: body caps, deadlines, origins, redirects.

Nothing here knows about registries. Each piece bounds one way a server could make a client
hang or eat memory, or hand credentials to someone else:

- `Deadline`: one monotonic deadline per operation, checked across retries and between socket
  reads; `watched` shuts the operation's sockets down when it passes, so even a status line or
  header dripped a byte at a time ends on time, and gives each address of a name only what is
  left of it to connect (sessions from `watched_session`).
- `read_body`: streamed reads that stop at a cap, whatever Content-Length says or omits.
- `Retries`: the one retry policy (429/5xx and failed connections; Retry-After honoured,
  bounded; exponential backoff; a bounded count of tries), used by `Transport` and by the PyPI
  client. Under a deadline, each try gets what is left of it and no wait runs past it.
- `Transport`: retries and redirects followed by hand: at most MAX_REDIRECTS, never from https
  down to plain http, Authorization only to its origin.
- `same_origin`, `safe_for_credentials`, `next_link`, `is_loopback` (origins): where a link
  or secret may go, and which hosts are this machine.
- `printable` (text): text from a server made safe for one terminal line.

Failures are the small exceptions in `bodies`; the caller turns them into messages that name
the server and what it was asked for.
"""

from envbuild.net.bounded.bodies import (
    BLOB_LIMIT,
    CONNECT_TIMEOUT,
    KIB,
    MANIFEST_LIMIT,
    MAX_PAGES,
    MAX_REDIRECTS,
    MAX_RETRY_AFTER,
    MIB,
    READ_TIMEOUT,
    REDIRECT_STATUSES,
    SMALL_LIMIT,
    TOKEN_LIMIT,
    BodyTooLarge,
    Deadline,
    DeadlineExceeded,
    Overloaded,
    ReadFailed,
    RedirectRefused,
    Reply,
    TlsFailed,
    Unreachable,
    close_quietly,
    describe_failure,
    read_body,
    read_reply,
)
from envbuild.net.bounded.origins import (
    is_downgrade,
    is_loopback,
    next_link,
    origin,
    safe_for_credentials,
    same_origin,
)
from envbuild.net.bounded.text import for_log, origin_text, printable
from envbuild.net.bounded.transport import (
    Retries,
    Transport,
    redirected_method,
    retry_after_seconds,
)
from envbuild.net.bounded.watchdog import WatchedAdapter, watched, watched_session

__all__ = [
    "BLOB_LIMIT",
    "CONNECT_TIMEOUT",
    "KIB",
    "MANIFEST_LIMIT",
    "MAX_PAGES",
    "MAX_REDIRECTS",
    "MAX_RETRY_AFTER",
    "MIB",
    "READ_TIMEOUT",
    "REDIRECT_STATUSES",
    "SMALL_LIMIT",
    "TOKEN_LIMIT",
    "BodyTooLarge",
    "Deadline",
    "DeadlineExceeded",
    "Overloaded",
    "ReadFailed",
    "RedirectRefused",
    "Reply",
    "Retries",
    "TlsFailed",
    "Transport",
    "Unreachable",
    "WatchedAdapter",
    "close_quietly",
    "describe_failure",
    "for_log",
    "is_downgrade",
    "is_loopback",
    "next_link",
    "origin",
    "origin_text",
    "printable",
    "read_body",
    "read_reply",
    "redirected_method",
    "retry_after_seconds",
    "safe_for_credentials",
    "same_origin",
    "watched",
    "watched_session",
]
