"""`specproxy calibrate` (`bench.calibrate_cli`): a k sweep pooled from several bench files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specproxy.bench.calibrate_cli import read_blocks
from specproxy.cli import main
from specproxy.errors import ConfigError


def _block(run_id: str, k: int, ci: tuple[float, float, float]) -> dict[str, Any]:
    median = {"status": "ok", "estimate": ci[0], "lower": ci[1], "upper": ci[2]}
    return {
        "run_id": run_id,
        "temperature": 0.0,
        "k": k,
        "concurrency": 4,
        "rate": None,
        "speedups": {"e2e": {"median": median}},
    }


def test_pools_files_and_names_the_best_k(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    k2 = tmp_path / "k2.json"
    k4 = tmp_path / "k4.json"
    k2.write_text(json.dumps({"blocks": [_block("k2", 2, (1.3, 1.2, 1.4))], "calibration": []}))
    k4.write_text(json.dumps([_block("k4", 4, (1.35, 1.25, 1.45))]))  # an older bare list
    out = tmp_path / "advice.json"
    assert main(["calibrate", str(k2), str(k4), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "calibration: enable speculation with k=4, T=0: 1.35x [1.25, 1.45]" in printed
    assert "not distinguishable from k=2, T=0: 1.30x [1.20, 1.40] (the CIs overlap)" in printed
    assert "ranked (E2E median speedup, 95% CI): k=4, T=0: 1.35x" in printed
    (advice,) = json.loads(out.read_text())
    assert advice["best"]["run_id"] == "k4" and advice["distinguishable"] is False


@pytest.mark.parametrize("text", ["not json", '{"blocks": 3}', '[{"run_id": "x"}]'])
def test_rejects_what_bench_did_not_write(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ConfigError):
        read_blocks([str(path)])
    with pytest.raises(ConfigError, match="cannot read"):
        read_blocks([str(tmp_path / "missing.json")])
