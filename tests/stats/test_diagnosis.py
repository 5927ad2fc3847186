from __future__ import annotations

import dataclasses
import math

import pytest

from specproxy.records import Arm, EngineSample, GpuSample
from specproxy.stats.diagnosis import (
    DEFAULT_DRAFT_COST,
    DiagnosisInput,
    EngineSummary,
    GpuSummary,
    LatencyGrowth,
    MetricVerdict,
    diagnose,
    draft_step_share,
    implied_draft_cost,
    per_token_acceptance,
    summarise_arms,
    summarise_engine,
    summarise_gpu,
    tokens_per_step,
)


def _input(speedup: float, lo: float, hi: float, **spec: float | int | None) -> DiagnosisInput:
    return DiagnosisInput(
        speedup=speedup,
        speedup_lower=lo,
        speedup_upper=hi,
        enough_samples=True,
        samples_needed=0,
        speculative=EngineSummary(samples=10, **spec),  # type: ignore[arg-type]
        baseline=EngineSummary(samples=10),
    )


def codes(d: DiagnosisInput) -> list[str]:
    return [r.code for r in diagnose(d).reasons]


def test_implied_draft_cost_inverts_the_speedup_model() -> None:
    assert implied_draft_cost(2.0, 3.0, 4) == pytest.approx(0.125)
    assert implied_draft_cost(0.0, 3.0, 4) is None


def _at_alpha(alpha: float, k: int = 4, running: float | None = None) -> EngineSummary:
    """The speculative engine's figures for per-token acceptance alpha, as vLLM reports them:
    mean acceptance length L = 1 + alpha + ... + alpha^k, accepted/drafted = (L - 1) / k."""
    length = tokens_per_step(alpha, k)
    return EngineSummary(
        samples=10,
        acceptance_rate=(length - 1.0) / k,
        mean_acceptance_length=length,
        num_speculative_tokens=k,
        requests_running=running,
    )


def _spec_input(speedup: float, lo: float, hi: float, spec: EngineSummary) -> DiagnosisInput:
    return dataclasses.replace(_input(speedup, lo, hi), speculative=spec)


def test_tokens_per_step_is_leviathans_closed_form_and_inverts() -> None:
    for alpha in (0.1, 0.5, 0.7):
        closed = (1 - alpha**5) / (1 - alpha)
        assert tokens_per_step(alpha, 4) == pytest.approx(closed)
        assert per_token_acceptance(closed, 4) == pytest.approx(alpha, abs=1e-9)
    assert per_token_acceptance(0.9, 4) is None and per_token_acceptance(5.5, 4) is None


@pytest.mark.parametrize("alpha", [0.5, 0.7])
def test_low_acceptance_stays_silent_at_the_emulators_defaults(alpha: float) -> None:
    # k = 4 at alpha 0.5 (vLLM reports 23% of drafted tokens accepted) or 0.7 (44%, the issue's
    # "acceptance 44% (< 50%)"): 1.94 and 2.77 tokens per step, above 1 + 4 x 0.1
    d = _spec_input(1.9, 1.7, 2.1, _at_alpha(alpha))
    assert (d.speculative.acceptance_rate or 1.0) < 0.5  # the old fixed threshold fired here
    out = diagnose(d)
    assert [r.code for r in out.reasons] == ["working"]
    assert out.acceptance is not None and out.acceptance.pays
    assert out.acceptance.break_even == pytest.approx(1.4)
    assert out.acceptance.draft_cost_source == "assumed"


def test_low_acceptance_fires_at_alpha_0_1_and_points_at_domain_or_temperature() -> None:
    d = _spec_input(0.9, 0.85, 0.95, _at_alpha(0.1))  # 1.11 tokens per step < 1.4
    out = diagnose(d)
    assert [r.code for r in out.reasons] == ["low_acceptance"]
    message = out.reasons[0].message
    assert "1.11 tokens" in message and "1.40 target steps" in message
    assert "~0.10" in message and "k = 4" in message
    assert f"c = {DEFAULT_DRAFT_COST:.2f}" in message and "assumed" in message
    assert "temperature" in message
    assert out.summary.startswith("speculation hurts")
    block = out.to_dict()["acceptance"]
    assert block is not None and not block["pays"]
    assert block["tokens_per_step"] == pytest.approx(1.1111)


