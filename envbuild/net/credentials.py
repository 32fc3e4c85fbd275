"""Registry credentials, looked up the way Docker does: ENVBUILD_REGISTRY_USERNAME/PASSWORD first,
then Docker's config (a credential helper, a credsStore, or an `auths` entry).

A secret never shows in a repr, a message or a log line; where it may be sent is the registry
client's business (envbuild.registry).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from envbuild.core.errors import BadInput
from envbuild.core.redact import register, register_credentials
from envbuild.net.docker_config import docker_config_path, read_docker_config

log = logging.getLogger(__name__)

USERNAME_ENV = "ENVBUILD_REGISTRY_USERNAME"
PASSWORD_ENV = "ENVBUILD_REGISTRY_PASSWORD"

_HELPER_TIMEOUT = 30.0
_FIX_CONFIG = "fix or remove it (`docker login` writes it)"


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """A username and secret for one registry; the secret never shows in repr or str."""

    username: str
    password: str = field(repr=False)
    source: str  # where they came from, safe to show: "ENVBUILD_REGISTRY_USERNAME/PASSWORD", ...
    identity_token: str | None = field(default=None, repr=False)  # OAuth2 refresh token


def lookup_credentials(
    host: str, *, environ: Mapping[str, str] | None = None
) -> Credentials | None:
    """Credentials for `host`: ENVBUILD_REGISTRY_* first, then Docker's config; None if none.

    What is found is registered with envbuild.core.redact, so no output can show it from then on.
    """
    found = _lookup(host, environ)
    if found is not None:
        register_credentials(found.username, found.password)
        register(found.identity_token)
    return found


def _lookup(host: str, environ: Mapping[str, str] | None) -> Credentials | None:
    env = os.environ if environ is None else environ
    username, password = env.get(USERNAME_ENV), env.get(PASSWORD_ENV)
    if username and password:
        return Credentials(
            username=username, password=password, source=f"{USERNAME_ENV}/{PASSWORD_ENV}"
        )
    if username or password:
        missing = PASSWORD_ENV if username else USERNAME_ENV
        present = USERNAME_ENV if username else PASSWORD_ENV
        msg = f"{present} is set but {missing} is not; set both, or neither to use Docker's login"
        raise BadInput(msg)
    config_path = docker_config_path(env)
    config = read_docker_config(config_path, fix=_FIX_CONFIG)
    if config is None:
        return None
    helpers = config.get("credHelpers")
    helper = helpers.get(host) if isinstance(helpers, dict) else None
    store = config.get("credsStore")
    for name in (helper, store):
        if isinstance(name, str) and name:
            found = _from_helper(name, host)
            if found is not None:
                return found
            break  # Docker asks only the most specific helper
    return _from_auths(config, host, config_path)


def docker_auth_config(
    host: str, *, environ: Mapping[str, str] | None = None
) -> dict[str, str] | None:
    """The auth_config the Docker engine expects for pushing to `host`, or None."""
    credentials = lookup_credentials(host, environ=environ)
    if credentials is None:
        return None
    if credentials.identity_token:
        return {"identitytoken": credentials.identity_token, "serveraddress": host}
    return {
        "username": credentials.username,
        "password": credentials.password,
        "serveraddress": host,
    }


def _registry_key(key: str) -> str:
    """`https://host/v1/` and `host` both name `host`, as Docker's config keys may."""
    if "://" in key:
        key = urlsplit(key).netloc or key
    return key.split("/", 1)[0]


def _from_auths(config: Mapping[str, Any], host: str, path: Path) -> Credentials | None:
    auths = config.get("auths")
    if not isinstance(auths, dict):
        return None
    entry = next((value for key, value in auths.items() if _registry_key(str(key)) == host), None)
    if not isinstance(entry, dict):
        return None
    identity_token = entry.get("identitytoken")
    encoded = entry.get("auth")
    username = password = ""
    if isinstance(encoded, str) and encoded:
        try:
            username, sep, password = base64.b64decode(encoded).decode("utf-8").partition(":")
        except ValueError:
            sep = ""
        if not sep:
            msg = (
                f"Docker's config {path}: auths[{host!r}].auth is not base64 of user:password; "
                f"run `docker login {host}` again"
            )
            raise BadInput(msg) from None
    if isinstance(identity_token, str) and identity_token:
        return Credentials(
            username=username or "<token>",
            password=password,
            identity_token=identity_token,
            source=str(path),
        )
    if not username:
        return None
    return Credentials(username=username, password=password, source=str(path))


def _from_helper(name: str, host: str) -> Credentials | None:
    program = f"docker-credential-{name}"
    binary = shutil.which(program)
    if binary is None:
        log.warning("credential helper %s (from Docker's config) is not on PATH", program)
        return None
    try:
        result = subprocess.run(
            [binary, "get"],
            input=host,
            capture_output=True,
            text=True,
            timeout=_HELPER_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("credential helper %s failed for %s: %s", program, host, type(exc).__name__)
        return None
    if result.returncode != 0:
        # Helpers print "credentials not found in native keychain" when nothing is stored.
        log.debug(
            "credential helper %s has nothing for %s (exit %s)", program, host, result.returncode
        )
        return None
    try:
        data = json.loads(result.stdout)
        username, secret = str(data["Username"]), str(data["Secret"])
    except (ValueError, KeyError, TypeError):
        log.warning("credential helper %s answered something that is not its JSON", program)
        return None
    if not secret:
        return None
    if username == "<token>":  # helpers hand identity (refresh) tokens out this way
        return Credentials(username=username, password="", identity_token=secret, source=program)
    return Credentials(username=username, password=secret, source=program)
