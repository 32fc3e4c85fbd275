"""Authentication with one registry: its challenges answered with Basic credentials or a token.

Credentials go only to the registry's own origin or its token service, over https (or
loopback); they never appear in messages or reprs.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from envbuild.net.bounded import (
    TOKEN_LIMIT,
    close_quietly,
    origin,
    origin_text,
    printable,
    safe_for_credentials,
)
from envbuild.net.credentials import PASSWORD_ENV, USERNAME_ENV, Credentials
from envbuild.registry.content import json_or_none
from envbuild.registry.errors import RegistryAuthError, RegistryError

if TYPE_CHECKING:
    from envbuild.registry.connection import RegistryConnection

_CHALLENGE_PARAM = re.compile(r'(\w+)=(?:"([^"]*)"|([^\s,]*))')
_MAX_TOKEN_CHARS = 16 * 1024
_TOKEN = re.compile(r"[\x21-\x7e]+")  # what may follow "Bearer " in a header
_FIX_LOGIN = f"log in with `docker login {{host}}` or set {USERNAME_ENV} and {PASSWORD_ENV}"


@dataclass(frozen=True, kw_only=True)
class _Challenge:
    scheme: str  # "basic" or "bearer"
    params: dict[str, str]


def _parse_challenge(header: str) -> _Challenge | None:
    scheme, _, rest = header.strip().partition(" ")
    if not scheme:
        return None
    params = {
        m.group(1).lower(): m.group(2) or m.group(3) or "" for m in _CHALLENGE_PARAM.finditer(rest)
    }
    return _Challenge(scheme=scheme.lower(), params=params)


class RegistryAuth:
    """What one registry host gets in the Authorization header: Basic credentials once it
    asked for them, else the bearer token last granted for the repository."""

    def __init__(self, host: str, credentials: Credentials | None) -> None:
        self.host = host
        self.credentials = credentials
        self._basic = False  # the registry asked for HTTP Basic once: send it pre-emptively
        self._tokens: dict[str, str] = {}  # repository -> bearer token last granted for it

    def __repr__(self) -> str:
        return f"RegistryAuth(host={self.host!r}, authenticated={self.credentials is not None})"

    def header(self, repository: str) -> str | None:
        """The Authorization header for a request about `repository`, if any."""
        token = self._tokens.get(repository)
        if token:
            return f"Bearer {token}"
        if self._basic and self.credentials is not None:
            return _basic_header(self.credentials)
        return None

    def answer(
        self, header: str, repository: str, what: str, connection: RegistryConnection
    ) -> None:
        """Answer a 401's WWW-Authenticate challenge: Basic, or a Bearer token from the realm."""
        challenge = _parse_challenge(header)
        if challenge is None or challenge.scheme not in ("basic", "bearer"):
            raise self.error(401, what)
        if challenge.scheme == "basic":
            if self.credentials is None or self.credentials.identity_token:
                raise self.error(401, what)
            self._basic = True
            self._tokens.pop(repository, None)
            return
        realm = challenge.params.get("realm")
        if not realm or origin(realm) is None:
            why = f"its realm '{printable(realm or '', 80)}' is not an http(s) URL"
            raise connection.malformed(what, kind="bearer challenge", why=why)
        if not safe_for_credentials(realm):
            msg = (
                f"registry {self.host} asks for a token from {origin_text(realm)}, which is "
                "plain http off this machine; envbuild fetches tokens only over https (or from "
                "loopback) so that no credentials travel in clear text: fix the registry's realm"
            )
            raise RegistryAuthError(msg)
        scope = challenge.params.get("scope") or (
            f"repository:{repository}:pull" if repository else ""
        )
        service = challenge.params.get("service")
        self._tokens[repository] = self._fetch_token(realm, service, scope, what, connection)

    def _fetch_token(
        self,
        realm: str,
        service: str | None,
        scope: str,
        for_what: str,
        connection: RegistryConnection,
    ) -> str:
        token_service = origin_text(realm)
        what = f"a token from {token_service} for {for_what}"
        credentials = self.credentials
        if credentials is not None and credentials.identity_token:
            form = {
                "grant_type": "refresh_token",
                "refresh_token": credentials.identity_token,
                "client_id": "envbuild",
                **({"service": service} if service else {}),
                **({"scope": scope} if scope else {}),
            }
            response = connection.exchange(
                "POST",
                realm,
                what=what,
                headers={"Content-Type": "application/x-www-form-urlencoded"},
                data=urlencode(form).encode("ascii"),  # a secret: never redirected elsewhere
            )
        else:
            response = connection.exchange(
                "GET",
                realm,
                what=what,
                params={k: v for k, v in (("service", service), ("scope", scope)) if v},
                authorization=_basic_header(credentials) if credentials else None,
                credentials_origin=realm,
            )
        status = response.status_code
        if status != 200:
            close_quietly(response)
            if status in (401, 403):
                raise self.error(status, for_what, token_service=token_service)
            msg = f"registry {self.host}: {what} failed with HTTP {status}"
            raise RegistryError(msg)
        data = json_or_none(connection.read(response, what, TOKEN_LIMIT).body)
        if not isinstance(data, dict):
            raise connection.malformed(for_what, kind="token answer", why="not a JSON object")
        token = data.get("token") or data.get("access_token")
        if not isinstance(token, str) or not token:
            raise connection.malformed(for_what, kind="token answer", why="it holds no token")
        if len(token) > _MAX_TOKEN_CHARS or not _TOKEN.fullmatch(token):
            raise connection.malformed(
                for_what, kind="token answer", why="the token is not header-safe text"
            )
        return token

    def error(
        self, status: int, what: str, *, token_service: str | None = None
    ) -> RegistryAuthError:
        """The one-line error for a refusal: no credentials, denied, or rejected ones."""
        fix = _FIX_LOGIN.format(host=self.host)
        credentials = self.credentials
        if credentials is None:
            msg = f"registry {self.host} requires authentication for {what} (HTTP {status}); {fix}"
        elif status == 403 and token_service is None:
            msg = (
                f"registry {self.host} denied {what} to the credentials from "
                f"{credentials.source} (HTTP 403); use an account with access to it, or {fix}"
            )
        else:
            where = f" at its token service {token_service}" if token_service else ""
            msg = (
                f"registry {self.host} rejected the credentials from {credentials.source} "
                f"for {what} (HTTP {status}{where}); {fix}"
            )
        return RegistryAuthError(msg)


def _basic_header(credentials: Credentials) -> str:
    raw = f"{credentials.username}:{credentials.password}".encode()
    return "Basic " + base64.b64encode(raw).decode("ascii")
