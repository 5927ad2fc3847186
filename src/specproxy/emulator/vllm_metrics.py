"""The /metrics page of an emulated vLLM engine, in V1 (0.32) or V0 (0.5-0.8) form.

Names, help texts, label names and buckets are vLLM's (see tests/fixtures/vllm-0.32.0-cpu/
metrics_*.prom), because the scraper, dashboards and alerts must work unchanged against real
servers. Each engine (re)start builds a fresh `EngineMetrics` on a private registry: counters
restart at zero and `process_start_time_seconds` moves, exactly what a scraper sees after a real
restart. V0's sum-of-sums counter bug is not reproduced: counters here are always correct.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from specproxy.emulator.config import MetricsVersion
from specproxy.emulator.model import Sequence as Seq
from specproxy.emulator.model import StepResult

__all__ = ["EngineMetrics"]

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
V0_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
V0_E2E_BUCKETS = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
# vllm:cache_config_info labels as the fixtures' CPU server reported them (an info-style gauge).
CACHE_CONFIG = {
    "_block_size_resolved": "True",
    "block_size": "128",
    "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None",
    "effective_attention_block_size": "128",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "enable_prefix_caching": "True",
    "engine": "0",
    "gpu_memory_utilization": "0.92",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_cache_max_concurrency": "256.0",
    "kv_cache_memory_bytes": "1073741824",
    "kv_cache_size_tokens": "262144",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "float32",
    "num_cpu_blocks": "None",
    "num_gpu_blocks": "2048",
    "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}


def token_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's 1-2-5 series up to max_model_len."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


class _ProcessCollector(Collector):
    """process_* of this process, with the start time of the emulated engine instead."""

    def __init__(self, start_time: float) -> None:
        self.start_time = start_time
        self._inner = ProcessCollector(registry=None)

    def collect(self) -> Iterator[Metric]:
        seen = False
        for family in self._inner.collect():
            if family.name == "process_start_time_seconds":
                seen = True
                family = GaugeMetricFamily(family.name, family.documentation, value=self.start_time)
            yield family
        if not seen:  # no /proc (macOS): still publish the one process metric that matters
            yield GaugeMetricFamily(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                value=self.start_time,
            )


class EngineMetrics:
    """Collectors of one engine life on a private registry; `observe_*` are called by the server."""

    def __init__(
        self,
        *,
        model: str,
        speculative: bool,
        k: int,
        version: MetricsVersion,
        start_time: float,
        max_model_len: int,
    ) -> None:
        self.registry = CollectorRegistry()
        self.version = version
        self.speculative = speculative
        self.k = k
        self.start_time = start_time
        self.registry.register(_ProcessCollector(start_time))
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        if version == "v1":
            self._v1 = _V1(self.registry, model, speculative, k, max_model_len)
        else:
            self._v0 = _V0(self.registry, model, speculative)
        self._drafts = self._draft_tokens = self._accepted = self._emitted = 0

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def observe_request(self, *, n: int, max_tokens: int) -> None:
        """Once per admitted API request (vLLM's request_params_* histograms)."""
        if self.version == "v1":
            self._v1.params_n.observe(n)
            self._v1.max_generation.observe(max_tokens)

    def observe_step(
        self, result: StepResult, *, running: int, waiting: int, kv_usage: float
    ) -> None:
        """Once per engine step."""
        generated = sum(len(o.token_ids) for o in result.outputs)
        if self.version == "v1":
            m = self._v1
            m.running.set(running)
            m.waiting.set(waiting)
            m.waiting_capacity.set(waiting)
            m.kv_usage.set(kv_usage)
            m.prompt_tokens.inc(result.prefill_tokens)
            m.prompt_by_source.inc(result.prefill_tokens)
            m.prefix_queries.inc(result.prefill_tokens)
            m.generation_tokens.inc(generated)
            m.iteration_tokens.observe(result.scheduled_tokens)
            for out in result.outputs:
                if out.seq.generated > len(out.token_ids):  # not the prefill step's first token
                    m.itl.observe(out.gap_s)
            if self.speculative and result.num_drafts:
                m.drafts.inc(result.num_drafts)
                m.draft_tokens.inc(result.num_draft_tokens)
                m.accepted.inc(result.num_accepted)
                for pos, count in enumerate(result.accepted_per_pos):
                    m.per_pos[pos].inc(count)
        else:
            v0 = self._v0
            v0.running.set(running)
            v0.waiting.set(waiting)
            v0.gpu_cache.set(kv_usage)
            v0.prompt_tokens.inc(result.prefill_tokens)
            v0.generation_tokens.inc(generated)
            for out in result.outputs:
                if out.seq.generated > len(out.token_ids):
                    v0.tpot.observe(out.gap_s)
            if self.speculative and result.num_drafts:
                self._drafts += result.num_drafts
                self._draft_tokens += result.num_draft_tokens
                self._accepted += result.num_accepted
                self._emitted += result.num_accepted + result.num_drafts
                v0.accepted.inc(result.num_accepted)
                v0.draft_tokens.inc(result.num_draft_tokens)
                v0.emitted.inc(result.num_accepted + result.num_drafts)
                v0.acceptance_rate.set(self._accepted / self._draft_tokens)
                v0.efficiency.set(self._emitted / (self._drafts * (self.k + 1)))

    def observe_finished(self, seq: Seq) -> None:
        """Once per finished or aborted sequence."""
        reason = seq.finish_reason or "abort"
        end = seq.finished_at if seq.finished_at is not None else seq.arrival
        if self.version == "v0":
            self._v0.success.labels(finished_reason=reason, model_name=self._v0.model).inc()
            if seq.first_token_at is not None:
                self._v0.ttft.observe(seq.first_token_at - seq.arrival)
            self._v0.e2e.observe(end - seq.arrival)
            return
        m = self._v1
        m.success[reason].inc()
        if seq.first_token_at is None or seq.scheduled_at is None:
            return
        last = seq.last_token_at if seq.last_token_at is not None else seq.first_token_at
        m.ttft.observe(seq.first_token_at - seq.arrival)
        decode = last - seq.first_token_at
        m.tpot.observe(decode / (seq.generated - 1) if seq.generated > 1 else 0.0)
        m.e2e.observe(end - seq.arrival)
        m.queue.observe(seq.scheduled_at - seq.arrival)
        m.inference.observe(end - seq.scheduled_at)
        m.prefill.observe(seq.first_token_at - seq.scheduled_at)
        m.decode.observe(decode)
        m.prompt_hist.observe(seq.prompt_tokens)
        m.generation_hist.observe(seq.generated)
        m.max_tokens.observe(seq.max_tokens)
        m.preemptions.observe(0)
        m.kv_computed.observe(seq.prompt_tokens)


class _V1:
    """vLLM 0.32 (V1 engine) collectors, labelled engine + model_name as the fixtures show."""

    def __init__(
        self, reg: CollectorRegistry, model: str, speculative: bool, k: int, max_model_len: int
    ) -> None:
        base = {"engine": "0", "model_name": model}
        labels = ["engine", "model_name"]

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=reg).labels(**base)

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=reg).labels(**base)

        def hist(name: str, doc: str, buckets: Sequence[float]) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=reg).labels(**base)

        if speculative:
            self.drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
            self.draft_tokens = counter(
                "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."
            )
            self.accepted = counter(
                "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."
            )
            per_pos = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                [*labels, "position"],
                registry=reg,
            )
            self.per_pos = [per_pos.labels(**base, position=str(i)) for i in range(k)]
        mfu = "(for Model Flops Utilization calculations)."
        counter("vllm:estimated_flops_per_gpu",
                f"Estimated number of floating point operations per GPU {mfu}")  # fmt: skip
        counter("vllm:estimated_read_bytes_per_gpu",
                f"Estimated number of bytes read from memory per GPU {mfu}")  # fmt: skip
        counter("vllm:estimated_write_bytes_per_gpu",
                f"Estimated number of bytes written to memory per GPU {mfu}")  # fmt: skip
        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            [*labels, "reason"],
            registry=reg,
        )
        self.waiting_capacity = by_reason.labels(**base, reason="capacity")
        by_reason.labels(**base, reason="deferred")
        sleep = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
            "level 2.",
            [*labels, "sleep_state"],
            registry=reg,
        )
        sleep.labels(**base, sleep_state="awake").set(1)
        sleep.labels(**base, sleep_state="weights_offloaded")
        sleep.labels(**base, sleep_state="discard_all")
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        kv = "from KV connector cross-instance cache sharing, in terms of number of"
        counter("vllm:external_prefix_cache_queries",
                f"External prefix cache queries {kv} queried tokens.")  # fmt: skip
        counter("vllm:external_prefix_cache_hits",
                f"External prefix cache hits {kv} cached tokens.")  # fmt: skip
        counter("vllm:mm_cache_queries",
                "Multi-modal cache queries, in terms of number of queried items.")  # fmt: skip
        counter("vllm:mm_cache_hits",
                "Multi-modal cache hits, in terms of number of cached items.")  # fmt: skip
        counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        by_source = Counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            [*labels, "source"],
            registry=reg,
        )
        self.prompt_by_source = by_source.labels(**base, source="local_compute")
        for source in ("local_cache_hit", "external_kv_transfer"):
            by_source.labels(**base, source=source)
        counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).")
        cached = Counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
            "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.",
            [*labels, "source"],
            registry=reg,
        )
        for source in ("device", "host", "p2p", "disk", "external_unspecified"):
            cached.labels(**base, source=source)
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ["engine", "finished_reason", "model_name"],
            registry=reg,
        )
        self.success = {r: success.labels(**base, finished_reason=r) for r in FINISH_REASONS}
        rejections = Counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"],
            registry=reg,
        )
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            rejections.labels(model_name=model, reason=reason)
        tokens = token_buckets(max_model_len)
        self.prompt_hist = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.generation_hist = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_BUCKETS,
        )
        self.max_generation = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self.params_n = hist(
            "vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS
        )
        self.max_tokens = hist(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tokens,
        )
        self.ttft = hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_BUCKETS,
        )
        phase = "Histogram of time spent in {} phase for request."
        self.queue = hist(
            "vllm:request_queue_time_seconds", phase.format("WAITING"), REQUEST_BUCKETS
        )
        self.inference = hist(
            "vllm:request_inference_time_seconds", phase.format("RUNNING"), REQUEST_BUCKETS
        )
        self.prefill = hist(
            "vllm:request_prefill_time_seconds", phase.format("PREFILL"), REQUEST_BUCKETS
        )
        self.decode = hist(
            "vllm:request_decode_time_seconds", phase.format("DECODE"), REQUEST_BUCKETS
        )
        self.preemptions = hist(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            PREEMPTION_BUCKETS,
        )
        self.kv_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        )
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            sorted(CACHE_CONFIG),
            registry=reg,
        )
        info.labels(**CACHE_CONFIG).set(1)


