"""The production shape: docker-compose.yml runs real failslow commands against Kafka and a
ClickHouse server, with settings the commands understand."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import yaml

from failslow.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent


def test_compose_services_run_valid_failslow_commands():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"kafka", "clickhouse", "worker", "sink", "notify", "migrate"} <= set(services)
    for name in ("worker", "sink", "notify", "migrate"):
        cmd = services[name]["command"]
        assert cmd[0] == "failslow"
        args = build_parser(cmd[1:]).parse_args(cmd[1:])
        assert args.command == cmd[1]
        env = services[name]["environment"]
        assert env["FAILSLOW_BOOTSTRAP"] == "kafka:9092"
        assert env["FAILSLOW_CLICKHOUSE"].startswith("clickhouse://")


def test_compose_kafka_is_kraft_without_initial_rebalance_delay():
    kafka = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["kafka"]
    env = kafka["environment"]
    assert "controller" in env["KAFKA_PROCESS_ROLES"]
    assert str(env["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"]) == "0"
    assert "apache/kafka" in kafka["image"]


def test_image_installs_every_package():
    dockerfile = (ROOT / "Dockerfile").read_text()
    for pkg in ("failslow", "schema", "simulator", "collectors", "models", "streams", "storage",
                "alerting"):
        assert f"COPY {pkg} {pkg}" in dockerfile


def test_compose_publishes_on_loopback_and_has_no_default_password():
    text = (ROOT / "docker-compose.yml").read_text()
    services = yaml.safe_load(text)["services"]
    published = [(name, port) for name, svc in services.items() for port in svc.get("ports", [])]
    assert published
    for name, port in published:
        assert str(port).startswith("${FAILSLOW_BIND:-127.0.0.1}:"), (name, port)
    ch = services["clickhouse"]["environment"]
    assert ch["CLICKHOUSE_PASSWORD"].startswith("${CLICKHOUSE_PASSWORD:?")
    for name in ("worker", "sink", "notify", "migrate"):
        env = services[name]["environment"]
        url = urlsplit(env["FAILSLOW_CLICKHOUSE"])
        assert url.username and url.password is None, "no password inside the URL"
        assert env["FAILSLOW_CLICKHOUSE_PASSWORD"].startswith("${CLICKHOUSE_PASSWORD:?")
        assert "FAILSLOW_KAFKA_SASL_MECHANISM" in env and "FAILSLOW_KAFKA_CA_FILE" in env
    # Anywhere in the file, comments included: no example default password to copy.
    assert "failslow:failslow@" not in text and "--password failslow" not in text


def test_compose_grafana_is_provisioned_on_loopback_with_a_required_password():
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    grafana = services["grafana"]
    assert grafana["ports"] == ["${FAILSLOW_BIND:-127.0.0.1}:3000:3000"]
    env = grafana["environment"]
    assert env["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert env["CLICKHOUSE_PASSWORD"].startswith("${CLICKHOUSE_PASSWORD:?")
    assert "grafana-clickhouse-datasource" in env["GF_PLUGINS_PREINSTALL_SYNC"].split(",")
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert grafana["depends_on"]["clickhouse"]["condition"] == "service_healthy"
    mounts = {}
    for volume in grafana["volumes"]:
        source, target, *mode = volume.split(":")
        mounts[target] = (source, mode)
    provisioning = mounts["/etc/grafana/provisioning"]
    assert provisioning == ("./deploy/grafana/provisioning", ["ro"])
    assert (ROOT / provisioning[0]).is_dir()

    # The dashboards provider reads the folder compose mounts, and that folder holds them.
    (provider,) = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/failslow.yaml").read_text())["providers"]
    source, mode = mounts[provider["options"]["path"]]
    assert mode == ["ro"] and sorted(p.name for p in (ROOT / source).glob("*.json")) == [
        "device.json", "job.json", "overview.json"]
    assert env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"].startswith(provider["options"]["path"])

    # The datasource: the compose ClickHouse, its user, its password from the environment.
    (ds,) = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/clickhouse.yaml").read_text())[
        "datasources"]
    assert ds["type"] == "grafana-clickhouse-datasource" and ds["uid"] == "failslow-clickhouse"
    assert ds["jsonData"]["host"] == "clickhouse" and ds["jsonData"]["port"] == 9000
    ch_env = services["clickhouse"]["environment"]
    assert ds["jsonData"]["username"] == ch_env["CLICKHOUSE_USER"]
    assert ds["jsonData"]["defaultDatabase"] == ch_env["CLICKHOUSE_DB"]
    assert ds["secureJsonData"]["password"] == "$CLICKHOUSE_PASSWORD"
