"""deploy/compose/compose.yaml: valid against the vendored compose-spec JSON schema (unknown keys
fail), the services the issue asks for with healthchecks, restart policies and named volumes,
host ports only for the proxy and Grafana, the README's exact vLLM flags on the GPU arms, and a
Prometheus config that scrapes the names Compose defines."""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from specproxy.config import Config
from specproxy.config_env import env_settings
from specproxy.emulator import cli as emulator_cli
from tests.conftest import require_binary
from tests.deploy.kube import REPO, SCHEMAS
from tests.deploy.rulefiles import promtool

COMPOSE_DIR = REPO / "deploy" / "compose"
Doc = dict[str, Any]


def compose() -> Doc:
    doc: Doc = yaml.safe_load((COMPOSE_DIR / "compose.yaml").read_text(encoding="utf-8"))
    return doc


def schema_errors(doc: Doc) -> list[str]:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft7Validator(schema)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


def profile(doc: Doc, name: str | None) -> dict[str, Doc]:
    services: dict[str, Doc] = doc["services"]
    return {
        k: s
        for k, s in services.items()
        if (name in s.get("profiles", [])) or (name is None and "profiles" not in s)
    }


def names(doc: Doc) -> set[str]:
    """Every host name the Compose network resolves: service names and their aliases."""
    found = set(doc["services"])
    for service in doc["services"].values():
        for network in (service.get("networks") or {}).values():
            found |= set((network or {}).get("aliases", []))
    return found


def readme_vllm_flags() -> dict[str, list[str]]:
    """The README's vLLM command lines per arm, flags after --model/--port."""
    text = (REPO / "README.md").read_text(encoding="utf-8").replace("\\\n", " ")
    commands = [line for line in text.splitlines() if "vllm.entrypoints.openai.api_server" in line]
    flags = {}
    for line in commands:
        words = shlex.split(line.split("api_server", 1)[1])
        rest = _without_model_and_port(words)
        flags["speculative" if "--speculative-config" in rest else "baseline"] = rest
    return flags


def _without_model_and_port(words: list[str]) -> list[str]:
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in ("--model", "--port"):
            skip = True
        else:
            out.append(word)
    return out


def test_compose_file_is_valid_against_the_compose_spec() -> None:
    assert schema_errors(compose()) == []


@pytest.mark.parametrize(
    ("where", "key"),
    [
        (("services", "specproxy"), "portz"),
        (("services", "postgres", "healthcheck"), "tst"),
        ((), "service"),
    ],
)
def test_an_unknown_key_fails_the_schema(where: tuple[str, ...], key: str) -> None:
    doc = copy.deepcopy(compose())
    node = doc
    for step in where:
        node = node[step]
    node[key] = "x"
    errors = schema_errors(doc)
    assert errors and any(key in e for e in errors), errors


def test_services_healthchecks_restart_and_named_volumes() -> None:
    doc = compose()
    services = doc["services"]
    assert {"specproxy", "postgres", "prometheus", "alertmanager", "grafana"} <= set(
        profile(doc, None)
    )
    for name, service in services.items():
        assert service.get("restart") in ("unless-stopped", "always"), name
        assert service["healthcheck"]["test"], name
    declared = set(doc["volumes"])
    used = set()
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if not source.startswith((".", "/")):
                used.add(source)
    assert used == declared
    for stateful in ("specproxy", "postgres", "prometheus", "alertmanager", "grafana"):
        assert any(v.split(":")[0] in declared for v in services[stateful]["volumes"]), stateful


def test_only_the_proxy_and_grafana_publish_host_ports() -> None:
    published = {name for name, s in compose()["services"].items() if s.get("ports")}
    assert published == {"specproxy", "grafana"}


def test_gpu_profile_runs_the_readme_vllm_flags_on_reserved_gpus() -> None:
    doc = compose()
    gpu = profile(doc, "gpu")
    readme = readme_vllm_flags()
    assert set(readme) == {"speculative", "baseline"}
    assert set(gpu) == {"vllm-speculative", "vllm-baseline"}
    device_ids = []
    for arm, flags in readme.items():
        service = gpu[f"vllm-{arm}"]
        assert service["entrypoint"][-1] == "vllm.entrypoints.openai.api_server"
        assert _without_model_and_port(service["command"]) == flags
        [device] = service["deploy"]["resources"]["reservations"]["devices"]
        assert "gpu" in device["capabilities"] and device["driver"] == "nvidia"
        device_ids.append(device["device_ids"])
    assert device_ids[0] != device_ids[1]  # one GPU per arm


def test_demo_profile_runs_two_emulators_under_the_arms_names() -> None:
    doc = compose()
    demo = profile(doc, "demo")
    assert len(demo) == 2
    aliases = set()
    parser = argparse.ArgumentParser()
    emulator_cli.configure(parser)
    for service in demo.values():
        assert service["entrypoint"] == ["specproxy", "emulate"]
        cfg = emulator_cli.config_from_args(parser.parse_args(service["command"]))
        aliases |= set(service["networks"]["default"]["aliases"])
        arm = next(iter(service["networks"]["default"]["aliases"]))
        assert cfg.speculative == (arm == "vllm-speculative")
    assert aliases == {"vllm-baseline", "vllm-speculative"}
    assert (COMPOSE_DIR / ".env").read_text().count("COMPOSE_PROFILES=gpu") == 1


