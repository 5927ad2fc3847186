"""Per-arm summaries and the harness's own overhead (`bench.summary`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from specproxy.bench.summary import harness_overhead, summarise
from specproxy.errors import ErrorKind
from specproxy.loadgen import ClientResult
from specproxy.records import SHORTHAND_CONTROL, SHORTHAND_TREATMENT, Arm
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
    results = [_result(SHORTHAND_CONTROL, ms) for ms in (100, 200, 300)]
    results += [_result(SHORTHAND_TREATMENT, ms) for ms in (50, 60)]
    results.append(_result(SHORTHAND_TREATMENT, 1, ok=False))
    spec, base = summarise(results, order=("speculative", "baseline"))
    assert [s.arm for s in summarise(results)] == ["baseline", "speculative"]  # else by name
    assert spec.arm == SHORTHAND_TREATMENT and spec.n == 2 and spec.errors == 1
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
    results = [_result(SHORTHAND_TREATMENT, float(v)) for v in rng.lognormal(np.log(50), 0.2, 400)]
    results += [_result(SHORTHAND_CONTROL, float(v)) for v in rng.lognormal(np.log(100), 0.2, 400)]
    ci = speedups(results, control="baseline", treatment="speculative", resamples=400)["e2e"]
    median, p99 = ci["median"], ci["p99"]
    assert median["status"] == "ok" and median["lower"] < 2.0 < median["upper"]
    assert median["lower"] <= median["estimate"] <= median["upper"]
    assert p99["status"] == "ok"  # 400 >= 368 per arm: a 95% P99 CI exists
    few = speedups(
        results[:100] + results[400:500], control="baseline", treatment="speculative", resamples=200
    )["e2e"]
    assert few["median"]["status"] == "ok"
    assert few["p99"] == {
        "status": "insufficient",
        "n_needed": {"baseline": 268, "speculative": 268},
    }


def test_speedups_need_both_arms() -> None:
    from specproxy.bench.summary import speedups

    assert (
        speedups(
            [_result(SHORTHAND_TREATMENT, 10.0)] * 5, control="baseline", treatment="speculative"
        )
        == {}
    )


def test_summary_totals_tokens_for_throughput() -> None:
    (spec,) = summarise([_result("speculative", 10.0), _result("speculative", 12.0)])
    assert spec.output_tokens == 18  # 9 completion tokens each


def test_goodput_takes_vllms_syntax() -> None:
    from specproxy.bench.summary import parse_goodput
    from specproxy.errors import ConfigError

    assert parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    assert parse_goodput(["ttft:500,tpot:50,e2el:2000"]) == {
        "ttft": 500.0,
        "tpot": 50.0,
        "e2el": 2000.0,
    }
    for bad in (["itl:5"], ["ttft"], ["ttft:-1"], ["ttft:abc"], ["ttft:nan"]):
        with pytest.raises(ConfigError, match="KEY:MS"):
            parse_goodput(bad)


def test_a_good_request_meets_every_slo_and_the_summary_counts_them() -> None:
    """vLLM's rule: good when TTFT, TPOT and E2E are each within their SLO (seconds here);
    the helper's requests have TTFT = e2e/10 and TPOT = 0.9 * e2e / 8."""
    from specproxy.bench.summary import is_good

    fast, slow = _result(SHORTHAND_TREATMENT, 100.0), _result(SHORTHAND_TREATMENT, 400.0)
    assert is_good(fast, {"ttft": 0.02, "e2el": 0.1})
    assert not is_good(slow, {"ttft": 0.02})  # TTFT 40 ms
    assert not is_good(slow, {"tpot": 0.04})  # TPOT 45 ms
    assert is_good(slow, {"tpot": 0.05, "e2el": 0.4})
    assert not is_good(_result(SHORTHAND_TREATMENT, 1.0, ok=False), {"e2el": 1.0})  # failed
    (spec,) = summarise([fast, slow], goodput={"e2el": 0.2})
    assert spec.good == 1
    (none,) = summarise([fast, slow])
    assert none.good is None  # no SLO, no goodput


def test_summary_counts_requests_per_category() -> None:
    from dataclasses import replace

    results = [
        replace(_result(SHORTHAND_CONTROL, 10.0), category=c) for c in ("math", "code", "math")
    ]
    results.append(replace(_result(SHORTHAND_CONTROL, 10.0, ok=False), category="code"))  # failed
    results.append(_result(SHORTHAND_CONTROL, 10.0))  # unlabelled
    (base,) = summarise(results)
    assert base.categories == {"code": 1, "math": 2}
    assert base.n == 4