def test_low_acceptance_uses_the_measured_draft_cost() -> None:
    # a speculative step 50% longer than a target step: 1 + k c = 1.5 (c = 0.125)
    low = dataclasses.replace(  # 1.42 tokens per step
        _spec_input(0.9, 0.85, 0.95, _at_alpha(0.3)),
        speculative_step_s=0.030,
        baseline_step_s=0.020,
    )
    out = diagnose(low)
    assert "low_acceptance" in [r.code for r in out.reasons]
    assert out.acceptance is not None and out.acceptance.draft_cost == pytest.approx(0.125)
    assert "measured" in out.reasons[0].message
    fine = dataclasses.replace(low, speculative=_at_alpha(0.5))
    assert "low_acceptance" not in codes(fine)


def test_a_loaded_step_is_not_taken_for_the_drafts_cost() -> None:
    # at a 256-sequence batch the emulated speculative step takes 5.4 target steps (verifying
    # 5 tokens per sequence past the roofline knee): that is load, not low acceptance
    loaded = dataclasses.replace(
        _spec_input(0.5, 0.4, 0.6, _at_alpha(0.8, running=256.0)),
        speculative_step_s=0.216,
        baseline_step_s=0.040,
    )
    out = diagnose(loaded)
    assert "high_load" in [r.code for r in out.reasons]
    assert "low_acceptance" not in [r.code for r in out.reasons]
    assert out.acceptance is not None and out.acceptance.draft_cost_source == "assumed"
    queued = dataclasses.replace(
        loaded,
        speculative=_at_alpha(0.8),
        queueing=(LatencyGrowth("speculative", "TTFT", 1.0, 4.8),),
    )
    assert "low_acceptance" not in codes(queued)


def test_low_acceptance_without_k_is_not_evaluated() -> None:
    out = diagnose(_input(0.9, 0.85, 0.95, acceptance_rate=0.05))
    assert "low_acceptance" not in [r.code for r in out.reasons]
    assert [r.code for r in out.not_evaluated if r.code == "low_acceptance"] == ["low_acceptance"]
    assert out.acceptance is None and out.to_dict()["acceptance"] is None


def test_an_overloaded_window_gets_the_queueing_headline() -> None:
    rise = LatencyGrowth("baseline", "TTFT", 0.2, 3.0)
    healthy = _spec_input(3.19, 2.9, 3.5, _at_alpha(0.7))
    loaded = dataclasses.replace(healthy, queueing=(rise,))
    out = diagnose(loaded)
    assert out.summary.startswith("overloaded: this comparison is measuring queueing, not spec")
    assert "baseline TTFT median 200 ms -> 3.0 s, 15.0x" in out.summary
    assert "queueing" in [r.code for r in out.reasons]
    assert "working" not in [r.code for r in out.reasons]
    assert out.to_dict()["queueing"] == [
        {"arm": "baseline", "metric": "TTFT", "early_s": 0.2, "late_s": 3.0, "ratio": 15.0}
    ]
    calm = diagnose(healthy)
    assert calm.summary.startswith("speculation helps") and "queueing" not in calm.summary


def test_high_load_branch() -> None:
    d = _input(0.95, 0.9, 1.0, acceptance_rate=0.7, requests_running=64.0, kv_cache_usage=0.5)
    assert codes(d) == ["high_load"]


def test_costly_draft_branch() -> None:
    d = _input(
        1.0, 0.97, 1.03, acceptance_rate=0.7, mean_acceptance_length=3.0, num_speculative_tokens=4
    )
    assert codes(d) == ["draft_too_costly"]
    result = diagnose(d)
    assert result.implied_draft_cost == pytest.approx(0.5)
    # The scraper cannot see the drafting method: the advice must not assume it is not n-gram.
    [reason] = result.reasons
    assert "c = 0.50" in reason.message
    assert "if you are not already" in reason.message and "consider n-gram" not in reason.message


def test_working_and_too_few_samples() -> None:
    ok = _input(1.8, 1.6, 2.0, acceptance_rate=0.8, mean_acceptance_length=3.5)
    assert codes(ok) == ["working"]
    few = DiagnosisInput(
        float("nan"), float("nan"), float("nan"), False, 300, EngineSummary(), EngineSummary()
    )
    assert codes(few) == ["too_few_samples", "no_engine_metrics"]
    assert diagnose(few).summary == "no data yet"