def test_proxy_settings_load_and_point_at_compose_names() -> None:
    doc = compose()
    proxy = doc["services"]["specproxy"]
    image_toml = (REPO / "deploy" / "docker" / "specproxy.toml").read_text()
    data = tomllib.loads(image_toml)
    env, _ = env_settings({k: str(v) for k, v in proxy["environment"].items()})
    cfg = Config.from_mapping({**data, **env, "store": {**data["store"], **env["store"]}})
    defined = names(doc)
    for url in (cfg.baseline_url, cfg.speculative_url, cfg.store.url):
        assert urlsplit(url).hostname in defined, url
    assert proxy["ports"] == [f"{cfg.port}:{cfg.port}"]
    assert str(cfg.port) in proxy["healthcheck"]["test"][-1]


def scrape_problems(doc: Doc, prometheus: Doc) -> list[str]:
    problems = []
    defined = names(doc)
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    if "specproxy" not in jobs:
        problems.append("no specproxy job")
    for job in jobs.values():
        for static in job["static_configs"]:
            for target in static["targets"]:
                host = target.rsplit(":", 1)[0]
                if host not in defined:
                    problems.append(f"{job['job_name']}: {host} is not a Compose service")
    proxy_targets = [
        t for s in jobs.get("specproxy", {}).get("static_configs", []) for t in s["targets"]
    ]
    if proxy_targets != ["specproxy:8000"]:
        problems.append(f"specproxy job scrapes {proxy_targets}, not the proxy's port")
    return problems


def test_prometheus_scrapes_the_compose_services() -> None:
    prometheus = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    doc = compose()
    assert scrape_problems(doc, prometheus) == []
    renamed = copy.deepcopy(doc)
    renamed["services"]["proxy"] = renamed["services"].pop("specproxy")
    assert any(
        "specproxy is not a Compose service" in p for p in scrape_problems(renamed, prometheus)
    )
    moved = copy.deepcopy(prometheus)
    moved["scrape_configs"][0]["static_configs"][0]["targets"] = ["specproxy:9000"]
    assert scrape_problems(doc, moved)


def test_prometheus_loads_the_rules_mounted_from_deploy_prometheus(tmp_path: Path) -> None:
    """promtool checks the Compose Prometheus config with the rules laid out as mounted."""
    prometheus = compose()["services"]["prometheus"]
    mounts = dict(
        v.rsplit(":", 1)[0].split(":", 1) for v in prometheus["volumes"] if v.startswith(".")
    )
    config_dir = Path("/etc/prometheus")
    for source, target in mounts.items():
        local = tmp_path / Path(target).relative_to(config_dir)
        src = (COMPOSE_DIR / source).resolve()
        if src.is_dir():
            shutil.copytree(src, local)
        else:
            shutil.copy(src, local)
    assert (tmp_path / "rules" / "specproxy.rules.yml").read_text() == (
        REPO / "deploy" / "prometheus" / "rules" / "specproxy.rules.yml"
    ).read_text()
    result = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout + result.stderr


def test_grafana_provisions_the_datasource_and_the_dashboard() -> None:
    grafana = compose()["services"]["grafana"]
    mounts = dict(
        v.rsplit(":", 1)[0].split(":", 1) for v in grafana["volumes"] if v.startswith(".")
    )
    by_target = {target: (COMPOSE_DIR / source).resolve() for source, target in mounts.items()}
    provider = yaml.safe_load(
        (by_target["/etc/grafana/provisioning/dashboards"] / "specproxy.yml").read_text()
    )
    dashboards_dir = by_target[provider["providers"][0]["options"]["path"]]
    assert (dashboards_dir / "specproxy.json").is_file()
    assert dashboards_dir == REPO / "dashboards"
    datasource = yaml.safe_load(
        (by_target["/etc/grafana/provisioning/datasources"] / "prometheus.yml").read_text()
    )
    url = urlsplit(datasource["datasources"][0]["url"])
    assert url.hostname in names(compose()) and url.port == 9090


def test_the_alerts_reach_the_stacks_alertmanager(tmp_path: Path) -> None:
    """Prometheus sends its alerts to the Compose Alertmanager, whose mounted config amtool
    accepts, and Grafana shows them (its Alertmanager datasource)."""
    doc = compose()
    prometheus = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    [target] = [
        t
        for am in prometheus["alerting"]["alertmanagers"]
        for static in am["static_configs"]
        for t in static["targets"]
    ]
    host, port = target.rsplit(":", 1)
    alertmanager = doc["services"][host]
    assert f"127.0.0.1:{port}/-/ready" in alertmanager["healthcheck"]["test"][-1]
    mounts = dict(
        v.rsplit(":", 1)[0].split(":", 1) for v in alertmanager["volumes"] if v.startswith(".")
    )
    [config] = [a.split("=", 1)[1] for a in alertmanager["command"] if a.startswith("--config")]
    source = {target: source for source, target in mounts.items()}[config]
    checked = subprocess.run(
        [require_binary("amtool"), "check-config", str(COMPOSE_DIR / source)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    routes = yaml.safe_load((COMPOSE_DIR / source).read_text())
    assert routes["route"]["receiver"] in {r["name"] for r in routes["receivers"]}
    datasources = yaml.safe_load(
        (COMPOSE_DIR / "grafana" / "datasources" / "prometheus.yml").read_text()
    )["datasources"]
    [am] = [d for d in datasources if d["type"] == "alertmanager"]
    assert am["url"] == f"http://{target}"
