"""`specproxy emulate` arguments and the offline prediction."""

from __future__ import annotations

import pytest

from specproxy.cli import build_parser
from specproxy.emulator.cli import config_from_args, run
from specproxy.emulator.config import EmulatorConfig
from specproxy.errors import ConfigError


def test_vllm_style_flags_build_the_config() -> None:
    args = build_parser("emulate").parse_args(
        [
            "emulate",
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 3}',
            "--enable-per-request-metrics",
            "--per-request-spec-decode-metrics",
            "summary",
            "--metrics-version",
            "v0",
            "--seed",
            "5",
        ]
    )
    cfg = config_from_args(args)
    assert cfg.speculative and cfg.num_speculative_tokens == 3
    assert cfg.per_request_metrics and cfg.per_request_spec_metrics == "summary"
    assert cfg.metrics_version == "v0" and cfg.seed == 5


def test_bad_values_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="acceptance"):
        EmulatorConfig(acceptance=1.5)
    args = build_parser("emulate").parse_args(["emulate", "--speculative-config", "{"])
    with pytest.raises(ConfigError, match="speculative-config"):
        config_from_args(args)


def test_predict_prints_the_formula_and_simulated_speedups(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser("emulate").parse_args(["emulate", "--predict"])
    assert run(args) == 0
    out = capsys.readouterr().out
    assert "formula (Leviathan): 1.981x" in out
    assert len(out.splitlines()) == 8
