"""A realistic three-arm run for the views' tests: records with their conditions (load,
temperature, category) and engine scrapes, stored and compared by the stats pipeline itself.

"base" is the control; "ngram-k4" is fast at low load and slow at high load (its TPOT speedup
crosses 1 near 8 requests in flight), "eagle" a steady 1.25x. `three_arm_result` is what
GET /api/stats would serve for such a run.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from specproxy.config import StatsConfig, StoreConfig, WarmupConfig
from specproxy.records import EngineSample, RequestRecord
from specproxy.stats.job.tick import compute_stats
from specproxy.stats.result import StatsResult
from specproxy.store.contract import Sink, StatsStore
from specproxy.store.memory import MemoryStore

RUN = "abn3"
CONTROL = "base"
TREATMENTS = ("ngram-k4", "eagle")
ARMS = (CONTROL, *TREATMENTS)
# `[arms.NAME] labels`, as the stats job carries them for the views (the control has none)
LABELS = {"ngram-k4": {"method": "ngram", "k": "4"}, "eagle": {"method": "eagle"}}
T0 = 1_700_000_000.0
STEP_S = 0.05
PER_ARM = 1200
WARMUP = WarmupConfig(requests=0)
SETTINGS = StatsConfig(windows_s=(None,), resamples=300)


def _speedup(arm: str, load: int) -> float:
    if arm == "ngram-k4":
        return 1.6 - 0.1 * (load - 1)  # 1.6x alone, 1.0x at 7 in flight, 0.9x at 8
    if arm == "eagle":
        return 1.25
    return 1.0


def records(per_arm: int = PER_ARM, seed: int = 3) -> list[RequestRecord]:
    """Interleaved requests `STEP_S` apart; the load each met cycles 1..12 every 36 requests."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(per_arm * len(ARMS)):
        arm = ARMS[i % len(ARMS)]
        load = 1 + (i // len(ARMS)) % 12
        speedup = _speedup(arm, load)
        output = int(rng.integers(40, 400))
        tpot = float(rng.lognormal(np.log(0.02), 0.2)) / speedup
        ttft = float(rng.lognormal(np.log(0.08), 0.3))
        e2e = ttft + tpot * (output - 1)
        out.append(
            RequestRecord(
                request_id=f"{RUN}-{i}",
                run_id=RUN,
                arm=arm,
                t_start=T0 + i * STEP_S,
                model="tiny-llama",
                endpoint="chat.completions",
                stream=True,
                status=200,
                e2e_s=e2e,
                upstream_s=e2e,
                ttft_s=ttft,
                tpot_s=tpot,
                prompt_tokens=int(rng.integers(20, 900)),
                output_tokens=output,
                endpoint_in_flight=load,
                arm_in_flight=load,
                temperature=0.0 if (i // len(ARMS)) % 3 == 0 else None,
                category="code" if (i // len(ARMS)) % 4 < 2 else "chat",
            )
        )
    return out


def engine_samples(per_arm: int = PER_ARM) -> list[EngineSample]:
    """A scrape of every arm every 5 s: the treatments accept drafts, the control drafts none."""
    out = []
    span = per_arm * len(ARMS) * STEP_S
    for j in range(int(span // 5) + 1):
        for arm in ARMS:
            spec = arm != CONTROL
            out.append(
                EngineSample(
                    t=T0 + j * 5.0,
                    run_id=RUN,
                    arm=arm,
                    up=True,
                    acceptance_rate=(0.7 if arm == "eagle" else 0.55) if spec else None,
                    mean_acceptance_length=(3.1 if arm == "eagle" else 2.4) if spec else None,
                    requests_running=float(j % 6),
                )
            )
    return out


def fill(store: Sink) -> None:
    """Record the run's requests and scrapes (the caller flushes)."""
    for rec in records():
        store.record(rec)
    for sample in engine_samples():
        store.record_engine(sample)


async def store_stats(
    store: StatsStore, stats_cfg: StatsConfig = SETTINGS, warmup: WarmupConfig = WARMUP
) -> StatsResult:
    """The stats job's result for the run `store` holds, stored in its history as the live
    job stores it (what a proxy configured with these `[arms.NAME]` leaves)."""
    result = await compute_stats(
        store,
        run_id=RUN,
        stats_cfg=stats_cfg,
        warmup=warmup,
        control=CONTROL,
        treatments=TREATMENTS,
        labels=LABELS,
    )
    stored = cast(dict[str, Any], result)
    await store.write_stats(run_id=RUN, t=result["computed_at"], result=stored)
    return result


async def three_arm_result() -> StatsResult:
    """The stats job's result for the run, as GET /api/stats serves it (a JSON round trip)."""
    import json

    store = MemoryStore(StoreConfig(url="memory://"), run_id=RUN)
    await store.start()
    try:
        fill(store)
        await store.flush()
        result = await compute_stats(
            store,
            run_id=RUN,
            stats_cfg=SETTINGS,
            warmup=WARMUP,
            control=CONTROL,
            treatments=TREATMENTS,
            labels=LABELS,
        )
    finally:
        await store.close()
    return cast(StatsResult, json.loads(json.dumps(cast(dict[str, Any], result))))
