"""The live page in headless Chromium while demo traffic flows: it shows what /api/stats says.

Chromium loads GET /ui, runs the page's script (`--virtual-time-budget`) and dumps the DOM; the
test parses the numbers shown and compares them, value by value and as formatted text, with the
/api/stats result the page rendered (matched by `computed_at`). A screenshot is saved under
artifacts/ui/ for people to look at. A second test serves a three-arm result (A/B/n, from the
stats pipeline on a synthetic run, `tests.report.abn`): every treatment's comparison, the best
line and the speedups by condition are checked the same way.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer
from rich.console import Console

from specproxy.appkeys import CONFIG, STORE
from specproxy.config import Config, StoreConfig
from specproxy.demo.runner import DemoOptions, run_demo
from specproxy.report.summary import (
    ARMS,
    METRICS,
    STATISTICS,
    arm_figures,
    arms_of,
    band_text,
    best_line,
    comparison_of,
    condition_rows,
    conditions_of,
    crossover_text,
    fmt_ci,
    fmt_ms,
    fmt_ratio,
    main_window,
    shown_arms,
)
from specproxy.stats.result import StatsResult, to_json
from specproxy.store.memory import MemoryStore
from specproxy.ui import add_ui_routes
from tests.conftest import require_binary
from tests.report import abn
from tests.report.abn import three_arm_result

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "ui"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


class _Dom(HTMLParser):
    """Every element's attributes and its own text, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], list[str]]] = []
        self._open: list[int] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}, []))
        if tag not in ("meta", "link", "br", "img", "input"):
            self._open.append(len(self.elements) - 1)

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self.elements[self._open.pop()][0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for index in self._open:
            self.elements[index][2].append(data)

    def find(self, **attrs: str) -> list[tuple[dict[str, str], str]]:
        return [
            (a, "".join(text).strip())
            for _, a, text in self.elements
            if all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]


async def _chromium(binary: str, profile: Path, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        binary,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=90)
    assert proc.returncode == 0
    return out.decode()


async def _stats(session: aiohttp.ClientSession, url: str) -> StatsResult | None:
    async with session.get(url + "/api/stats") as resp:
        return cast(StatsResult, await resp.json()) if resp.status == 200 else None


def _has_data(result: StatsResult | None) -> bool:
    window = main_window(result)
    return window is not None and all(window["metrics"]["e2e"]["n"][a] > 5 for a in ARMS)


def _same(shown: str, value: Any) -> bool:
    if value is None:
        return shown == ""
    return math.isclose(float(shown), float(value), rel_tol=0, abs_tol=0)


def _check(dom: _Dom, result: StatsResult) -> None:
    import datetime

    window = main_window(result)
    assert window is not None
    # times in UTC ISO-8601, not the browser's local AM/PM (issue 28 item 5)
    at = datetime.datetime.fromtimestamp(float(result["computed_at"]), datetime.UTC)
    ((_, status),) = dom.find(id="status")
    assert f"stats computed at {at.strftime('%Y-%m-%dT%H:%M:%SZ')}," in status, status
    arms = [a["data-arm"] for tag, a, _ in dom.elements if tag == "tr" and "data-arm" in a]
    assert arms == shown_arms(window)  # the treatments, then the control
    for arm in arms:
        row = {a["data-field"]: (a["data-value"], text) for a, text in _row_cells(dom, arm)}
        f = arm_figures(window, arm)
        rate = f["acceptance_rate"]
        expected = {
            "n": (f["n"], str(f["n"])),
            "e2e_median": (f["e2e_median"], fmt_ms(f["e2e_median"])),
            "e2e_p99": (f["e2e_p99"], fmt_ms(f["e2e_p99"])),
            "ttft_median": (f["ttft_median"], fmt_ms(f["ttft_median"])),
            "tpot_median": (f["tpot_median"], fmt_ms(f["tpot_median"])),
            "acceptance_rate": (rate, f"{rate:.1%}" if rate is not None else "-"),
        }
        for field, (value, text) in expected.items():
            shown_value, shown_text = row[field]
            assert _same(shown_value, value), (arm, field, shown_value, value)
            assert shown_text == text, (arm, field, shown_text, text)
    control, treatments = arms_of(window)
    headings = [t for tag, _, t in dom.elements if tag == "h3"]
    if len(treatments) == 1:
        assert not headings  # two arms: the page as it always was
    for treatment in treatments:
        _check_comparison(dom, window, treatment)
    _check_best(dom, window)
    _check_conditions(dom, window)
    # The page takes its columns and labels from the result's settings, not from a copy.
    settings = result["settings"]
    assert settings.get("statistics") == list(STATISTICS)
    assert {m: spec["label"] for m, spec in settings.get("metrics", {}).items()} == METRICS
    headers = ["".join(text).strip() for tag, _, text in dom.elements if tag == "th"]
    assert headers[: 1 + len(STATISTICS)] == ["metric", *STATISTICS]
    options = [(a["value"], "".join(t).strip()) for tag, a, t in dom.elements if tag == "option"]
    assert options[: len(METRICS)] == list(METRICS.items())  # the chart's metric picker
    ((_, ratio),) = dom.find(id="speedups-ratio")
    assert ratio.startswith(f"{control} / ")


def _check_comparison(dom: _Dom, window: Any, treatment: str) -> None:
    """One treatment's verdicts, speedups and diagnosis, as its comparison says."""
    metrics = comparison_of(window, treatment)["metrics"]
    for metric in METRICS:
        ((attrs, box),) = [
            (a, t)
            for a, t in dom.find(data_metric=metric, data_treatment=treatment)
            if "verdict" in a.get("class", "")
        ]
        assert box.endswith(metrics[metric]["verdict"])
        seq = metrics[metric]["sequential"]
        assert attrs["data-decided-by"] == ", ".join(seq.get("decided_by", []) if seq else [])
        for stat in STATISTICS:
            block = metrics[metric]["speedup"][stat]
            (cell,) = dom.find(data_metric=metric, data_stat=stat, data_treatment=treatment)
            assert cell[0]["data-status"] == block["status"]
            if block["status"] == "ok":
                (est,) = _inside(dom, metric, stat, "estimate", treatment)
                assert _same(est[0]["data-value"], block["estimate"])
                assert est[1] == fmt_ratio(block["estimate"])
                (ci,) = _inside(dom, metric, stat, "ci", treatment)
                assert _same(ci[0]["data-lower"], block["lower"])
                assert _same(ci[0]["data-upper"], block["upper"])
                assert ci[1] == fmt_ci(block)
    summary = comparison_of(window, treatment)["diagnosis"]["summary"]
    ((_, shown),) = dom.find(**{"class": "diagnosis", "data_treatment": treatment})
    assert shown == f"diagnosis: {summary}"


def _check_best(dom: _Dom, window: Any) -> None:
    """The best line says what summary.best_line says; absent with one treatment."""
    ((attrs, _),) = dom.find(id="best")
    line = best_line(window)
    if line is None:
        assert "hidden" in attrs
        return
    assert "hidden" not in attrs and attrs["data-state"] == window["best"]["state"]
    ((_, shown),) = dom.find(**{"class": "best-line"})
    assert shown == line
    ((_, reason),) = dom.find(**{"class": "sub best-reason"})
    assert reason == window["best"]["reason"]


def _check_conditions(dom: _Dom, window: Any) -> None:
    """Each treatment's crossovers and band speedups, value by value and as text."""
    _, treatments = arms_of(window)
    shown_any = False
    for treatment in treatments:
        conditions = conditions_of(window, treatment)
        if not conditions:
            assert not dom.find(**{"class": "segments", "data_treatment": treatment})
            continue
        shown_any = True
        for metric, found in conditions["crossover"].items():
            ((attrs, text),) = [
                (a, t)
                for tag, a, t in dom.elements
                if tag == "li"
                and a.get("data-treatment") == treatment
                and a.get("data-metric") == metric
            ]
            assert "".join(text).strip() == f"{METRICS[metric]} crossover: {crossover_text(found)}"
            assert attrs["data-status"] == found["status"]
            assert _same(attrs["data-load"], found["load"])
        for dim, band, cells in condition_rows(conditions):
            for metric, found_band in cells.items():
                (cell,) = dom.find(
                    data_treatment=treatment, data_dimension=dim, data_band=band, data_metric=metric
                )
                assert cell[0]["data-status"] == found_band["status"]
                estimate, ci = band_text(found_band)
                assert cell[1] == f"{estimate}{ci}", (treatment, dim, band, metric)
                (value,) = _band_spans(dom, treatment, dim, band, metric)
                assert _same(value, found_band["speedup"])
    (section,) = [a for a, _ in dom.find(id="conditions-section")]
    assert ("hidden" in section) == (not shown_any)


def _band_spans(dom: _Dom, treatment: str, dim: str, band: str, metric: str) -> list[str]:
    out: list[str] = []
    inside = False
    for tag, attrs, _ in dom.elements:
        if tag == "td":
            inside = (
                attrs.get("data-treatment") == treatment
                and attrs.get("data-dimension") == dim
                and attrs.get("data-band") == band
                and attrs.get("data-metric") == metric
            )
        elif inside and tag == "span" and attrs.get("class") == "estimate":
            out.append(attrs["data-value"])
    return out


def _check_charts(
    dom: _Dom, history: list[dict[str, Any]], arms: list[str] | tuple[str, ...] = ARMS
) -> None:
    """The SVG charts drew the stored history: a CI band and estimate line, four latency lines."""
    (charts,) = [a for a, _ in dom.find(id="charts")]
    assert int(charts["data-history"]) >= 1
    (speedup,) = [a for a, _ in dom.find(id="speedup-chart")]
    drawn = [p for p in history if p["speedup"]["e2e"]["median"] is not None]
    assert int(speedup["data-points"]) >= 1 and drawn
    assert [float(v) for v in speedup["data-last"].split(",")] in [
        p["speedup"]["e2e"]["median"] for p in drawn
    ]
    series = {a.get("data-series") for a, _ in dom.find(**{"class": "band"})}
    assert series == {"ci"}
    assert dom.find(**{"class": "estimate", "data-series": "estimate"})
    lines = {
        a["data-series"]
        for tag, a, _ in dom.elements
        if tag == "path" and "arm" in a.get("class", "")
    }
    assert lines == {f"{arm} {stat}" for arm in arms for stat in ("median", "p99")}
    assert any("design split" in t for _, t in dom.find(**{"class": "design"}))


def _row_cells(dom: _Dom, arm: str) -> list[tuple[dict[str, str], str]]:
    """The data cells of the per-arm row of `arm` (elements after its <tr> until the next)."""
    out: list[tuple[dict[str, str], str]] = []
    inside = False
    for tag, attrs, text in dom.elements:
        if tag == "tr":
            inside = attrs.get("data-arm") == arm
        elif inside and tag == "td" and "data-field" in attrs:
            out.append((attrs, "".join(text).strip()))
    return out


def _inside(
    dom: _Dom, metric: str, stat: str, cls: str, treatment: str
) -> list[tuple[dict[str, str], str]]:
    out: list[tuple[dict[str, str], str]] = []
    inside = False
    for tag, attrs, text in dom.elements:
        if tag == "td":
            inside = (
                attrs.get("data-metric") == metric
                and attrs.get("data-stat") == stat
                and attrs.get("data-treatment") == treatment
            )
        elif inside and tag == "span" and attrs.get("class") == cls:
            out.append((attrs, "".join(text).strip()))
    return out


async def test_live_page_shows_api_stats(tmp_path: Path) -> None:
    chromium = require_binary("chromium", "chromium-browser", "google-chrome")
    opts = DemoOptions(
        rate=10.0,
        duration_s=40.0,
        port=0,
        store=f"sqlite:///{tmp_path / 'ui.db'}",
        out=str(tmp_path / "report"),
        max_tokens=48,
        stats_interval_s=4.0,
        scrape_interval_s=1.0,
        resamples=300,
        time_scale=0.5,
    )
    started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    run = asyncio.create_task(run_demo(opts, console=Console(quiet=True), started=started))
    url = await asyncio.wait_for(started, 60)
    checked = False
    async with aiohttp.ClientSession() as session:
        for _ in range(60):  # until the stats job has compared enough requests
            if _has_data(await _stats(session, url)):
                break
            await asyncio.sleep(0.5)
        for attempt in range(6):
            before = await _stats(session, url)
            dom_text = await _chromium(
                chromium,
                tmp_path / f"profile-{attempt}",
                "--virtual-time-budget=3000",
                "--dump-dom",
                f"{url}/ui?interval=30",
            )
            after = await _stats(session, url)
            dom = _Dom()
            dom.feed(dom_text)
            (body,) = [a for tag, a, _ in dom.elements if tag == "body"]
            shown_at = body.get("data-computed-at")
            for result in (before, after):
                if result is not None and shown_at == repr(result["computed_at"]):
                    _check(dom, result)
                    async with session.get(url + "/api/stats/history") as resp:
                        _check_charts(dom, await resp.json())
                    checked = True
                    break
            if checked:
                break
        assert checked, "the page never showed a stats result that /api/stats also returned"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "live_page.png"
        await _chromium(
            chromium,
            tmp_path / "profile-shot",
            "--virtual-time-budget=3000",
            "--window-size=1400,1500",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            f"{url}/ui?interval=30",
        )
        assert shot.read_bytes().startswith(b"\x89PNG")
        (ARTIFACTS / "live_page_stats.json").write_text(json.dumps(after, indent=2))
    outcome = await run
    assert outcome.final_stats is not None


async def test_live_page_shows_every_arm_of_a_three_arm_result(
    tmp_path: Path, aiohttp_server: AiohttpServer
) -> None:
    """A/B/n: the page lists the three arms, a comparison per treatment, the best line and each
    treatment's speedups by condition, exactly as /api/stats says them."""
    chromium = require_binary("chromium", "chromium-browser", "google-chrome")
    result = await three_arm_result()
    window = main_window(result)
    assert window is not None and window["treatments"] == list(abn.TREATMENTS)
    assert best_line(window) is not None  # the fixture's run has a best line to show
    assert all(c.get("conditions") for c in window["comparisons"].values())
    store = MemoryStore(StoreConfig(url="memory://"), run_id=abn.RUN)
    await store.start()
    stored = cast(dict[str, Any], result)
    await store.write_stats(run_id=abn.RUN, t=time.time() - 5, result=stored)

    async def stats(request: web.Request) -> web.Response:
        return web.Response(body=to_json(result).encode(), content_type="application/json")

    app = web.Application()
    app[CONFIG] = Config(baseline_url="http://b", speculative_url="http://s", run_id=abn.RUN)
    app[STORE] = store
    app.router.add_get("/api/stats", stats)
    add_ui_routes(app)
    server = await aiohttp_server(app)
    url = str(server.make_url("")).rstrip("/")
    try:
        dom_text = await _chromium(
            chromium,
            tmp_path / "profile",
            "--virtual-time-budget=3000",
            "--dump-dom",
            f"{url}/ui?interval=30",
        )
        dom = _Dom()
        dom.feed(dom_text)
        (body,) = [a for tag, a, _ in dom.elements if tag == "body"]
        assert body.get("data-computed-at") == repr(result["computed_at"])
        _check(dom, result)
        # each treatment's configured labels beside its name, as /api/stats carries them
        shown = [t for tag, a, t in dom.elements if tag == "span" and a.get("class") == "labels"]
        assert shown == [["method=ngram, k=4"], ["method=eagle"]]
        assert result.get("arm_labels") == abn.LABELS
        assert [t for tag, _, t in dom.elements if tag == "h3"][:2] == [
            [f"{t} against {abn.CONTROL}"] for t in abn.TREATMENTS
        ]
        async with (
            aiohttp.ClientSession() as session,
            session.get(url + "/api/stats/history") as resp,
        ):
            _check_charts(dom, await resp.json(), shown_arms(window))
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "live_page_three_arms.png"
        await _chromium(
            chromium,
            tmp_path / "profile-shot",
            "--virtual-time-budget=3000",
            "--window-size=1400,2600",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            f"{url}/ui?interval=30",
        )
        assert shot.read_bytes().startswith(b"\x89PNG")
    finally:
        await store.close()
