"""Per-arm summaries and the harness's own overhead (`bench.summary`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from specproxy.bench.summary import harness_overhead, summarise
from specproxy.errors import ErrorKind
from specproxy.loadgen import ClientResult
from specproxy.records import Arm
from specproxy.timing import RequestTimings, derive


@dataclass(frozen=True)
class _Events:
    """A stream of 4 content events and 9 tokens, as a scanner would report it."""

    first_content_at: float
    n_events: int = 4
    gaps: tuple[float, ...] = ()
    token_ids: int = 0
    token_ids_complete: bool = False
    usage: dict[str, Any] | None = field(default_factory=lambda: {"completion_tokens": 9})
    speculative: dict[str, Any] | None = None


def _result(arm: Arm, e2e_ms: float, *, ok: bool = True) -> ClientResult:
    return ClientResult(
        index=0,
        arm=arm,
        t_start=0.0,
        temperature=0.0,
        measures=derive(
            RequestTimings(
                request_start=0.0,
                upstream_start=0.0,
                request_end=e2e_ms / 1e3,
                status=200 if ok else 500,
                error_kind=None if ok else ErrorKind.HTTP_5XX,
                events=_Events(first_content_at=e2e_ms / 1e4),
            )
        ),
        parse_ns=10_000,
    )


def test_summary_per_arm() -> None:
    results = [_result("baseline", ms) for ms in (100, 200, 300)]
    results += [_result("speculative", ms) for ms in (50, 60)]
    results.append(_result("speculative", 1, ok=False))
    spec, base = summarise(results)
    assert spec.arm == "speculative" and spec.n == 2 and spec.errors == 1
    assert base.e2e_p50_s == pytest.approx(0.2)
    assert base.tpot_p50_s == pytest.approx(0.2 * 0.9 / 8)
    assert spec.tokens_per_event == pytest.approx(9 / 4)
    overhead = harness_overhead(results)
    assert overhead is not None
    assert overhead.parse_p50_s == pytest.approx(1e-5)
    assert overhead.parse_share == pytest.approx(1e-5 / 0.1)


def test_speedups_carry_cis_and_never_a_p99_without_its_samples() -> None:
    import numpy as np

    from specproxy.bench.summary import speedups

    rng = np.random.default_rng(1)
    results = [_result("speculative", float(v)) for v in rng.lognormal(np.log(50), 0.2, 400)]
    results += [_result("baseline", float(v)) for v in rng.lognormal(np.log(100), 0.2, 400)]
    ci = speedups(results, resamples=400)["e2e"]
    median, p99 = ci["median"], ci["p99"]
    assert median["status"] == "ok" and median["lower"] < 2.0 < median["upper"]
    assert median["lower"] <= median["estimate"] <= median["upper"]
    assert p99["status"] == "ok"  # 400 >= 368 per arm: a 95% P99 CI exists
    few = speedups(results[:100] + results[400:500], resamples=200)["e2e"]
    assert few["median"]["status"] == "ok"
    assert few["p99"] == {
        "status": "insufficient",
        "n_needed": {"baseline": 268, "speculative": 268},
    }


def test_speedups_need_both_arms() -> None:
    from specproxy.bench.summary import speedups

    assert speedups([_result("speculative", 10.0)] * 5) == {}


def test_summary_totals_tokens_for_throughput() -> None:
    (spec,) = summarise([_result("speculative", 10.0), _result("speculative", 12.0)])
    assert spec.output_tokens == 18  # 9 completion tokens each
