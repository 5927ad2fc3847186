"""`specproxy arms`: see and change the split of a running proxy through its admin API.

    specproxy arms                                   the arms: role, weight, share, state
    specproxy arms set NAME --weight W [--why ...]   the treatment NAME gets share W
    specproxy arms pause NAME | resume NAME          NAME gets nothing / its weight again
    specproxy arms stop | start                      the kill switch: all to the control arm

It talks to one proxy (`--url`); the change is stored and every replica applies it within its
`[control] poll_s`. The admin token comes from SPECPROXY_ADMIN_TOKEN (never a flag); `--who`
sends it as Basic credentials under that name, which the event records (without `--who`:
"admin"). Without a token the proxy takes changes from loopback clients only.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Final

from specproxy.admin import ADMIN_TOKEN_ENV
from specproxy.config import Config
from specproxy.control.events import MAX_REASON_CHARS

__all__ = ["configure", "format_arms", "run"]

DEFAULT_PORT: Final = next(f.default for f in dataclasses.fields(Config) if f.name == "port")
DEFAULT_URL: Final = f"http://127.0.0.1:{DEFAULT_PORT}"
TIMEOUT_S: Final = 10.0
MAX_RESPONSE_BYTES: Final = 1 << 20


def _connection_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """--url, --who, --json: on `arms` and again on each action (`arms stop --url ...`); an
    action's own copy has no default, so it keeps what was given before the action."""
    kept: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    url_default = {"default": DEFAULT_URL} if top else kept
    parser.add_argument("--url", help="the proxy's base URL", **url_default)
    parser.add_argument(
        "--who",
        help="your name in the event (sent as the Basic user name; default: admin)",
        **kept,
    )
    parser.add_argument("--json", action="store_true", help="print the API's JSON answer", **kept)


def configure(parser: argparse.ArgumentParser) -> None:
    _connection_options(parser, top=True)
    sub = parser.add_subparsers(dest="action", metavar="ACTION", title="actions")
    set_ = sub.add_parser("set", help="set a treatment arm's weight (its share, 0..1)")
    set_.add_argument("name", help="the treatment arm, e.g. speculative")
    set_.add_argument("--weight", type=float, required=True, help="share of the traffic, 0..1")
    for name, text in (
        ("pause", "send a treatment arm nothing (its weight is kept)"),
        ("resume", "give a paused treatment arm its weight again"),
    ):
        sub.add_parser(name, help=text).add_argument("name", help="the treatment arm")
    sub.add_parser("stop", help="the kill switch: every request to the control arm")
    sub.add_parser("start", help="run the experiment again with the arms' weights")
    for action_parser in sub.choices.values():
        _connection_options(action_parser, top=False)
        action_parser.add_argument(
            "--why", default="", help=f"the reason, recorded (at most {MAX_REASON_CHARS} chars)"
        )


def run(args: argparse.Namespace) -> int:
    action: str | None = args.action
    if action is None:
        path, body = "/api/arms", None
    elif action in ("stop", "start"):
        path, body = "/api/experiment", {"action": action, "why": args.why}
    else:
        path = f"/api/arms/{urllib.parse.quote(args.name, safe='')}"
        body = {"action": action, "why": args.why}
        if action == "set":
            body["weight"] = args.weight
    status, doc = _call(args.url.rstrip("/") + path, body, who=args.who)
    if status >= 400 or "error" in doc:
        message = doc.get("error", {}).get("message", "") if isinstance(doc, dict) else ""
        print(f"specproxy arms: {status}: {message or doc}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if args.json else format_arms(doc))
    return 0


def _call(url: str, body: dict[str, Any] | None, *, who: str | None) -> tuple[int, Any]:
    headers = {"Accept": "application/json"}
    token = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if who is not None:
        raw = base64.b64encode(f"{who}:{token}".encode()).decode()
        headers["Authorization"] = f"Basic {raw}"
    elif token:
        headers["Authorization"] = f"Bearer {token}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
            return resp.status, _decode(resp.read(MAX_RESPONSE_BYTES))
    except urllib.error.HTTPError as exc:
        return exc.code, _decode(exc.read(MAX_RESPONSE_BYTES))
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return 599, {"error": {"message": f"cannot reach {url}: {reason}"}}


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": {"message": raw[:200].decode("utf-8", "replace")}}


def format_arms(doc: dict[str, Any]) -> str:
    """GET /api/arms (or a change's answer) as a table, then the recent events."""
    lines = []
    if "event" in doc:
        lines.append(
            f"stored event #{doc['event']['id']}; every replica applies it by its next poll"
        )
    header = ("ARM", "ROLE", "CONFIGURED", "WEIGHT", "SHARE", "STATE")
    rows = [header]
    for arm in doc["arms"]:
        state = "stopped" if arm["stopped"] else "paused" if arm["paused"] else "active"
        weight = "-" if arm["weight"] is None else f"{arm['weight']:.3f}"
        rows.append(
            (
                arm["name"],
                arm["role"],
                f"{arm['configured_weight']:.3f}",
                weight,
                f"{arm['share']:.3f}",
                state,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    lines.append(f"experiment: {'STOPPED' if doc['stopped'] else 'running'} (run {doc['run_id']})")
    if doc["events"]:
        lines.append("recent events:")
    for event in doc["events"]:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(event["t"]))
        weight = "" if event["weight"] is None else f" {event['weight']:g}"
        why = f": {event['why']}" if event["why"] else ""
        change = f"{event['action']} {event['arm']}{weight}"
        lines.append(f"  #{event['id']} {when} {change} by {event['who']}{why}")
    return "\n".join(lines)
