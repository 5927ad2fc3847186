"""The launcher, on a stand-in api_server (tests/realvllm/fake_api_server.py), without vLLM."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from specproxy.realvllm.launcher import (
    SPECULATIVE_CONFIG,
    LaunchError,
    VllmPair,
    VllmServer,
    core_split,
    free_port,
    resolve_vllm_python,
    server_args,
    server_env,
)

REPO = Path(__file__).resolve().parents[2]
FAKE = "tests.realvllm.fake_api_server"


def fake_pair(tmp_path: Path, **env: str) -> VllmPair:
    return VllmPair(
        Path(sys.executable),
        log_dir=tmp_path / "logs",
        cache_dir=tmp_path / "cache",
        module=FAKE,
        extra_env={"PYTHONPATH": str(REPO), **env},
        startup_timeout_s=30,
    )


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


def test_server_args_follow_the_fixtures_recipe() -> None:
    spec = server_args(Path("/m"), port=18001, speculative=True)
    base = server_args(Path("/m"), port=18002, speculative=False)
    common = [
        "--model", "/m", "--served-model-name", "tiny-llama", "--load-format", "dummy",
        "--max-model-len", "1024", "--dtype", "bfloat16",
    ]  # fmt: skip
    assert spec[: len(common)] == base[: len(common)] == common
    config = spec[spec.index("--speculative-config") + 1]
    assert (
        json.loads(config)
        == SPECULATIVE_CONFIG
        == {
            "method": "ngram",
            "num_speculative_tokens": 4,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 2,
        }
    )
    assert spec[spec.index("--per-request-spec-decode-metrics") + 1] == "summary"
    assert "--enable-per-request-metrics" in spec and "--enable-per-request-metrics" in base
    assert "--speculative-config" not in base and "--per-request-spec-decode-metrics" not in base
    assert base[-4:] == ["--host", "127.0.0.1", "--port", "18002"]


def test_server_env() -> None:
    env = server_env({"PATH": "/bin", "PYTHONPATH": "/proxy/src"}, {"EXTRA": "1"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert "PYTHONPATH" not in env and env["PATH"] == "/bin" and env["EXTRA"] == "1"


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_resolve_vllm_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECPROXY_VLLM_PYTHON", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LaunchError, match="make vllm-env"):
        resolve_vllm_python()
    monkeypatch.setenv("SPECPROXY_VLLM_PYTHON", sys.executable)
    assert resolve_vllm_python() == Path(sys.executable)
    assert resolve_vllm_python(sys.executable) == Path(sys.executable)


def test_pair_starts_restarts_one_arm_and_stops(tmp_path: Path) -> None:
    with fake_pair(tmp_path) as pair:
        urls = {arm: pair.url(arm) for arm in ("speculative", "baseline")}
        assert len(set(urls.values())) == 2 and all(answers(u) for u in urls.values())
        assert pair.startup_s is not None
        pair.stop_arm("speculative")
        assert not answers(urls["speculative"]) and answers(urls["baseline"])
        pair.start_arm("speculative")
        assert pair.url("speculative") == urls["speculative"]  # same port, same URL
        assert answers(urls["speculative"])
        pair.restart("baseline")
        assert pair.servers["baseline"].starts == 2 and answers(urls["baseline"])
    assert not any(answers(u) for u in urls.values())
    assert not any(s.running for s in pair.servers.values())
    log = (tmp_path / "logs" / "vllm-speculative.log").read_text()
    assert log.count("=== ") == 2 and "--speculative-config" in log  # appended on restart
    base_log = (tmp_path / "logs" / "vllm-baseline.log").read_text()
    assert "--speculative-config" not in base_log
    split = core_split(sorted(os.sched_getaffinity(0)))
    assert f"bind={split.get('speculative')}" in log  # the binding survives a restart
    assert f"bind={split.get('baseline')}" in base_log


def test_core_split_gives_each_worker_its_own_cores() -> None:
    assert core_split([1, 0]) == {"speculative": "0", "baseline": "1"}
    assert core_split([0, 1, 2, 3, 4]) == {"speculative": "0,1", "baseline": "2,3,4"}
    assert core_split([0]) == {}


async def test_pair_is_an_async_context_manager(tmp_path: Path) -> None:
    async with fake_pair(tmp_path) as pair:
        assert answers(pair.speculative_url) and answers(pair.baseline_url)
    assert not answers(pair.speculative_url)


def test_crash_at_start_up_reports_the_log(tmp_path: Path) -> None:
    pair = fake_pair(tmp_path, FAKE_VLLM_MODE="crash")
    with pytest.raises(LaunchError, match=r"exited with code 3(.|\n)*boom: cannot start"):
        pair.start()
    assert not any(s.running for s in pair.servers.values())


def test_health_timeout_stops_the_servers(tmp_path: Path) -> None:
    pair = fake_pair(tmp_path, FAKE_VLLM_DELAY="60")
    pair.startup_timeout_s = 1.0
    with pytest.raises(LaunchError, match="not healthy after 1 s"):
        pair.start()
    assert not any(s.running for s in pair.servers.values())


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    server = VllmServer(
        "baseline",
        python=Path(sys.executable),
        model_dir=tmp_path,
        log_path=tmp_path / "base.log",
        module=FAKE,
        extra_env={"PYTHONPATH": str(REPO), "FAKE_VLLM_MODE": "ignore-term"},
    )
    server.start()
    server.wait_healthy(30)
    started = time.monotonic()
    server.stop(grace_s=0.5)
    assert not server.running and time.monotonic() - started < 10
    assert not answers(server.url)


def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    with fake_pair(tmp_path, FAKE_VLLM_MODE="child") as pair:
        log_path = pair.servers["speculative"].log_path
    match = re.search(r"child pid (\d+)", log_path.read_text())
    assert match is not None
    child = int(match.group(1))
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)  # like vLLM's EngineCore, the child dies with its parent's group


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not status.exists() or status.read_text().split()[2] != "Z"