def test_summarise_engine_averages_up_samples() -> None:
    samples = [
        EngineSample(
            1.0,
            "r",
            "speculative",
            True,
            acceptance_rate=0.6,
            requests_running=4,
            position_acceptance=(0.9, 0.7, 0.5),
        ),
        EngineSample(2.0, "r", "speculative", True, restarted=True, acceptance_rate=0.8),
        EngineSample(3.0, "r", "speculative", False, acceptance_rate=0.0),
    ]
    s = summarise_engine(samples)
    assert s.acceptance_rate == pytest.approx(0.7)
    assert (s.restarts, s.num_speculative_tokens, s.requests_running) == (1, 3, 4)


def _with_verdict(verdict: str | None, lo: float, hi: float) -> DiagnosisInput:
    d = _input(2.16, lo, hi, acceptance_rate=0.8, mean_acceptance_length=3.0)
    return dataclasses.replace(d, e2e_verdict=verdict)


def test_headline_names_its_metric_and_statistic_with_the_interval() -> None:
    out = diagnose(_with_verdict("faster", 1.89, 2.42))
    assert out.summary == "speculation helps: TPOT median 2.16x [1.89, 2.42]"


def test_headline_never_says_helps_while_the_e2e_verdict_is_inconclusive() -> None:
    out = diagnose(_with_verdict("inconclusive", 1.89, 2.42))
    assert out.summary == "no verdict yet: TPOT median 2.16x [1.89, 2.42]"
    assert "helps" not in out.summary
    why = [r for r in out.reasons if r.code == "ci_ahead_of_verdict"]
    assert why and "anytime-valid" in (why[0].detail or "")
    assert "working" not in [r.code for r in out.reasons]


def test_an_e2e_slower_verdict_wins_over_a_favourable_decode_interval() -> None:
    out = diagnose(_with_verdict("slower", 1.89, 2.42))
    assert out.summary.startswith("speculation hurts end to end")
    assert "helps" not in out.summary


def test_draft_cost_from_measured_step_times() -> None:
    assert draft_step_share(0.026, 0.020) == pytest.approx(0.3)
    assert draft_step_share(None, 0.02) is None and draft_step_share(0.02, 0.0) is None
    slow = dataclasses.replace(
        _input(0.95, 0.9, 1.0, acceptance_rate=0.7),
        speculative_step_s=0.030,
        baseline_step_s=0.020,
    )
    assert codes(slow) == ["draft_step_share"]
    assert "50% longer" in diagnose(slow).reasons[0].message
    cheap = dataclasses.replace(slow, speculative_step_s=0.024)  # 20 % < 30 %
    assert codes(cheap) == []


def test_zero_drafts_is_named_and_no_metrics_only_when_the_scrape_failed() -> None:
    # random prompts on an n-gram proposer (issue 14): scraped fine, counters never moved
    slow = _input(0.74, 0.70, 0.78)
    scraped = dataclasses.replace(slow, speculative=EngineSummary(samples=12, up_samples=12))
    assert codes(scraped) == ["no_drafts"]
    assert diagnose(scraped).reasons[0].message.startswith("no drafts proposed")
    assert diagnose(scraped).summary.startswith("speculation hurts")
    failed = dataclasses.replace(slow, speculative=EngineSummary(samples=12, up_samples=0))
    assert codes(failed) == ["no_engine_metrics"]
    from_samples = summarise_engine(
        [EngineSample(float(t), "r", "speculative", up=t % 2 == 0) for t in range(6)]
    )
    assert from_samples.samples == 6 and from_samples.up_samples == 3


def test_zero_acceptance_is_named_apart_from_low_acceptance() -> None:
    d = _input(0.8, 0.75, 0.85, acceptance_rate=0.0, mean_acceptance_length=1.0)
    assert codes(d) == ["zero_acceptance"]


# ------------------------------------------------------------------ the headline's rules


def _verdicts(
    e2e: str | None, ttft_p99: str = "inconclusive", e2e_part: str = "p99"
) -> tuple[MetricVerdict, ...]:
    out = []
    if e2e is not None:
        parts = {e2e_part: e2e} if e2e != "inconclusive" else {}
        out.append(MetricVerdict("E2E", e2e, **parts))  # type: ignore[arg-type]
    ttft = "slower" if ttft_p99 == "slower" else "inconclusive"
    out.append(MetricVerdict("TTFT", ttft, p99=ttft_p99))
    out.append(MetricVerdict("TPOT", "inconclusive"))
    return tuple(out)


def _headline_input(
    e2e: str | None, ci: tuple[float, float, float], ttft_p99: str = "inconclusive"
) -> DiagnosisInput:
    d = _input(*ci, acceptance_rate=0.8, mean_acceptance_length=3.0)
    return dataclasses.replace(d, e2e_verdict=e2e, verdicts=_verdicts(e2e, ttft_p99))


