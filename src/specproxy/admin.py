"""The optional admin token that guards the proxy's own surfaces (never the proxied /v1/* path).

The token comes from the environment, never from a flag (a flag shows in `ps` and shell history):
`SPECPROXY_ADMIN_TOKEN` holds it, or `SPECPROXY_ADMIN_TOKEN_FILE` names a file holding it (a
mounted Kubernetes Secret). With a token set:

    GET /api/stats, GET /ui, /ui/*        need it
    GET /api/arms                         needs it
    GET /metrics                          needs it when `protect_metrics = true` (a Prometheus
                                          scrape config can send it: `authorization: credentials`)
    anything that changes state           needs it: every method but GET/HEAD outside /v1/*
                                          (POST /api/arms/NAME, /api/experiment: `control.api`;
                                          without a token those take loopback clients only)
    GET /healthz, GET /readyz             stay open (probes carry no secrets)
    /v1/*                                 is the product: the client's Authorization goes upstream

A request proves it with `Authorization: Bearer <token>`, or `Authorization: Basic` with the
token as password (any user name), which a browser asks for by itself on /ui and then reuses for
the page's own /api/stats calls. Failures get 401 with an OpenAI-style JSON body and both
challenges; the comparison is constant-time; the token is never logged.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Final

from aiohttp import web
from multidict import CIMultiDict

from specproxy.errors import ConfigError, error_body

__all__ = [
    "ADMIN_TOKEN_ENV",
    "ADMIN_TOKEN_FILE_ENV",
    "MIN_TOKEN_CHARS",
    "admin_guard",
    "authorized",
    "basic_user",
    "load_admin_token",
]

ADMIN_TOKEN_ENV: Final = "SPECPROXY_ADMIN_TOKEN"
ADMIN_TOKEN_FILE_ENV: Final = "SPECPROXY_ADMIN_TOKEN_FILE"
MIN_TOKEN_CHARS: Final = 16
_OPEN: Final = frozenset({"/healthz", "/readyz"})
_READS: Final = frozenset({"GET", "HEAD"})
_CHALLENGES: Final = ('Bearer realm="specproxy"', 'Basic realm="specproxy", charset="UTF-8"')

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def load_admin_token(environ: Mapping[str, str] | None = None) -> str | None:
    """The configured token, or None; a bad setting is a `ConfigError` (the proxy won't start)."""
    env = os.environ if environ is None else environ
    value = env.get(ADMIN_TOKEN_ENV)
    path = env.get(ADMIN_TOKEN_FILE_ENV)
    if value is not None and path is not None:
        raise ConfigError(f"set {ADMIN_TOKEN_ENV} or {ADMIN_TOKEN_FILE_ENV}, not both")
    source = ADMIN_TOKEN_ENV
    if path is not None:
        source = f"{ADMIN_TOKEN_FILE_ENV} ({path})"
        try:
            value = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{ADMIN_TOKEN_FILE_ENV}: cannot read {path}: {exc}") from None
    if value is None:
        return None
    token = value.strip()
    if len(token) < MIN_TOKEN_CHARS or not token.isascii() or not token.isprintable():
        raise ConfigError(
            f"{source}: the admin token must be at least {MIN_TOKEN_CHARS} printable ASCII "
            "characters (e.g. `openssl rand -hex 32`)"
        )
    return token


def authorized(authorization: str | None, token: str) -> bool:
    """Whether an `Authorization` header value carries `token` (Bearer, or Basic password)."""
    if not authorization:
        return False
    scheme, _, credentials = authorization.strip().partition(" ")
    scheme = scheme.lower()
    if scheme == "bearer":
        given = credentials.strip()
    elif scheme == "basic":
        basic = _basic(credentials)
        if basic is None:
            return False
        given = basic[1]
    else:
        return False
    return hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8"))


def basic_user(authorization: str | None) -> str | None:
    """The user name of `Authorization: Basic` credentials, or None for any other header. The
    token is one shared secret: this name is what the caller says, not an identity it proved."""
    if not authorization:
        return None
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    basic = _basic(credentials)
    return basic[0] if basic is not None else None


def _basic(credentials: str) -> tuple[str, str] | None:
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, _, password = decoded.partition(":")
    return user, password


def admin_guard(
    token: str, *, protect_metrics: bool
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """An aiohttp middleware enforcing the table above (installed only when a token is set)."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path.startswith("/v1/") or path in _OPEN:
            return await handler(request)
        if path == "/metrics" and not protect_metrics and request.method in _READS:
            return await handler(request)
        if authorized(request.headers.get("Authorization"), token):
            return await handler(request)
        headers = CIMultiDict[str]()
        for challenge in _CHALLENGES:
            headers.add("WWW-Authenticate", challenge)
        return web.Response(
            status=401,
            body=error_body(
                "this endpoint needs the admin token (Authorization: Bearer ...)",
                status=401,
                error_type="AuthenticationError",
            ),
            content_type="application/json",
            headers=headers,
        )

    return guard
