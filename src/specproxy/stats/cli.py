"""`specproxy stats`: compute the comparison once from a store and print it, or, with
`--follow`, keep computing it (the process beside the proxies: `stats.job.process`).

Settings (`stats.job.settings`): `--config` reads the same TOML as `specproxy serve` and the
`SPECPROXY_*` variables apply as there. Once, by default, the settings stored with the run's
latest result win over the config's (`--settings config` keeps the config's), so the analysis
reproduces what the proxy said live; flags win over both. `--follow` computes with the config's
settings, as the proxy's own stats process does.

The arms (A/B/n): `--control NAME` (every other arm of the run a treatment), else the config's
arms, else (once) those the run's latest stored result compared, else the two-arm shorthand's
control `baseline`. A run whose arms are named, without any of these, is refused with its arms
listed, rather than compared with an arm that has no data.

The text report gives, per model and window, the design, the sample sizes, each metric's verdict
and speedup CIs, and the diagnosis; `--json` prints the full result (schema in `stats.result`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import logging
import os
from typing import Any, cast

from specproxy.config import StatsConfig, StoreConfig, WarmupConfig
from specproxy.errors import ConfigError
from specproxy.records import arm_name
from specproxy.report.summary import arms_of, best_line
from specproxy.stats.job.follower import StatsHistory
from specproxy.stats.job.settings import (
    StatsSettings,
    arm_roles,
    child_settings,
    command_settings,
)
from specproxy.stats.result import (
    P99Verdict,
    StatsResult,
    TwoSampleP99,
    WindowComparison,
    comparisons_of,
    run_arms,
    to_json,
)

__all__ = ["configure", "run"]

log = logging.getLogger(__name__)

# flag destination -> [stats] setting it overrides
_STATS_FLAGS = {
    "resamples": "resamples",
    "seed": "seed",
    "alpha": "alpha",
    "confidence": "confidence",
    "p99_tolerance": "p99_tolerance",
}
# flag destination -> [warmup] setting it overrides
_WARMUP_FLAGS = {"warmup_requests": "requests"}


def configure(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--config", metavar="FILE.toml", help="the proxy's TOML config (store, run, [stats])")
    add(
        "--store",
        metavar="URL",
        help="store URL (sqlite:///, postgresql://) "
        f"(default: the config's, else {StoreConfig().url})",
    )
    add(
        "--run-id", help="run to analyse (default: the config's, else the only run, else 'default')"
    )
    add(
        "--control",
        type=arm_name,
        metavar="NAME",
        help="the control arm, every other arm of the run a treatment (default: the config's"
        " arms, else those of the run's latest stored result, else 'baseline')",
    )
    add("--json", action="store_true", help="print the full JSON result")
    add(
        "--settings",
        choices=("stored", "config"),
        default="stored",
        help="once: the settings stored with the run's latest result over the config's, or the "
        "config's alone",
    )
    add(
        "--follow",
        action="store_true",
        help="keep computing every stats.interval_s while this "
        "process leads the run, storing each result (until SIGTERM)",
    )
    add("--resamples", type=int, help="bootstrap resamples")
    add("--seed", type=int, help="bootstrap seed")
    add("--alpha", type=float, help="error rate of the anytime-valid tests")
    add("--confidence", type=float, help="confidence level of the intervals")
    add("--p99-tolerance", type=float, help="slower means spec P99 > baseline P99 x (1 + this)")
    add("--warmup-requests", type=int, help="first requests per arm left out")
    # serve's own stats process (stats.job.supervisor): never given by hand
    add("--child-of", type=int, metavar="PID", help=argparse.SUPPRESS)
    add("--status-fd", type=int, metavar="FD", help=argparse.SUPPRESS)


def _with_flags(
    args: argparse.Namespace, stats: StatsConfig, warmup: WarmupConfig
) -> tuple[StatsConfig, WarmupConfig]:
    """`stats` and `warmup` with the flags given (validated as the config is)."""

    def given(flags: dict[str, str]) -> dict[str, Any]:
        return {name: getattr(args, d) for d, name in flags.items() if getattr(args, d) is not None}

    return (
        dataclasses.replace(stats, **given(_STATS_FLAGS)),
        dataclasses.replace(warmup, **given(_WARMUP_FLAGS)),
    )


def _flagged(args: argparse.Namespace, settings: StatsSettings) -> StatsSettings:
    stats, warmup = _with_flags(args, settings.stats, settings.warmup)
    control = args.control if args.control is not None else settings.control
    return dataclasses.replace(settings, stats=stats, warmup=warmup, control=control)


def _p99_line(p99: P99Verdict) -> str:
    """The P99 verdict, which test decided, and each direction's log e-value vs its boundary
    (the design's e-process: per-minute exceedance on split traffic, two-sample on pairs)."""
    by = " + ".join(p99["decided_by"]) or "no test"

    def sides(tests: tuple[TwoSampleP99, TwoSampleP99]) -> str:
        out = []
        for side, test in zip(("slower", "faster"), tests, strict=True):
            stat = test["statistic"]
            shown = "n/a" if stat is None else f"{stat:.2f}"
            out.append(f"{side} log e {shown} / {test['boundary']:.2f}")
        return ", ".join(out)

    ran = "exceedance" in p99.get("tests", [])
    if ran and "exceedance_slower" in p99 and "exceedance_faster" in p99:
        pair = (p99["exceedance_slower"], p99["exceedance_faster"])
        return f"P99 {p99['verdict']} ({by}); per-minute exceedance " + sides(pair)
    line = f"P99 {p99['verdict']} ({by}); two-sample " + sides((p99["slower"], p99["faster"]))
    return line


def _text_report(result: StatsResult) -> str:
    """Per model and window, each treatment's comparison with the control (two arms: one, as
    before); with several treatments, the multiplicity and the best-configuration line."""
    lines = [f"run {result['run_id']}: windows end at {_utc(result['window_end'])}"]
    for model, windows in result["results"].items():
        for window, res in windows.items():
            control, _ = arms_of(res)
            each = comparisons_of(res)
            for treatment, comparison in each.items():
                lines.extend(
                    _comparison_lines(f"{model} / {window}", control, treatment, comparison)
                )
            if len(each) > 1:
                many = res.get("multiplicity")
                if many is not None:
                    lines.append(
                        f"  {many['treatments']} treatments against {control}: each verdict at"
                        f" alpha {many['alpha_per_comparison']:.3g} ({many['method']}, family"
                        f" alpha {many['alpha']:.3g})"
                    )
                said = best_line(res)
                if said is not None:
                    lines.append(f"  {said}")
    return "\n".join(lines)


def _comparison_lines(where: str, control: str, treatment: str, res: WindowComparison) -> list[str]:
    n = res["samples"]
    lines = [
        f"\n[{where}] {res['design']}: {control} n={n.get(control, 0)}, "
        f"{treatment} n={n.get(treatment, 0)}"
    ]
    for metric, block in res["metrics"].items():
        cells = []
        for stat, ci in block["speedup"].items():
            estimate, lower, upper = ci["estimate"], ci["lower"], ci["upper"]
            if ci["status"] != "ok" or estimate is None or lower is None or upper is None:
                cells.append(f"{stat} insufficient")
            else:
                cells.append(f"{stat} {estimate:.3f} [{lower:.3f}, {upper:.3f}]")
        lines.append(f"  {metric:<5} {block['verdict']:<12} " + "; ".join(cells))
        seq = block["sequential"]
        if seq is not None and "p99" in seq:
            lines.append(f"        {_p99_line(seq['p99'])}")
    lines.append(f"  diagnosis: {res['diagnosis']['summary']}")
    lines.extend(f"    - {r['message']}" for r in res["diagnosis"]["reasons"])
    return lines


def _utc(t: float) -> str:
    """A Unix time as UTC ISO-8601 to the second (`2026-12-04T13:15:00Z`)."""
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _latest_stored(store: StatsHistory, run_id: str) -> dict[str, Any] | None:
    newest = await store.latest_stats(run_id=run_id)
    return None if newest is None else newest[1]


async def _run_once(args: argparse.Namespace, settings: StatsSettings) -> StatsResult:
    from specproxy.stats.job.runner import compute_stats
    from specproxy.stats.job.tick import configs_of
    from specproxy.store.factory import open_store
    from specproxy.store.sqlite import require_existing_store

    require_existing_store(settings.store.url)
    store = open_store(settings.store)
    await store.start(read_only=True)
    try:
        run_id = settings.run_id
        runs = await store.run_ids()
        if run_id is None:
            run_id = runs[0] if len(runs) == 1 else "default"
        elif run_id not in runs:
            held = f"its runs: {', '.join(runs)}" if runs else "it holds no runs"
            raise ConfigError(f"no run {run_id!r} in {settings.store.url}; {held}")
        stats_cfg, warmup = settings.stats, settings.warmup
        latest = await _latest_stored(store, run_id)
        stored = latest if args.settings == "stored" else None
        if stored is not None:
            stats_cfg, warmup = _with_flags(args, *configs_of(stored, stats_cfg, warmup))
            at = datetime.datetime.fromtimestamp(float(stored["computed_at"]), datetime.UTC)
            log.info(
                "stats: the settings of the run's result stored at %s (p99_tolerance %g, "
                "alpha %g, resamples %d); --settings config for the config's",
                at.isoformat(timespec="seconds"),
                stats_cfg.p99_tolerance,
                stats_cfg.alpha,
                stats_cfg.resamples,
            )
        arms = arm_roles(settings)
        compared = run_arms(cast(StatsResult | None, latest))
        if not arms and compared is not None:  # the arms the live job compared (A/B/n)
            arms = {"control": compared[0], "treatments": compared[1]}
            arms["labels"] = (latest or {}).get("arm_labels") or {}
        return await compute_stats(store, run_id=run_id, stats_cfg=stats_cfg, warmup=warmup, **arms)
    finally:
        await store.close()


def _follow(args: argparse.Namespace) -> int:
    if args.child_of is not None:
        from specproxy.children import die_with_parent
        from specproxy.stats.job.supervisor import NICENESS

        die_with_parent(args.child_of)  # first: it must not outlive serve, even a SIGKILLed one
        os.nice(NICENESS)
        settings = child_settings()
    else:
        settings = command_settings(args.config, store_url=args.store, run_id=args.run_id)
    settings = _flagged(args, settings)
    if settings.store.url.startswith("memory:"):
        raise ConfigError("--follow needs a shared store: a memory:// store lives in one process")
    from specproxy.stats.job.process import run_follow  # numpy, scipy: after die_with_parent

    return run_follow(settings, status_fd=args.status_fd)


def run(args: argparse.Namespace) -> int:
    if args.follow:
        return _follow(args)
    settings = command_settings(args.config, store_url=args.store, run_id=args.run_id)
    settings = _flagged(args, settings)  # validated before any I/O
    result = asyncio.run(_run_once(args, settings))
    print(to_json(result, indent=2) if args.json else _text_report(result))
    return 0