CIS = {"helps": (2.16, 1.89, 2.42), "hurts": (0.80, 0.75, 0.85), "neither": (1.0, 0.9, 1.1)}


@pytest.mark.parametrize("e2e", ["faster", "slower", "inconclusive", None])
@pytest.mark.parametrize("ttft_p99", ["slower", "inconclusive", "faster"])
@pytest.mark.parametrize("ci", sorted(CIS))
def test_the_headline_never_contradicts_a_verdict_and_names_its_metric(
    e2e: str | None, ttft_p99: str, ci: str
) -> None:
    out = diagnose(_headline_input(e2e, CIS[ci], ttft_p99))
    summary = out.summary
    assert "TPOT median" in summary  # the quoted interval names its metric and statistic
    if e2e == "slower":
        assert summary.startswith("speculation hurts end to end (anytime-valid: E2E P99 slower")
    if ttft_p99 == "slower":  # a slower verdict is named, and "helps" is never said alone
        assert "TTFT P99 slower" in summary
        assert not summary.startswith("speculation helps")
        assert "working" not in [r.code for r in out.reasons]
    if e2e == "faster":
        assert "hurts" not in summary and "no verdict" not in summary
    if summary.startswith("speculation helps"):
        assert e2e in ("faster", None) and ttft_p99 != "slower" and ci != "hurts"
        assert ci == "helps" or "anytime-valid: E2E P99 faster" in summary
    if e2e == "inconclusive" and ci != "neither":
        assert "no verdict yet" in summary and "helps" not in summary
        assert "ci_ahead_of_verdict" in [r.code for r in out.reasons]


def test_an_e2e_faster_verdict_beside_an_interval_below_one_is_mixed_and_names_both() -> None:
    out = diagnose(_headline_input("faster", CIS["hurts"]))
    assert out.summary == "mixed: E2E P99 faster (anytime-valid) but TPOT median 0.80x [0.75, 0.85]"


def test_a_slower_tail_elsewhere_turns_helps_into_mixed_with_a_reason() -> None:
    out = diagnose(_headline_input("faster", CIS["helps"], ttft_p99="slower"))
    assert out.summary == (
        "mixed: speculation helps: TPOT median 2.16x [1.89, 2.42]; but TTFT P99 slower"
        " (anytime-valid)"
    )
    [why] = [r for r in out.reasons if r.code == "slower_verdict"]
    assert "TTFT P99 slower" in why.message


def test_the_e2e_slower_headline_names_the_part_that_decided() -> None:
    d = dataclasses.replace(
        _headline_input("slower", CIS["helps"]),
        verdicts=(MetricVerdict("E2E", "slower", median="slower", p99="slower"),),
    )
    assert diagnose(d).summary.startswith(
        "speculation hurts end to end (anytime-valid: E2E median and P99 slower)"
    )


def test_ci_ahead_of_the_verdict_says_where_the_anytime_valid_tests_stand() -> None:
    e2e = MetricVerdict(
        "E2E",
        "inconclusive",
        median_bounds=(0.91, 1.03),
        p99_log_e=(-2.0, math.log(4.0)),
        p99_boundary=math.log(40.0),
    )
    d = dataclasses.replace(_headline_input("inconclusive", CIS["helps"]), verdicts=(e2e,))
    out = diagnose(d)
    [why] = [r for r in out.reasons if r.code == "ci_ahead_of_verdict"]
    # one plain sentence (issue 28 item 5: it was 60 words of jargon); the numbers in the JSON
    assert why.message == (
        "the 95% interval of the TPOT median speedup is above 1, but there is not yet enough "
        "data for a verdict that stays valid however often you look"
    )
    assert why.detail is not None
    assert "[0.910, 1.030], still include 1" in why.detail
    assert "e-value is 4 of the 40 it needs" in why.detail
    [shown] = [r for r in out.to_dict()["reasons"] if r["code"] == "ci_ahead_of_verdict"]
    assert shown == {"code": why.code, "message": why.message, "detail": why.detail}


