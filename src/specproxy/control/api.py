"""The admin API of runtime arm control: GET /api/arms, POST /api/arms/{name}, POST /api/experiment.

Who may change the split:

- with an admin token (`specproxy.admin`), its middleware already demands it on every POST here
  (and on GET /api/arms); the token is one shared secret, so `who` is only what the caller says:
  the user name of `Authorization: Basic` credentials, or "admin" with a Bearer token;
- without one, changes are accepted from loopback clients only (a shell on the proxy's host,
  `kubectl port-forward`), and refused with 403 otherwise, saying to set SPECPROXY_ADMIN_TOKEN.
  A reverse proxy on the same host makes every client look local: set a token behind one.

A change is written to the store first (503, nothing applied, when that fails), then applied by
this replica at once and by every other replica at its next poll (`control.live`). Bodies are
bounded (`MAX_BODY_BYTES`), and bad input gets an OpenAI-style JSON 4xx with the request id.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Callable
from typing import Final

from aiohttp import web

from specproxy.admin import ADMIN_TOKEN_ENV, basic_user
from specproxy.appkeys import ADMIN_GUARDED, CONFIG, CONTROL
from specproxy.control.commands import (
    CommandError,
    UnknownArm,
    arm_event,
    arms_view,
    event_doc,
    experiment_event,
)
from specproxy.control.events import MAX_WHO_CHARS, ArmEvent
from specproxy.control.live import ArmControl
from specproxy.errors import StoreError
from specproxy.proxy.headers import REQUEST_ID_HEADER
from specproxy.proxy.relay import bad_request, json_error, too_large
from specproxy.proxy.trace import RequestIds

__all__ = ["MAX_BODY_BYTES", "add_control_routes"]

MAX_BODY_BYTES: Final = 4096
DEFAULT_WHO: Final = "admin"
_new_id = RequestIds()


def add_control_routes(app: web.Application) -> None:
    app.router.add_get("/api/arms", _get_arms)
    app.router.add_post("/api/arms/{name}", _post_arm)
    app.router.add_post("/api/experiment", _post_experiment)


async def _get_arms(request: web.Request) -> web.Response:
    request_id = _new_id()
    control = request.app.get(CONTROL)
    if control is None:
        return _unavailable(request_id)
    return _view(request, control, request_id)


async def _post_arm(request: web.Request) -> web.Response:
    name = request.match_info["name"]

    control = request.app.get(CONTROL)

    def build(doc: object, run_id: str, who: str, t: float) -> ArmEvent:
        assert control is not None  # `_change` answers 503 without it
        return arm_event(
            doc,
            name=name,
            treatments=tuple(control.configured),
            control=control.control,
            run_id=run_id,
            t=t,
            who=who,
        )

    return await _change(request, build)


async def _post_experiment(request: web.Request) -> web.Response:
    def build(doc: object, run_id: str, who: str, t: float) -> ArmEvent:
        return experiment_event(doc, run_id=run_id, t=t, who=who)

    return await _change(request, build)


async def _change(
    request: web.Request, build: Callable[[object, str, str, float], ArmEvent]
) -> web.Response:
    request_id = _new_id()
    control = request.app.get(CONTROL)
    if control is None:
        return _unavailable(request_id)
    if not request.app.get(ADMIN_GUARDED, False) and not _loopback(request.remote):
        message = (
            "changing the arms without an admin token is allowed from loopback clients only: "
            f"set {ADMIN_TOKEN_ENV} on the proxy and send it (Authorization: Bearer ...)"
        )
        return json_error(403, "PermissionDeniedError", message, request_id)
    who = basic_user(request.headers.get("Authorization")) or DEFAULT_WHO
    if len(who) > MAX_WHO_CHARS or not who.isprintable():
        message = f"the Basic user name must be at most {MAX_WHO_CHARS} printable characters"
        return bad_request(request_id, message, "authorization")
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        return too_large(request_id, MAX_BODY_BYTES)
    body = await _read_bounded(request)
    if body is None:
        return too_large(request_id, MAX_BODY_BYTES)
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return bad_request(request_id, "the body must be a JSON object")
    try:
        event = build(doc, control.run_id, who, time.time())
    except UnknownArm as exc:
        return json_error(404, "NotFoundError", str(exc), request_id)
    except CommandError as exc:
        return bad_request(request_id, str(exc), exc.param)
    try:
        stored = await control.submit(event)
    except StoreError as exc:
        message = f"the change was not stored, so nothing changed: {exc}"
        return json_error(503, "ServiceUnavailable", message, request_id)
    return _view(request, control, request_id, event=event_doc(stored))


async def _read_bounded(request: web.Request) -> bytes | None:
    """The whole body, or None once it is longer than `MAX_BODY_BYTES` (a chunked body has no
    Content-Length to check first)."""
    body = bytearray()
    while len(body) <= MAX_BODY_BYTES:
        chunk = await request.content.read(MAX_BODY_BYTES + 1 - len(body))
        if not chunk:
            return bytes(body)
        body += chunk
    return None


def _view(
    request: web.Request, control: ArmControl, request_id: str, **extra: object
) -> web.Response:
    doc = arms_view(
        control.state,
        configured=control.configured,
        control=control.control,
        recent=control.recent,
        run_id=control.run_id,
        poll_s=request.app[CONFIG].control.poll_s,
    )
    return web.json_response({**extra, **doc}, headers={REQUEST_ID_HEADER: request_id})


def _unavailable(request_id: str) -> web.Response:
    message = "runtime arm control needs the store (the proxy runs without one)"
    return json_error(503, "ServiceUnavailable", message, request_id)


def _loopback(remote: str | None) -> bool:
    if not remote:
        return False
    try:
        return ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False
