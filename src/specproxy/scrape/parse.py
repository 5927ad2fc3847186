"""vLLM /metrics text -> `EngineSnapshot`: the raw totals and gauges one scrape saw.

Parsing is pure and version-aware but not version-*dependent*: it reads both engine generations
(V1, vLLM >= 0.8, labels `model_name` + `engine`; V0, vLLM 0.5-0.7, label `model_name` only) and
sums V1 counters over the `engine` label, so a data-parallel server reads as one engine. Samples
are matched by their exposed name (`..._total`), which does not depend on whether the text
declares a `# TYPE` line; the `_created` siblings are ignored. Rates are not computed here: they
need two snapshots (see `derive`).

Only the lines of the ~15 series read here reach prometheus_client's parser: it costs ~50 µs a
line, and a real page has ~600 lines of histograms nobody reads here (30 ms -> ~1 ms per scrape,
see benchmarks/bench_scrape.py). The filter compares exact metric names, so a page that is not
Prometheus text at all still fails (it has no vLLM lines), as do malformed lines that matter.
"""

from __future__ import annotations

import enum
import math
from collections import defaultdict
from collections.abc import Container, Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from specproxy.errors import ScrapeError

__all__ = ["EngineSnapshot", "SpecFormat", "parse_metrics", "relevant_lines"]

# Counters: the exposed sample name always ends in `_total` (prometheus_client appends it);
# the bare name is accepted too, for exporters that emit counters as untyped samples.
DRAFTS = "vllm:spec_decode_num_drafts"  # V1 only
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"  # V1 only, label `position`
EMITTED_TOKENS = "vllm:spec_decode_num_emitted_tokens"  # V0 only
GENERATION_TOKENS = "vllm:generation_tokens"
_COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS, EMITTED_TOKENS, GENERATION_TOKENS)

# Gauges.
V0_ACCEPTANCE_RATE = "vllm:spec_decode_draft_acceptance_rate"
V0_EFFICIENCY = "vllm:spec_decode_efficiency"
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
KV_CACHE_USAGE_OLD = "vllm:gpu_cache_usage_perc"  # V0 and early V1
PROCESS_START = "process_start_time_seconds"
_GAUGES = (
    V0_ACCEPTANCE_RATE,
    V0_EFFICIENCY,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    KV_CACHE_USAGE,
    KV_CACHE_USAGE_OLD,
    PROCESS_START,
)

_SAMPLE_TO_METRIC: dict[str, str] = {
    **{name + "_total": name for name in (*_COUNTERS, ACCEPTED_PER_POS)},
    **{name: name for name in (*_COUNTERS, ACCEPTED_PER_POS, *_GAUGES)},
}


class SpecFormat(enum.StrEnum):
    """Which speculative-decoding metrics an engine exposes."""

    V1 = "v1"  # counters with drafts and per-position acceptance
    V0 = "v0"  # gauges (trusted) + sum-of-sums counters (not trusted for rates)


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """One scrape's values, summed over data-parallel engines; None means "not exposed"."""

    t: float  # Unix time of the scrape
    spec_format: SpecFormat | None  # None: no speculative metrics (e.g. the baseline)
    engines: int  # distinct `engine` label values (1 for V0 and single-engine V1)
    process_start_time: float | None = None
    num_drafts: float | None = None
    num_draft_tokens: float | None = None
    num_accepted_tokens: float | None = None
    accepted_per_position: tuple[float, ...] | None = None  # index = draft position
    num_emitted_tokens: float | None = None
    generation_tokens: float | None = None
    v0_acceptance_rate: float | None = None  # cumulative since engine start
    v0_efficiency: float | None = None  # emitted / (spec steps * (k + 1)), cumulative
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None  # 0..1, mean over engines

    def counters(self) -> dict[str, float]:
        """Every monotone total present, by name (per-position ones as `name[pos]`)."""
        values = {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_emitted_tokens": self.num_emitted_tokens,
            "generation_tokens": self.generation_tokens,
        }
        out = {name: v for name, v in values.items() if v is not None}
        for pos, v in enumerate(self.accepted_per_position or ()):
            out[f"accepted_per_position[{pos}]"] = v
        return out


