"""Kafka TLS / SASL: FAILSLOW_KAFKA_* settings and flags, mapped once to confluent-kafka and
to faust/aiokafka; every process through a real TLS listener.

Tansu 0.6 serves neither TLS (--cert is accepted, the listener stays plain TCP) nor
SASL that a client can use (with --authentication and memory storage every mechanism
gets NoSharedMechanism, and `tansu user create` cannot authenticate to add the first
user), so TLS runs through a TLS-terminating proxy with a test CA (tests/tls_support.py)
and SASL is tested as far as the configuration both clients receive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest
from tls_support import TLSProxy, make_ca

from failslow.config import resolve
from failslow.errors import ConfigError
from failslow.stack import create_topics, free_port, start_broker
from schema import Topics, kafka_security
from schema.kafka_security import KafkaSecurity, client_conf

# -- the mapping -----------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _plaintext_after():
    yield
    kafka_security.use(kafka_security.PLAINTEXT)


@pytest.mark.parametrize("mech", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("tls", [False, True])
def test_sasl_maps_to_both_clients(mech, tls, tmp_path):
    ca = tmp_path / "ca.pem"
    sec = KafkaSecurity(sasl_mechanism=mech, username="u", password="s3cret",
                        ca_file=str(ca) if tls else None)
    proto = "SASL_SSL" if tls else "SASL_PLAINTEXT"
    conf = sec.confluent()
    assert conf["security.protocol"] == proto and conf["sasl.mechanism"] == mech
    assert (conf["sasl.username"], conf["sasl.password"]) == ("u", "s3cret")
    assert ("ssl.ca.location" in conf) == tls
    if not tls:
        # faust hands its credentials to aiokafka through this function: the same settings.
        from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

        auth = dict(credentials_to_aiokafka_auth(sec.faust_credentials()))
        assert auth == {"security_protocol": proto, "sasl_mechanism": mech,
                        "sasl_plain_username": "u", "sasl_plain_password": "s3cret",
                        "ssl_context": None}
        assert {k: v for k, v in sec.aiokafka().items()} == {
            k: v for k, v in auth.items() if k != "ssl_context"}
    assert "s3cret" not in repr(sec) and "s3cret" not in sec.describe()


def test_tls_maps_to_both_clients(tmp_path):
    ca = make_ca(tmp_path / "ca")
    sec = KafkaSecurity(ca_file=str(ca.ca), cert_file=str(ca.client_cert),
                        key_file=str(ca.client_key))
    assert sec.confluent() == {
        "security.protocol": "SSL", "ssl.ca.location": str(ca.ca),
        "ssl.certificate.location": str(ca.client_cert), "ssl.key.location": str(ca.client_key),
        "ssl.endpoint.identification.algorithm": "https"}
    kw = sec.aiokafka()
    assert kw["security_protocol"] == "SSL" and kw["ssl_context"].check_hostname
    off = KafkaSecurity(tls=True, verify_hostname=False)
    assert off.confluent()["ssl.endpoint.identification.algorithm"] == "none"
    assert not off.ssl_context().check_hostname


def test_settings_from_variables_flags_and_files(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    env = {"FAILSLOW_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "FAILSLOW_KAFKA_USERNAME": "svc",
           "FAILSLOW_KAFKA_PASSWORD": "from-env", "FAILSLOW_KAFKA_CA_FILE": "/ca.pem",
           "FAILSLOW_KAFKA_VERIFY_HOSTNAME": "0"}
    s = resolve(None, env)
    assert s.kafka.protocol == "SASL_SSL" and s.kafka.password == "from-env"
    assert not s.kafka.verify_hostname
    assert client_conf("b:9093")["sasl.password"] == "from-env"  # resolve() set it process-wide
    env["FAILSLOW_KAFKA_PASSWORD_FILE"] = str(secret)
    assert resolve(None, env).kafka.password == "from-file"
    import argparse

    args = argparse.Namespace(kafka_username="flag-user", kafka_security_protocol="SASL_PLAINTEXT")
    s = resolve(args, env)
    assert (s.kafka.username, s.kafka.protocol) == ("flag-user", "SASL_PLAINTEXT")
    assert "from-file" not in repr(s)
    with pytest.raises(ConfigError, match="username and a password"):
        resolve(None, {"FAILSLOW_KAFKA_SASL_MECHANISM": "PLAIN"})
    with pytest.raises(ConfigError, match="both a cert file and a key file"):
        resolve(None, {"FAILSLOW_KAFKA_CERT_FILE": "/c.pem"})
    with pytest.raises(ConfigError, match="unknown SASL mechanism"):
        resolve(None, {"FAILSLOW_KAFKA_SASL_MECHANISM": "GSSAPI", "FAILSLOW_KAFKA_USERNAME": "u",
                       "FAILSLOW_KAFKA_PASSWORD": "p"})
    with pytest.raises(ConfigError, match="FAILSLOW_KAFKA_PASSWORD_FILE"):
        resolve(None, {"FAILSLOW_KAFKA_PASSWORD_FILE": str(tmp_path / "missing")})


def test_log_lines_mask_the_resolved_secrets(caplog, tmp_path):
    import logging

    pw = tmp_path / "ch-pw"
    pw.write_text("ch-secret-from-file")
    resolve(None, {"FAILSLOW_KAFKA_USERNAME": "u", "FAILSLOW_KAFKA_PASSWORD": "kafka-secret",
                   "FAILSLOW_CLICKHOUSE_PASSWORD_FILE": str(pw),
                   "FAILSLOW_PAGERDUTY_ROUTING_KEY": "routing-key-123"})
    log = logging.getLogger("failslow.test")
    with caplog.at_level(logging.INFO, logger="failslow.test"):
        log.info("sasl %s, ch %s, pd %s", "kafka-secret", "ch-secret-from-file", "routing-key-123")
        log.info("url clickhouse://u:%s@h:9000/db", "inline-pw")
    text = caplog.text
    for secret in ("kafka-secret", "ch-secret-from-file", "routing-key-123", "inline-pw"):
        assert secret not in text
    assert text.count("***") == 4


def test_help_names_the_settings_and_shows_no_secret():
    env = dict(os.environ, FAILSLOW_KAFKA_PASSWORD="hunter2-kafka",
               FAILSLOW_CLICKHOUSE_PASSWORD="hunter2-ch")
    for cmd in ("worker", "sink", "notify", "replay", "collect", "up", "query"):
        out = subprocess.run([sys.executable, "-m", "failslow.cli", cmd, "--help"],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        for flag in ("--kafka-ca-file", "--kafka-cert-file", "--kafka-sasl-mechanism",
                     "--kafka-password-file", "--clickhouse-password-file"):
            assert flag in out.stdout, (cmd, flag)
        assert "hunter2" not in out.stdout + out.stderr


# -- a real TLS listener ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    """Tansu behind a TLS proxy that requires a client certificate; Tansu advertises the
    proxy, so no client ever reaches the plain port after bootstrap."""
    ca = make_ca(tmp_path_factory.mktemp("kafka-ca"))
    proxy_port = free_port()
    broker = start_broker(advertised_port=proxy_port)
    proxy = TLSProxy(ca, proxy_port, broker.port).start()
    try:
        yield ca, proxy, f"127.0.0.1:{proxy_port}"
    finally:
        proxy.stop()
        broker.stop(timeout=2)


def _tls_env(ca, **extra: str) -> dict[str, str]:
    return {**os.environ, "FAILSLOW_KAFKA_CA_FILE": str(ca.ca),
            "FAILSLOW_KAFKA_CERT_FILE": str(ca.client_cert),
            "FAILSLOW_KAFKA_KEY_FILE": str(ca.client_key), "PYTHONUNBUFFERED": "1", **extra}


def test_wrong_ca_or_no_client_certificate_is_refused(tls_broker):
    ca, proxy, bootstrap = tls_broker
    from confluent_kafka.admin import AdminClient

    for sec in (KafkaSecurity(ca_file=str(ca.other_ca), cert_file=str(ca.client_cert),
                              key_file=str(ca.client_key)),
                KafkaSecurity(ca_file=str(ca.ca)),
                KafkaSecurity()):
        kafka_security.use(sec)
        before = proxy.handshakes_failed
        with pytest.raises(Exception):  # noqa: B017 - librdkafka's KafkaException
            AdminClient(client_conf(bootstrap, {"socket.timeout.ms": 1000})).list_topics(timeout=3)
        assert proxy.handshakes_failed > before, sec.describe()


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "failslow.cli", *args], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(5)
    return proc.returncode


def test_every_process_works_through_tls(tls_broker, tmp_path):
    """replay (the collectors' publisher) -> worker (faust/aiokafka + confluent) -> incidents
    -> sink (chdb) and notify (console), all over mutual TLS with hostname verification."""
    from simulator import FaultSpec, JobSpec, Scenario, simulate

    ca, proxy, bootstrap = tls_broker
    kafka_security.use(KafkaSecurity(ca_file=str(ca.ca), cert_file=str(ca.client_cert),
                                     key_file=str(ca.client_key)))
    topics = Topics(prefix=f"tls{uuid.uuid4().hex[:8]}.")
    create_topics(bootstrap, topics, partitions=2)
    trace = tmp_path / "trace.jsonl"
    scenario = Scenario("tls", "8 ranks, one 30 % slower from step 15",
                        (JobSpec(job_id="tls-job", hosts=1, step_s=1.0),),
                        faults=(FaultSpec("gpu_clock", 15.0, None, 0.3, rank=5, job="tls-job"),),
                        steps=45)
    with trace.open("wb") as f:
        for ev in simulate(scenario, seed=3).events():
            f.write(orjson.dumps(ev) + b"\n")

    env = _tls_env(ca)
    conn = ["--bootstrap", bootstrap, "--topic-prefix", topics.prefix, "--home", str(tmp_path),
            "--clickhouse", f"chdb://{tmp_path / 'chdb'}"]
    worker = _spawn(["worker", *conn, "--group", "tls-worker", "--log-level", "warning"],
                    tmp_path / "worker.log", env)
    sink = _spawn(["sink", *conn, "--group", "tls-sink"], tmp_path / "sink.log", env)
    notify = _spawn(["notify", *conn, "--console", "--state-dir", str(tmp_path / "notify"),
                     "--group", "tls-notify"], tmp_path / "notify.log", env)
    try:
        rc = subprocess.run([sys.executable, "-m", "failslow.cli", "replay", str(trace), *conn],
                            capture_output=True, text=True, env=env, timeout=120)
        assert rc.returncode == 0, rc.stderr
        found: list[dict] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not found:
            for p, name in ((worker, "worker"), (sink, "sink"), (notify, "notify")):
                assert p.poll() is None, (tmp_path / f"{name}.log").read_text()[-2000:]
            if (tmp_path / "chdb.owner.json").exists():
                q = subprocess.run([sys.executable, "-m", "failslow.cli", "query", *conn,
                                    "--format", "json", "SELECT job_id, rank, fault FROM "
                                    "failslow.incidents_current WHERE severity != 'info'"],
                                   capture_output=True, text=True, env=env, timeout=60)
                assert q.returncode == 0, q.stderr
                found = [orjson.loads(x) for x in q.stdout.splitlines()]
            time.sleep(1.0)
        assert found, (tmp_path / "worker.log").read_text()[-3000:]
        assert {(r["job_id"], r["rank"], r["fault"]) for r in found} == {("tls-job", 5, "slow_rank")}
        deadline = time.monotonic() + 30
        while "tls-job" not in (tmp_path / "notify.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "tls-job" in (tmp_path / "notify.log").read_text()
    finally:
        codes = [_stop(p) for p in (worker, sink, notify)]
    assert codes == [0, 0, 0]
    assert proxy.connections > 0
