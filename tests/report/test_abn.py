"""The report of a three-arm run (A/B/n): every arm, a comparison per treatment, the best line
and each treatment's speedups by condition, in the numbers GET /api/stats and /ui show."""

from __future__ import annotations

import asyncio
import html as html_lib
import json
import re
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from specproxy.cli import main
from specproxy.config import StoreConfig
from specproxy.report.build import write_report
from specproxy.report.summary import (
    METRICS,
    STATISTICS,
    arm_figures,
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
from specproxy.stats.result import StatsResult, WindowResult
from specproxy.store.factory import open_store
from tests.report import abn


async def _report(tmp_path: Path) -> tuple[StatsResult, str, dict[str, Any]]:
    """Store the run and the stats job's result for it, then write its report."""
    url = f"sqlite:///{tmp_path / 'abn.db'}"
    store = open_store(StoreConfig(url=url))
    await store.start()
    try:
        abn.fill(store)
        await store.flush()
        result = await abn.store_stats(store)
    finally:
        await store.close()
    out = tmp_path / "report"
    written = await write_report(
        url, run_id=abn.RUN, out_dir=out, settings=abn.SETTINGS, warmup=abn.WARMUP
    )
    assert written == out
    report = json.loads((out / "report.json").read_text())
    return result, (out / "index.html").read_text(encoding="utf-8"), report


def _cell(page: str, attrs: str) -> str:
    """The text of the one <td> with exactly these attributes, tags dropped."""
    (inner,) = re.findall(rf"<td {re.escape(attrs)}>(.*?)</td>", page)
    return html_lib.unescape(re.sub(r"<[^>]+>", "", inner))


@pytest.fixture(name="made")
async def _made(tmp_path: Path) -> tuple[WindowResult, str, dict[str, Any]]:
    result, page, report = await _report(tmp_path)
    window = main_window(result)
    assert window is not None
    # the job's own result is reported verbatim (its n per arm match the records of all arms)
    assert report["stats"] == json.loads(json.dumps(result))
    return window, page, report


async def test_every_arm_and_every_comparison_is_reported(
    made: tuple[WindowResult, str, dict[str, Any]],
) -> None:
    window, page, report = made
    arms = shown_arms(window)
    assert arms == [*abn.TREATMENTS, abn.CONTROL]
    assert re.findall(r"<tr data-arm='([^']+)'>", page) == arms
    for arm in arms:
        f = arm_figures(window, arm)
        (row,) = re.findall(rf"<tr data-arm='{re.escape(arm)}'>(.*?)</tr>", page)
        cells = [html_lib.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)]
        rate, length = f["acceptance_rate"], f["mean_acceptance_length"]
        labels = ", ".join(f"{k}={v}" for k, v in abn.LABELS.get(arm, {}).items())
        # the configured labels beside the name ("method=ngram, k=4"), none for the control
        assert cells[0] == (f"{arm} <span class='labels'>{labels}</span>" if labels else arm)
        assert cells[1:] == [
            str(f["n"]),
            fmt_ms(f["e2e_median"]),
            fmt_ms(f["e2e_p90"]),
            fmt_ms(f["e2e_p99"]),
            fmt_ms(f["ttft_median"]),
            fmt_ms(f["tpot_median"]),
            f"{rate:.1%}" if rate is not None else "-",
            f"{length:.2f}" if length is not None else "-",
        ]
        # the figures are drawn from the same requests the comparisons used
        assert report["figure_data"]["latency"]["e2e"][arm]["n"] == f["n"] == abn.PER_ARM
    assert f"{abn.CONTROL}: {abn.PER_ARM}" in page  # methodology: n per arm, every arm
    headings = re.findall(r"<h3 data-treatment='([^']+)'>([^<]*)</h3>", page)
    for treatment in abn.TREATMENTS:
        assert (treatment, f"{treatment} against {abn.CONTROL}") in headings
        comparison = comparison_of(window, treatment)
        for metric in METRICS:
            block = comparison["metrics"][metric]
            verdict = block["verdict"]
            assert (
                f"data-metric='{metric}' data-treatment='{treatment}'>"
                f"{METRICS[metric]}<b>{verdict}</b>"
            ) in page
            for stat in STATISTICS:
                s = block["speedup"][stat]
                text = _cell(
                    page, f"data-metric='{metric}' data-stat='{stat}' data-treatment='{treatment}'"
                )
                if s["status"] == "ok":
                    assert text == f"{fmt_ratio(s['estimate'])} {fmt_ci(s)}"
                else:
                    assert text.startswith("needs ")
        summary = comparison["diagnosis"]["summary"]
        assert html_lib.escape(f"diagnosis: {summary}", quote=True) in page
    # the two comparisons differ: ngram-k4 and eagle are not the same arm
    e2e = [comparison_of(window, t)["metrics"]["e2e"]["speedup"]["median"] for t in abn.TREATMENTS]
    assert e2e[0]["estimate"] != e2e[1]["estimate"]


