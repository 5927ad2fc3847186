"""Settings of one emulated vLLM server: what it serves, its timing physics, and which vLLM flags
it mirrors. One frozen object, so a test, the demo and the CLI build servers the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from specproxy.emulator.model import Physics
from specproxy.errors import ConfigError

__all__ = ["LIVE_KNOBS", "EmulatorConfig", "MetricsVersion", "SpecMetricsMode"]

MetricsVersion = Literal["v1", "v0"]
SpecMetricsMode = Literal["none", "summary"]

# Physics knobs `POST /emulator/config` may change while the server runs.
LIVE_KNOBS: tuple[str, ...] = (
    "acceptance",
    "acceptance_spread",
    "base_step_s",
    "batch_slope",
    "draft_cost_ratio",
    "free_batch_tokens",
    "prefill_per_token_s",
    "slowdown",
    "time_scale",
    "warmup_factor",
)


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    """An emulated server. Defaults mirror the fixtures' vLLM 0.32 `tiny-llama` servers."""

    model: str = "tiny-llama"
    model_root: str = "tiny/target"
    speculative: bool = False
    num_speculative_tokens: int = 4
    acceptance: float = 0.7  # mean per-position draft acceptance rate (alpha)
    acceptance_spread: float = 0.05  # std-dev of the per-request acceptance rate
    draft_cost_ratio: float = 0.1  # c: one draft forward / one target forward
    base_step_s: float = 0.010  # target forward time with a memory-bound batch
    free_batch_tokens: int = 64  # batched tokens a forward absorbs at no extra cost (roofline knee)
    batch_slope: float = 1.0 / 64.0  # extra cost per token beyond the knee, as a share of a step
    prefill_per_token_s: float = 0.0001
    warmup_requests: int = 8  # sequences after (re)start that run slower
    warmup_factor: float = 4.0  # slowdown of the very first step after (re)start
    slowdown: float = 1.0  # multiplies every step (admin knob: "make this arm slow")
    time_scale: float = 1.0  # multiplies every duration; tests use < 1 to run fast
    seed: int = 0
    per_request_metrics: bool = False  # vLLM --enable-per-request-metrics
    per_request_spec_metrics: SpecMetricsMode = "none"  # --per-request-spec-decode-metrics
    metrics_version: MetricsVersion = "v1"
    max_model_len: int = 1024
    max_num_seqs: int = 256
    kv_cache_tokens: int = 65536
    default_output_tokens: int = 128  # mean output length when a request sets no max_tokens

    def __post_init__(self) -> None:
        if not self.model.strip():
            raise ConfigError("emulator model must not be empty")
        if self.metrics_version not in ("v1", "v0"):
            raise ConfigError("emulator metrics_version must be v1 or v0")
        if self.per_request_spec_metrics not in ("none", "summary"):
            raise ConfigError("emulator per_request_spec_metrics must be none or summary")
        for name in ("max_model_len", "max_num_seqs", "kv_cache_tokens", "default_output_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"emulator {name} must be >= 1")
        try:
            self.physics()
        except ValueError as exc:
            raise ConfigError(f"emulator {exc}") from exc

    def physics(self) -> Physics:
        return Physics(
            speculative=self.speculative,
            num_speculative_tokens=self.num_speculative_tokens,
            acceptance=self.acceptance,
            acceptance_spread=self.acceptance_spread,
            draft_cost_ratio=self.draft_cost_ratio,
            base_step_s=self.base_step_s,
            free_batch_tokens=self.free_batch_tokens,
            batch_slope=self.batch_slope,
            prefill_per_token_s=self.prefill_per_token_s,
            warmup_requests=self.warmup_requests,
            warmup_factor=self.warmup_factor,
            slowdown=self.slowdown,
            time_scale=self.time_scale,
        )