class _V0:
    """vLLM 0.5-0.8 (V0 engine) names: model_name label only, spec-decode gauges."""

    def __init__(self, reg: CollectorRegistry, model: str, speculative: bool) -> None:
        self.model = model
        base = {"model_name": model}
        labels = ["model_name"]

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=reg).labels(**base)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=reg).labels(**base)

        self.running = gauge(
            "vllm:num_requests_running", "Number of requests currently running on GPU."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.")
        self.gpu_cache = gauge(
            "vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage."
        )
        gauge("vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ["finished_reason", "model_name"],
            registry=reg,
        )
        for reason in ("stop", "length", "abort"):
            self.success.labels(model_name=model, finished_reason=reason)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=TTFT_BUCKETS[:16],
            registry=reg,
        ).labels(**base)
        self.tpot = Histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            labels,
            buckets=V0_TPOT_BUCKETS,
            registry=reg,
        ).labels(**base)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            labels,
            buckets=V0_E2E_BUCKETS,
            registry=reg,
        ).labels(**base)
        if speculative:
            self.acceptance_rate = gauge(
                "vllm:spec_decode_draft_acceptance_rate", "Speulative token acceptance rate."
            )
            self.efficiency = gauge(
                "vllm:spec_decode_efficiency", "Speculative decoding system efficiency."
            )
            self.accepted = counter(
                "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."
            )
            self.draft_tokens = counter(
                "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."
            )
            self.emitted = counter(
                "vllm:spec_decode_num_emitted_tokens", "Number of emitted tokens."
            )
