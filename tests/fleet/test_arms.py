from __future__ import annotations

from pathlib import Path

from specproxy.config import Config
from specproxy.fleet.arms import Fleet
from tests.fleet.fakes import HostsFileResolver


async def test_dns_arm_is_resolved_at_start_and_url_arm_is_fixed(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("10.0.0.7 vllm-spec.llm.svc\n10.0.0.5 vllm-spec.llm.svc\n")
    cfg = Config.from_mapping(
        {
            "baseline": {"urls": ["http://b1:8000/", "http://b2:8000"]},
            "speculative": {"dns": "vllm-spec.llm.svc", "port": 8100, "refresh_s": 60},
            "model_allow": ["dev-model"],
        }
    )
    fleet = Fleet(cfg, resolver=HostsFileResolver(hosts))
    assert fleet.endpoints("speculative") == ("http://vllm-spec.llm.svc:8100",)  # before start
    assert fleet.endpoints("baseline") == ("http://b1:8000", "http://b2:8000")
    await fleet.start()
    try:
        assert fleet.endpoints("speculative") == ("http://10.0.0.5:8100", "http://10.0.0.7:8100")
        assert fleet.pool("speculative").acquire().url == "http://10.0.0.5:8100"
    finally:
        await fleet.close()
    assert fleet.labels.label("dev-model") == "dev-model"
    assert fleet.labels.label("anything") == "other"