async def test_the_best_line_and_the_multiplicity_are_reported(
    made: tuple[WindowResult, str, dict[str, Any]],
) -> None:
    window, page, _ = made
    best = window["best"]
    line = best_line(window)
    assert line is not None and best["leader"] == "eagle"  # the steady 1.25x leads overall
    (shown,) = re.findall(r"<p id='best' data-state='([^']+)'><b>([^<]*)</b>", page)
    assert shown == (best["state"], html_lib.escape(line, quote=True))
    assert html_lib.escape(best["reason"], quote=True) in page
    margin = best["margin"]
    assert margin is not None and fmt_ci(margin) in line
    assert "alpha / 2 = 0.025 (Bonferroni)" in page


async def test_each_treatments_conditions_are_reported(
    made: tuple[WindowResult, str, dict[str, Any]],
) -> None:
    window, page, _ = made
    assert "<h2>By condition</h2>" in page
    statuses = {}
    for treatment in abn.TREATMENTS:
        conditions = conditions_of(window, treatment)
        assert conditions is not None
        (crossovers,) = re.findall(
            rf"<ul class='crossover' data-treatment='{re.escape(treatment)}'>(.*?)</ul>",
            page,
            flags=re.S,
        )
        for metric, found in conditions["crossover"].items():
            text = f"{METRICS[metric]} crossover: {crossover_text(found)}"
            assert html_lib.escape(text, quote=True) in crossovers
        statuses[treatment] = conditions["crossover"]["tpot"]["status"]
        (table,) = re.findall(
            rf"<table class='segments' data-treatment='{re.escape(treatment)}'>(.*?)</table>",
            page,
            flags=re.S,
        )
        rows = condition_rows(conditions)
        assert rows and len(re.findall(r"<tr><td>", table)) == len(rows)
        for dim, band, cells in rows:
            for metric, found_band in cells.items():
                estimate, ci = band_text(found_band)
                attrs = (
                    f"data-dimension='{html_lib.escape(dim, quote=True)}' "
                    f"data-band='{html_lib.escape(band, quote=True)}' data-metric='{metric}'"
                )
                assert _cell(table, attrs) == f"{estimate} {ci}"
    # the run's truth: ngram-k4 crosses 1 with load, eagle helps throughout
    assert statuses == {"ngram-k4": "ok", "eagle": "helps_throughout"}
    ngram = conditions_of(window, "ngram-k4")
    assert ngram is not None
    load = ngram["crossover"]["tpot"]["load"]
    assert load is not None and 5.0 < load < 9.0
    low = ngram["segments"]["load"]["tpot"][0]
    assert low["band"] == "1" and low["speedup"] is not None
    assert low["speedup"] == pytest.approx(1.6, rel=0.1)
    assert np.isfinite(low["speedup"])


async def test_a_named_arm_run_without_a_stored_result_is_reported_against_its_control(
    tmp_path: Path,
) -> None:
    """A bench or ingest run (records, no stats history) with named arms: the report computes
    the comparisons itself, against `--control`; without it, it says which arms it found."""
    from specproxy.errors import ConfigError

    url = f"sqlite:///{tmp_path / 'bench.db'}"
    store = open_store(StoreConfig(url=url))
    await store.start()
    try:
        for rec in abn.records(per_arm=200):
            store.record(rec)
        await store.flush()
    finally:
        await store.close()
    out = tmp_path / "report"
    with pytest.raises(ConfigError, match="the run's arms are base, eagle, ngram-k4"):
        await write_report(url, run_id=abn.RUN, out_dir=out, warmup=abn.WARMUP)
    flags = ["--store", url, "--out", str(out), "--run-id", abn.RUN, "--warmup-requests", "0"]
    # `specproxy report --control base`, run where the command runs (its own event loop)
    assert await asyncio.to_thread(main, ["report", *flags, "--control", "base"]) == 0
    report = json.loads((out / "report.json").read_text())
    window = main_window(cast(StatsResult, report["stats"]))
    assert window is not None
    assert (window["control"], window["treatments"]) == ("base", ["eagle", "ngram-k4"])
    page = (out / "index.html").read_text(encoding="utf-8")
    assert re.findall(r"<tr data-arm='([^']+)'>", page) == ["eagle", "ngram-k4", "base"]