def test_a_p99_interval_ahead_of_the_p99_verdict_is_explained() -> None:
    beyond = MetricVerdict(
        "E2E",
        "inconclusive",
        p99_ci=(0.85, 0.93),  # speculative P99 7-18 % slower: beyond the 5 % tolerance
        p99_log_e=(math.log(10.0), -3.0),
        p99_boundary=math.log(40.0),
    )
    d = dataclasses.replace(_headline_input("inconclusive", CIS["neither"]), verdicts=(beyond,))
    [why] = [r for r in diagnose(d).reasons if r.code == "p99_ci_ahead_of_verdict"]
    assert why.message.startswith("the 95% interval of the E2E P99 speedup, [0.85, 0.93], is below")
    assert "need more samples" in why.message and "e-value is 10 of the 40" in why.message
    within = dataclasses.replace(beyond, p99_ci=(0.96, 0.99))  # within 1/1.05 = 0.952
    d = dataclasses.replace(d, verdicts=(within,))
    [why] = [r for r in diagnose(d).reasons if r.code == "p99_ci_ahead_of_verdict"]
    assert "within the 5% tolerance" in why.message
    decided = dataclasses.replace(beyond, p99="slower", verdict="slower")
    d = dataclasses.replace(d, verdicts=(decided,))
    assert "p99_ci_ahead_of_verdict" not in [r.code for r in diagnose(d).reasons]


# ---- GPU telemetry branches (dcgm-exporter; scrape.dcgm) ----------------------------------


def _gpu(t: float, arm: Arm = "speculative", **kw: object) -> GpuSample:
    return GpuSample(t=t, arm=arm, up=kw.pop("up", True), **kw)  # type: ignore[arg-type]


def _gpu_input(spec: GpuSummary | None, base: GpuSummary | None) -> DiagnosisInput:
    d = _input(
        1.0,
        0.9,
        1.1,
        acceptance_rate=0.8,
        mean_acceptance_length=3.0,
        up_samples=10,
        num_speculative_tokens=4,
    )
    return dataclasses.replace(
        d,
        speculative=dataclasses.replace(d.speculative, gpu=spec),
        baseline=dataclasses.replace(d.baseline, gpu=base),
    )


def gpu_codes(d: DiagnosisInput) -> tuple[list[str], list[str]]:
    out = diagnose(d)
    return [r.code for r in out.reasons], [r.code for r in out.not_evaluated]


def test_summarise_gpu_over_a_window() -> None:
    samples = [
        _gpu(
            0,
            memory_bandwidth=0.95,
            bandwidth_source="dram_active",
            utilization=1.0,
            sm_clock_mhz=1400.0,
            temperature_c=91.0,
            clock_reasons=("sw_thermal",),
            thermal_throttled=True,
            gpus=2,
        ),
        _gpu(
            1,
            memory_bandwidth=0.85,
            bandwidth_source="mem_copy_util",
            utilization=0.5,
            sm_clock_mhz=1800.0,
            temperature_c=80.0,
            clock_reasons=(),
            thermal_throttled=False,
            gpus=1,
        ),
        _gpu(2, up=False, error="timed out"),
    ]
    g = summarise_gpu(samples)
    assert (g.samples, g.up_samples, g.gpus) == (3, 2, 2)
    assert g.memory_bandwidth == pytest.approx(0.9)
    assert g.bandwidth_source == "mem_copy_util"  # any fallback is said
    assert (g.utilization, g.sm_clock_mhz, g.temperature_c) == (0.75, 1600.0, 91.0)
    assert g.thermal_throttle_share == 0.5 and g.clock_reasons == ("sw_thermal",)
    assert g.error is None  # some scrape succeeded
    down = summarise_gpu([_gpu(0, up=False, error="HTTP 503 from x")])
    assert down.up_samples == 0 and down.error == "HTTP 503 from x"
    no_reasons = summarise_gpu([_gpu(0, memory_bandwidth=0.2)])
    assert no_reasons.thermal_throttle_share is None and no_reasons.clock_reasons is None


def test_summarise_arms_windows_the_gpu_samples_of_configured_arms() -> None:
    gpu = {"speculative": [_gpu(5, memory_bandwidth=0.1), _gpu(50, memory_bandwidth=0.99)]}
    arms = summarise_arms([], gpu, since=10.0)
    spec = arms["speculative"].gpu
    assert spec is not None and spec.samples == 1 and spec.memory_bandwidth == 0.99
    assert arms["baseline"].gpu is None  # not configured
    assert summarise_arms([], None, since=0.0)["speculative"].gpu is None
    assert arms["speculative"].to_dict()["gpu"] == spec.to_dict()