def parse_metrics(text: str, *, t: float) -> EngineSnapshot:
    """Parse a vLLM /metrics body scraped at Unix time `t`.

    Raises `ScrapeError` when the text is not Prometheus exposition or holds no `vllm:` sample
    (an HTML error page, an empty body, some other service).
    """
    sums: dict[str, float] = defaultdict(float)
    gauge_values: dict[str, list[float]] = defaultdict(list)
    per_pos: dict[int, float] = defaultdict(float)
    engines: set[str] = set()
    saw_vllm = False
    try:
        for family in text_string_to_metric_families(relevant_lines(text, _SAMPLE_TO_METRIC)):
            for sample in family.samples:
                saw_vllm = saw_vllm or sample.name.startswith("vllm:")
                metric = _SAMPLE_TO_METRIC.get(sample.name)
                if metric is None or not math.isfinite(sample.value):
                    continue
                if "engine" in sample.labels:
                    engines.add(sample.labels["engine"])
                if metric == ACCEPTED_PER_POS:
                    per_pos[_position(sample.labels.get("position"))] += sample.value
                elif metric in _COUNTERS:
                    sums[metric] += sample.value
                else:
                    gauge_values[metric].append(sample.value)
    except ValueError as exc:  # the parser's only error type for malformed text
        raise ScrapeError(f"not Prometheus text: {exc}") from exc
    if not saw_vllm:
        raise ScrapeError("no vLLM engine metrics in the response")

    def total(name: str) -> float | None:
        return sums.get(name)

    def gauge_sum(name: str) -> float | None:
        return math.fsum(gauge_values[name]) if name in gauge_values else None

    def gauge_mean(*names: str) -> float | None:
        for name in names:
            if name in gauge_values:
                return math.fsum(gauge_values[name]) / len(gauge_values[name])
        return None

    if DRAFTS in sums or per_pos:
        spec_format: SpecFormat | None = SpecFormat.V1
    elif V0_ACCEPTANCE_RATE in gauge_values or EMITTED_TOKENS in sums:
        spec_format = SpecFormat.V0
    elif DRAFT_TOKENS in sums:  # early V1: only draft/accepted token counters
        spec_format = SpecFormat.V1
    else:
        spec_format = None
    return EngineSnapshot(
        t=t,
        spec_format=spec_format,
        engines=max(1, len(engines)),
        process_start_time=gauge_mean(PROCESS_START),
        num_drafts=total(DRAFTS),
        num_draft_tokens=total(DRAFT_TOKENS),
        num_accepted_tokens=total(ACCEPTED_TOKENS),
        accepted_per_position=_dense(per_pos.items()) if per_pos else None,
        num_emitted_tokens=total(EMITTED_TOKENS),
        generation_tokens=total(GENERATION_TOKENS),
        v0_acceptance_rate=gauge_mean(V0_ACCEPTANCE_RATE),
        v0_efficiency=gauge_mean(V0_EFFICIENCY),
        requests_running=gauge_sum(REQUESTS_RUNNING),
        requests_waiting=gauge_sum(REQUESTS_WAITING),
        kv_cache_usage=gauge_mean(KV_CACHE_USAGE, KV_CACHE_USAGE_OLD),
    )


def relevant_lines(text: str, names: Container[str]) -> str:
    """The sample, HELP and TYPE lines of the metrics in `names` (exposed sample names), in
    their original order: only these reach prometheus_client's parser (~50 µs a line)."""
    kept = []
    for line in text.splitlines():
        body = line[7:] if line.startswith(("# HELP ", "# TYPE ")) else line
        name = body.split("{", 1)[0].split(" ", 1)[0].strip()
        if name in names:
            kept.append(line)
    return "\n".join(kept) + "\n"


def _position(label: str | None) -> int:
    try:
        pos = int(label) if label is not None else -1
    except ValueError:
        pos = -1
    if not 0 <= pos < 1024:
        raise ValueError(f"bad position label {label!r}")
    return pos


def _dense(items: Iterable[tuple[int, float]]) -> tuple[float, ...]:
    """Positions 0..max as a tuple; a position an engine never exported counts as 0 accepted."""
    by_pos = dict(items)
    return tuple(by_pos.get(pos, 0.0) for pos in range(max(by_pos) + 1))
