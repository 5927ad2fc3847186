"""A black-holed treatment endpoint (SYNs dropped: a listener whose backlog is full, on
loopback): a connect timeout sent nothing, so the request fails over to the control like a
refused connection; the endpoint is ejected, logged and counted."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest

from tests.faults.conftest import MakeRig, fault_row, rss_bytes
from tests.faults.upstream import blackholed_url
from tests.proxy.conftest import CHAT, chat

pytestmark = pytest.mark.timeout(120)

REQUESTS = 20


@pytest.fixture
def blackhole() -> Iterator[str]:
    with blackholed_url() as url:
        port = int(url.rsplit(":", 1)[1])
        probe = socket.socket()
        probe.settimeout(0.5)
        with pytest.raises(TimeoutError):
            probe.connect(("127.0.0.1", port))  # the rig really black-holes
        probe.close()
        yield url


async def test_a_blackholed_treatment_fails_over_and_is_ejected(
    make_rig: MakeRig, blackhole: str, caplog: pytest.LogCaptureFixture
) -> None:
    rss_before = rss_bytes()
    # only the black-holed arm's connect is short: the control's keeps the rig's default (5 s),
    # so a loaded machine never times out a connect to the live engine
    rig = await make_rig(speculative_url=blackhole, speculative={"connect_s": 0.2})
    statuses = []
    with caplog.at_level(logging.WARNING, logger="specproxy.fleet.pool"):
        for _ in range(REQUESTS):
            async with rig.client.post(CHAT, json=chat(), headers={"x-fault": "ok"}) as r:
                statuses.append(r.status)  # main: 504 after connect_s, until ejected
                await r.read()
            rig.sent += 1
    assert statuses == [200] * REQUESTS
    ejected = rig.registry.get_sample_value(
        "specproxy_endpoint_events_total", {"arm": "speculative", "event": "ejected"}
    )
    assert ejected == 1
    assert any("ejected" in rec.getMessage() for rec in caplog.records)
    rows = await rig.check_records({None})
    assert list(rows["status"]) == [200] * REQUESTS
    fault_row("black-holed treatment endpoint", f"{REQUESTS} x 200 (failed over)",
              "all recorded, rerouted", 0, rss_before, rss_bytes())  # fmt: skip