def test_no_gpu_telemetry_means_not_evaluated_never_a_finding() -> None:
    reasons, skipped = gpu_codes(_gpu_input(None, None))
    assert not {"memory_bandwidth_saturated", "thermal_throttling", "no_gpu_metrics"} & set(reasons)
    assert skipped == ["memory_bandwidth_saturated", "thermal_throttling"]
    message = diagnose(_gpu_input(None, None)).not_evaluated[0].message
    assert "not evaluated" in message and "dcgm_urls" in message


def test_the_gpu_branches_name_the_compared_arms_and_their_config_tables() -> None:
    """A/B/n: each comparison's diagnosis names its own arms, and where their GPU telemetry
    is configured (`[arms.NAME]`, the shorthand's `[speculative]` in a two-arm run)."""
    calm = GpuSummary(samples=40, up_samples=40, memory_bandwidth=0.4, thermal_throttle_share=0.0)
    hot = dataclasses.replace(calm, thermal_throttle_share=0.25)
    named = dataclasses.replace(_gpu_input(hot, None), names=("base", "ngram-k4"))
    out = diagnose(named)
    (reason,) = [r for r in out.reasons if r.code == "thermal_throttling"]
    assert "ngram-k4 in 25% of scrapes" in reason.message
    message = out.not_evaluated[0].message
    assert "the base arm has no GPU telemetry ([arms.base] dcgm_urls)" in message
    assert "speculative" not in message and "baseline" not in message
    two = diagnose(_gpu_input(hot, None)).not_evaluated[0].message
    assert "the baseline arm has no GPU telemetry ([baseline] dcgm_urls)" in two


def test_bandwidth_saturated_fires_above_90_percent_only() -> None:
    hot = GpuSummary(
        samples=10,
        up_samples=10,
        memory_bandwidth=0.93,
        bandwidth_source="dram_active",
        thermal_throttle_share=0.0,
    )
    cool = dataclasses.replace(hot, memory_bandwidth=0.9)  # not above 90 %
    reasons, skipped = gpu_codes(_gpu_input(hot, cool))
    assert "memory_bandwidth_saturated" in reasons and skipped == []
    message = next(
        r.message
        for r in diagnose(_gpu_input(hot, cool)).reasons
        if r.code == "memory_bandwidth_saturated"
    )
    assert "speculative 93% (DRAM active)" in message and "baseline" not in message
    assert "verification" in message
    reasons, _ = gpu_codes(_gpu_input(cool, cool))
    assert "memory_bandwidth_saturated" not in reasons


def test_thermal_throttling_fires_on_either_arm_from_five_percent() -> None:
    calm = GpuSummary(
        samples=40,
        up_samples=40,
        memory_bandwidth=0.4,
        thermal_throttle_share=0.0,
        clock_reasons=("gpu_idle",),
    )
    hot = dataclasses.replace(
        calm,
        thermal_throttle_share=0.25,
        sm_clock_mhz=1410.0,
        temperature_c=91.0,
        clock_reasons=("hw_thermal", "power_cap"),
    )
    out = diagnose(_gpu_input(calm, hot))
    (reason,) = [r for r in out.reasons if r.code == "thermal_throttling"]
    assert "baseline in 25% of scrapes (hw_thermal, SM clock 1410 MHz, up to 91 °C)" in (
        reason.message
    )
    assert "confounded" in reason.message
    blip = dataclasses.replace(hot, thermal_throttle_share=1 / 40)  # one flag in 40 scrapes
    assert "thermal_throttling" not in gpu_codes(_gpu_input(calm, blip))[0]


def test_missing_fields_and_failed_scrapes_are_told_apart() -> None:
    no_fields = GpuSummary(samples=5, up_samples=5)  # scraped, but neither field exported
    failed = GpuSummary(samples=5, up_samples=0, error="timed out")
    out = diagnose(_gpu_input(failed, no_fields))
    assert [r.code for r in out.reasons if "gpu" in r.code] == ["no_gpu_metrics"]
    assert any(r.code == "no_gpu_metrics" and "timed out" in r.message for r in out.reasons)
    skipped = {r.code: r.message for r in out.not_evaluated}
    assert "DCGM_FI_PROF_DRAM_ACTIVE" in skipped["memory_bandwidth_saturated"]
    assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" in skipped["thermal_throttling"]
    assert "speculative" not in skipped["thermal_throttling"]  # its scrape failed: a reason


def test_diagnosis_dict_carries_not_evaluated() -> None:
    as_dict = diagnose(_gpu_input(None, None)).to_dict()
    assert [r["code"] for r in as_dict["not_evaluated"]] == [
        "memory_bandwidth_saturated",
        "thermal_throttling",
    ]
