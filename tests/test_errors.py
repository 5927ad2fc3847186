"""The exception tree drawn in `errors`' docstring is the one in the code; error kinds."""

from __future__ import annotations

import re

import pytest

from specproxy import errors
from specproxy.errors import (
    ErrorKind,
    SpecProxyError,
    UpstreamBroken,
    UpstreamConnectError,
    UpstreamError,
    UpstreamTimeout,
)


def _drawn_tree() -> dict[str, tuple[str | None, tuple[str, ...]]]:
    """name -> (parent drawn above it, extra builtin bases drawn in parentheses)."""
    assert errors.__doc__ is not None
    drawn: dict[str, tuple[str | None, tuple[str, ...]]] = {}
    stack: list[tuple[int, str]] = []
    for line in errors.__doc__.splitlines():
        match = re.match(
            r"^( *)(?:[│ ]*[├└]── )?(\w+(?:Error|Timeout|Broken))(?: \(([\w, ]+)\))?", line
        )
        if match is None or not line.startswith("    "):
            continue
        depth = len(line) - len(line.lstrip(" │├└─"))
        name, extra = match.group(2), match.group(3)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parent = stack[-1][1] if stack else None
        drawn[name] = (parent, tuple(b.strip() for b in extra.split(",")) if extra else ())
        stack.append((depth, name))
    return drawn


def test_the_drawn_tree_is_the_code() -> None:
    drawn = _drawn_tree()
    classes = {
        name: obj
        for name, obj in vars(errors).items()
        if isinstance(obj, type) and issubclass(obj, SpecProxyError)
    }
    assert set(drawn) == set(classes)  # every class drawn, nothing drawn that does not exist
    for name, (parent, extra) in drawn.items():
        cls = classes[name]
        bases = [b.__name__ for b in cls.__bases__]
        if parent is None:
            assert bases == ["Exception"]
        else:
            assert bases[0] == parent
        assert tuple(bases[1:]) == extra


def test_error_kinds_are_the_stored_strings() -> None:
    assert [k.value for k in ErrorKind] == [
        "connect",
        "timeout",
        "broken",
        "http_4xx",
        "http_5xx",
        "malformed_stream",
        "stream_error",
        "event_too_large",
        "disconnected",
        "cancelled",
    ]
    assert ErrorKind("http_5xx") is ErrorKind.HTTP_5XX and ErrorKind.BROKEN.value == "broken"
    # The proxy's own bound on one event, not the engine failing: no ejection, still counted.
    assert not ErrorKind.EVENT_TOO_LARGE.engine_failure
    assert not ErrorKind.EVENT_TOO_LARGE.verdict_free
    assert [ErrorKind.of_status(s) for s in (200, 399, 400, 499, 500)] == [
        None,
        None,
        ErrorKind.HTTP_4XX,
        ErrorKind.HTTP_4XX,
        ErrorKind.HTTP_5XX,
    ]


@pytest.mark.parametrize(
    ("cls", "kind", "status", "error_type", "never_sent", "message"),
    [
        (
            UpstreamConnectError,
            "connect",
            502,
            "BadGateway",
            True,
            "the spec arm could not be reached: refused",
        ),
        (UpstreamTimeout, "timeout", 504, "GatewayTimeout", False, "the spec arm timed out"),
        (
            UpstreamBroken,
            "broken",
            502,
            "BadGateway",
            False,
            "the spec arm sent a broken response: refused",
        ),
    ],
)
def test_each_upstream_error_says_what_the_client_and_the_record_get(
    cls: type[UpstreamError],
    kind: str,
    status: int,
    error_type: str,
    never_sent: bool,
    message: str,
) -> None:
    exc = cls("refused")
    assert (exc.kind, exc.status, exc.error_type, exc.never_sent) == (
        kind,
        status,
        error_type,
        never_sent,
    )
    assert exc.client_message("spec") == message
    assert isinstance(UpstreamTimeout("x"), TimeoutError)  # asyncio code may catch it as such
