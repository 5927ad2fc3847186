"""The guarded ramp wired into the stats leader: with `[ramp] enabled` a config's StatsJob runs the
ramp each interval it computes, starts each ramped treatment, steps a healthy one up and cuts a
slower one to 0 through guard arm events; a follower never ramps, and a ramp failure never stops
the ticks. Time is a virtual clock."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from specproxy.config import Config, StoreConfig
from specproxy.records import Arm
from specproxy.stats.collector import register_stats_collector
from specproxy.stats.job.ramp import DEFAULT_HORIZON_S, HORIZON_MAX_S, horizon_s
from specproxy.stats.job.runner import StatsJob
from specproxy.stats.job.settings import ramp_of
from specproxy.stats.result import StatsResult
from specproxy.store.memory import MemoryStore
from tests.store.conftest import make_record

T0 = 1_700_000_000.0
DEAD = "http://127.0.0.1:9"


def _config(**ramp: object) -> Config:
    return Config.from_mapping(
        {
            "arms": {
                "base": {"role": "control", "urls": [DEAD]},
                "good": {"urls": [DEAD], "weight": 0.5},
                "slow": {"urls": [DEAD], "weight": 0.5},
            },
            "ramp": {"enabled": True, "min_samples": 50, "min_minutes": 1, **ramp},
        }
    )


@pytest.fixture
async def store(tmp_path: Path) -> MemoryStore:
    st = MemoryStore(StoreConfig(url="memory://", spill_path=str(tmp_path / "spill.jsonl")))
    await st.start()
    return st


def _job(store: MemoryStore, cfg: Config, now: list[float], **kw: object) -> StatsJob:
    return StatsJob(
        store,
        run_id="run",
        stats_cfg=cfg.stats,
        warmup=cfg.warmup,
        clock=lambda: now[0],
        control=cfg.control_arm,
        treatments=cfg.treatment_arms,
        **ramp_of(cfg),
        **kw,  # type: ignore[arg-type]
    )


async def _traffic(store: MemoryStore, start: float, n: int) -> None:
    """Three arms in turn; "slow" takes twice the control's time, "good" the same."""
    rng = np.random.default_rng(int(start))
    factor = {"base": 1.0, "good": 1.0, "slow": 2.0}
    arms = ("base", "good", "slow")
    for i in range(n):
        arm = arms[i % 3]
        e2e = float(rng.lognormal(0.0, 0.3)) * factor[arm]
        rid = int(start) * 10_000 + i
        store.record(make_record(rid, arm=Arm(arm), t_start=start + i * 0.02, e2e_s=e2e))
    await store.flush()


def test_ramp_of_is_empty_when_off_and_names_every_treatment_when_on() -> None:
    assert ramp_of(_config(enabled=False)) == {}
    assert ramp_of(None) == {}
    assert ramp_of(_config())["ramp_weights"] == {"good": 0.5, "slow": 0.5}
    assert ramp_of(_config(arms=["slow"]))["ramp_weights"] == {"slow": 0.5}


def test_the_guards_keep_minutes_open_as_long_as_the_compared_arms_requests_can_last() -> None:
    # the default timeouts: connect 5 s + the 1 h stream cap
    assert ramp_of(_config())["ramp_horizon_s"] == DEFAULT_HORIZON_S == 3605.0
    cfg = Config.from_mapping(
        {
            "timeouts": {"stream_total_s": 600.0, "total_s": 300.0},
            "arms": {
                "base": {"role": "control", "urls": [DEAD]},
                "good": {"urls": [DEAD], "weight": 0.5, "timeouts": {"total_s": 900.0}},
                "slow": {"urls": [DEAD], "weight": 0.5, "timeouts": {"stream_total_s": 5e4}},
            },
            "ramp": {"enabled": True, "arms": ["good"]},
        }
    )
    assert ramp_of(cfg)["ramp_horizon_s"] == 905.0  # the ramped arm's, not the other's
    slow = Config.from_mapping({**cfg.to_mapping(), "ramp": {"enabled": True, "arms": ["slow"]}})
    assert ramp_of(slow)["ramp_horizon_s"] == HORIZON_MAX_S  # capped
    assert horizon_s([None, 100.0]) == HORIZON_MAX_S  # streams without a cap


async def test_the_leader_steps_a_healthy_treatment_up_and_cuts_a_slower_one(
    store: MemoryStore,
) -> None:
    cfg = _config()
    registry = CollectorRegistry()
    now = [T0 + 1.0]
    job = _job(store, cfg, now, registry=registry)
    await _traffic(store, T0, 60)
    assert await job.step() is not None  # a tick, then the ramp: both treatments start
    started = await store.arm_events(run_id="run")
    assert {(e.arm, e.weight, e.who) for e in started} == {
        ("good", 0.01, "guard"),
        ("slow", 0.01, "guard"),
    }
    assert registry.get_sample_value("specproxy_ramp_step", {"arm": "good"}) == 1.0
    t = max(e.t for e in started)
    now[0] = t + 180.0
    await _traffic(store, t + 1.0, 6000)
    await job.step()
    last = {e.arm: e for e in await store.arm_events(run_id="run")}
    assert (last["good"].weight, last["good"].who) == (0.05, "guard"), last["good"].why
    assert (last["slow"].weight, last["slow"].who) == (0.0, "guard")
    assert last["slow"].why.startswith("cut: ") and "E2E" in last["slow"].why
    ramp = job.ramp()
    assert ramp is not None and ramp.last["slow"].move == "cut"
    assert registry.get_sample_value("specproxy_ramp_step", {"arm": "slow"}) == 0.0
    # the stored result carries the ramp, so a replica that only reads the store exports it
    stored = await store.latest_stats(run_id="run")
    assert stored is not None
    ramp_state = stored[1]["ramp"]
    assert ramp_state["slow"]["step"] == 0 and ramp_state["slow"]["last_move"] == "cut"
    assert ramp_state["good"] == {
        "step": 2,
        "moves": {"start": 1, "step": 1},
        "dry_run": False,
        "last_move": "step",
        "last_why": ramp.last["good"].why,
        "behind_s": 0.0,  # its guards have read every request that landed
        "late": 0,
    }
    replica = CollectorRegistry()
    register_stats_collector(replica, lambda: cast(StatsResult, stored[1]))
    cut = {"arm": "slow", "move": "cut", "dry_run": "false"}
    assert replica.get_sample_value("specproxy_ramp_decisions_total", cut) == 1.0
    assert replica.get_sample_value("specproxy_ramp_step", {"arm": "good"}) == 2.0


class _NotLeader:
    async def is_leader(self) -> bool:
        return False

    async def close(self) -> None:
        return None


async def test_a_follower_never_ramps_and_an_off_ramp_is_none(store: MemoryStore) -> None:
    now = [T0 + 1.0]
    await _traffic(store, T0, 60)
    assert await _job(store, _config(), now, leadership=_NotLeader()).step() is None
    assert await store.arm_events(run_id="run") == []
    assert _job(store, _config(enabled=False), now).ramp() is None


async def test_a_failing_ramp_is_logged_and_the_tick_still_counts(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    now = [T0 + 1.0]
    job = _job(store, _config(), now)
    ramp = job.ramp()
    assert ramp is not None

    async def broken() -> list[object]:
        raise RuntimeError("boom")

    monkeypatch.setattr(ramp, "move", broken)
    await _traffic(store, T0, 60)
    assert await job.step() is not None
    assert job.latest() is not None
    assert "the guarded ramp failed" in caplog.text
