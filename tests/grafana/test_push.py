"""`specproxy dashboards export|push`, the push run against a local fake of Grafana's HTTP API.

No Grafana server can be installed here, so the fake (tests/grafana/fake_grafana.py) stands in;
it answers with Grafana's status codes for the calls grafana-client makes. The blocking client
runs in a worker thread so the fake keeps serving on the test's event loop.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from specproxy.cli import main
from specproxy.grafana.dashboard import DASHBOARD_UID, build_dashboard
from specproxy.grafana.push import DashboardPushError, push_dashboards
from tests.grafana.fake_grafana import FakeGrafana

TOKEN = "glsa_test_token"


@pytest.fixture
async def grafana() -> AsyncIterator[tuple[FakeGrafana, str]]:
    fake = FakeGrafana(token=TOKEN)
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield fake, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def _cli(*argv: str) -> int:
    return await asyncio.to_thread(main, list(argv))


async def test_push_creates_the_folder_and_saves_the_dashboard(
    grafana: tuple[FakeGrafana, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake, url = grafana
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    assert await _cli("dashboards", "push", "--grafana-url", url, "--folder", "A/B tests") == 0
    assert fake.folders["specproxy"]["title"] == "A/B tests"
    saved = fake.dashboards[DASHBOARD_UID]
    assert saved["meta"]["folderUid"] == "specproxy"
    assert saved["dashboard"]["panels"] == build_dashboard()["panels"]
    assert f"{DASHBOARD_UID} version 1" in capsys.readouterr().out


async def test_second_push_overwrites_and_keeps_the_folder(
    grafana: tuple[FakeGrafana, str],
) -> None:
    fake, url = grafana
    push = functools.partial(
        push_dashboards,
        [build_dashboard()],
        grafana_url=url,
        token=TOKEN,
        folder_title="specproxy",
        folder_uid="obs",
    )
    first = await asyncio.to_thread(push)
    second = await asyncio.to_thread(push)
    assert [p.version for p in first + second] == [1, 2]
    assert list(fake.folders) == ["obs"]
    assert fake.requests.count(("POST", "/api/folders")) == 1
    assert second[0].url == f"/d/{DASHBOARD_UID}/specproxy"


async def test_wrong_token_is_a_clear_error(grafana: tuple[FakeGrafana, str]) -> None:
    fake, url = grafana
    with pytest.raises(DashboardPushError, match="check the token"):
        await asyncio.to_thread(
            push_dashboards,
            [build_dashboard()],
            grafana_url=url,
            token="wrong",
            folder_title="specproxy",
            folder_uid="specproxy",
        )
    assert not fake.dashboards


async def test_cli_reports_a_missing_token_before_calling_grafana(
    grafana: tuple[FakeGrafana, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake, url = grafana
    monkeypatch.delenv("MY_TOKEN", raising=False)
    assert await _cli("dashboards", "push", "--grafana-url", url, "--token-env", "MY_TOKEN") == 2
    assert "set MY_TOKEN" in capsys.readouterr().err
    assert fake.requests == []


async def test_unreachable_grafana_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    code = await _cli(
        "dashboards", "push", "--grafana-url", f"http://127.0.0.1:{port}", "--timeout", "2"
    )
    assert code == 2
    assert "cannot reach Grafana" in capsys.readouterr().err


def test_export_writes_the_dashboard_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "nested" / "dashboards"
    assert main(["dashboards", "export", "--out", str(out)]) == 0
    written = out / "specproxy.json"
    assert json.loads(written.read_text(encoding="utf-8")) == build_dashboard()
    assert str(written) in capsys.readouterr().out
