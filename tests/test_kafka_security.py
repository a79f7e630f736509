"""Kafka TLS / SASL: FAILSLOW_KAFKA_* settings and flags, mapped once to confluent-kafka and
to faust/aiokafka; every process through a real TLS listener and a real SASL listener.

Tansu 0.6 serves neither TLS (--cert is accepted, the listener stays plain TCP) nor
SASL that a client can use (with --authentication and memory storage every mechanism
gets NoSharedMechanism, and `tansu user create` cannot authenticate to add the first
user), so both are terminated by proxies in front of the real Tansu, which advertises
the proxy's address so that every connection after bootstrap goes through it too:

- TLS: tests/tls_support.py, with a test CA made by openssl in the test (mutual TLS,
  host name checked);
- SASL: tests/sasl_support.py speaks the Kafka protocol's authentication on each client
  connection (ApiVersions forwarded to Tansu, SaslHandshake v1, SaslAuthenticate v0-2
  with PLAIN or a SCRAM-SHA-256/512 server exchange, wrong password -> error 58 and the
  connection closed) and pipes the bytes to Tansu only after a successful login; with the
  test CA it is SASL_SSL.

Tested through them: each mechanism over SASL_PLAINTEXT and SASL_SSL with both clients
(a produce + consume round trip), every process (replay, worker, sink, notify, query)
over mutual TLS and over SASL_SSL SCRAM-SHA-512, and a wrong password refused with one
line, exit status 2 and no password in the output.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest
from sasl_support import SASLProxy, ScramServer
from tls_support import TestCA, TLSProxy, make_ca

from failslow import config
from failslow.config import resolve
from failslow.errors import ConfigError
from failslow.schema import Topics, kafka_security
from failslow.schema.kafka_security import KafkaSecurity, client_conf
from failslow.stack import create_topics, free_port, start_broker

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
    # each command names the flags of the settings it reads (config.FLAG_SETS), no others
    named = {config.KAFKA_SECURITY: ("--kafka-ca-file", "--kafka-cert-file",
                                     "--kafka-sasl-mechanism", "--kafka-password-file"),
             config.CLICKHOUSE: ("--clickhouse-password-file",)}
    for cmd in ("worker", "sink", "notify", "replay", "collect", "up", "query"):
        out = subprocess.run([sys.executable, "-m", "failslow.cli", cmd, "--help"],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        sets = config.flag_sets(cmd)
        for group, flags in named.items():
            for flag in flags:
                assert (flag in out.stdout) == (group in sets), (cmd, flag)
        assert "hunter2" not in out.stdout + out.stderr


def test_a_refused_login_is_one_error_without_the_password(caplog):
    """client_conf's error_cb turns librdkafka's refused SASL login (which librdkafka itself
    retries forever) into KafkaAuthError, a FailslowError: one line from the command line;
    the publisher (collect, replay) keeps its own error_cb and logs the refusal once."""
    import logging

    from confluent_kafka import KafkaError

    from failslow.collectors.publisher import Publisher
    from failslow.errors import FailslowError

    kafka_security.use(KafkaSecurity(sasl_mechanism="SCRAM-SHA-256", username="u",
                                     password="s3cret-x"))

    def refused(ms: int) -> KafkaError:
        return KafkaError(KafkaError._AUTHENTICATION, "sasl_ssl://b:9093/bootstrap: SASL "
                          f"authentication error: bad s3cret-x (after {ms}ms in state AUTH_REQ)")

    exc = kafka_security.auth_error(refused(8))
    assert isinstance(exc, FailslowError)
    assert "s3cret-x" not in str(exc) and "(SASL SCRAM-SHA-256 user u)" in str(exc)
    assert kafka_security.auth_error(KafkaError(KafkaError._TRANSPORT)) is None
    cb = client_conf("b:9093")["error_cb"]
    cb(KafkaError(KafkaError._ALL_BROKERS_DOWN))  # other errors: librdkafka retries
    with pytest.raises(kafka_security.KafkaAuthError):
        cb(refused(8))
    import threading

    in_thread: list[BaseException] = []

    def background() -> None:
        try:
            cb(refused(9))
        except BaseException as exc:  # noqa: BLE001 - what the test looks for
            in_thread.append(exc)

    t = threading.Thread(target=background)
    t.start()
    t.join()
    assert in_thread == []  # a background thread's client keeps librdkafka's retries
    kafka_security.use(KafkaSecurity())
    assert "error_cb" not in client_conf("b:9092")  # no SASL: librdkafka's default
    pub = Publisher("127.0.0.1:1")
    try:
        with caplog.at_level(logging.INFO, logger="failslow.collectors.publisher"):
            for ms in (8, 9, 14, 10):
                pub._on_error(refused(ms))
                pub._on_error(KafkaError(KafkaError._RESOLVE, "kafka-9.example: resolve failed"))
    finally:
        pub.close(timeout=0)
    assert caplog.text.count("SASL authentication error") == 1
    assert caplog.text.count("resolve failed") == 1


def test_the_proxys_scram_server_follows_rfc_7677():
    """The worked SCRAM-SHA-256 example of RFC 7677 section 3, server side; a wrong proof
    or a wrong nonce is refused."""
    server = ScramServer("SCRAM-SHA-256", {"user": "pencil"},
                         nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
                         salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))
    assert server.first("n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == (
        "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    final = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p="
    proof = "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    assert server.final(final + proof) == "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.final(final + proof.replace("d", "e", 1)) is None
    assert server.final(final.replace("k0,", "k1,") + proof) is None
    assert ScramServer("SCRAM-SHA-512", {"user": "pencil"}).first("n,,n=other,r=x") is None


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


def _every_process(bootstrap: str, env: dict[str, str], tmp_path: Path, name: str) -> None:
    """replay (the collectors' publisher) -> worker (faust/aiokafka + confluent) -> incidents
    -> sink (chdb) and notify (console), query reading the sink and status reading the
    broker, all with ``env``'s Kafka security against ``bootstrap``; no output or log holds
    the SASL password."""
    from failslow.simulator import FaultSpec, JobSpec, Scenario, simulate

    topics = Topics(prefix=f"{name}{uuid.uuid4().hex[:8]}.")
    create_topics(bootstrap, topics, partitions=2)
    job = f"{name}-job"
    trace = tmp_path / "trace.jsonl"
    scenario = Scenario(name, "8 ranks, one 30 % slower from step 15",
                        (JobSpec(job_id=job, hosts=1, step_s=1.0),),
                        faults=(FaultSpec("gpu_clock", 15.0, None, 0.3, rank=5, job=job),),
                        steps=45)
    with trace.open("wb") as f:
        for ev in simulate(scenario, seed=3).events():
            f.write(orjson.dumps(ev) + b"\n")

    conn = ["--bootstrap", bootstrap, "--topic-prefix", topics.prefix, "--home", str(tmp_path),
            "--clickhouse", f"chdb://{tmp_path / 'chdb'}"]
    worker = _spawn(["worker", *conn, "--group", f"{name}-worker", "--log-level", "warning"],
                    tmp_path / "worker.log", env)
    sink = _spawn(["sink", *conn, "--group", f"{name}-sink"], tmp_path / "sink.log", env)
    notify = _spawn(["notify", *conn, "--console", "--state-dir", str(tmp_path / "notify"),
                     "--group", f"{name}-notify"], tmp_path / "notify.log", env)
    outputs: list[str] = []
    try:
        rc = subprocess.run([sys.executable, "-m", "failslow.cli", "replay", str(trace),
                             *conn[:6]],  # replay talks to Kafka only: no --clickhouse
                            capture_output=True, text=True, env=env, timeout=120)
        outputs.append(rc.stdout + rc.stderr)
        assert rc.returncode == 0, rc.stderr
        found: list[dict] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not found:
            for p, proc in ((worker, "worker"), (sink, "sink"), (notify, "notify")):
                assert p.poll() is None, (tmp_path / f"{proc}.log").read_text()[-2000:]
            if (tmp_path / "chdb.owner.json").exists():
                q = subprocess.run([sys.executable, "-m", "failslow.cli", "query", *conn,
                                    "--format", "json", "SELECT job_id, rank, fault FROM "
                                    "failslow.incidents_current WHERE severity != 'info'"],
                                   capture_output=True, text=True, env=env, timeout=60)
                outputs.append(q.stdout + q.stderr)
                assert q.returncode == 0, q.stderr
                found = [orjson.loads(x) for x in q.stdout.splitlines()]
            time.sleep(1.0)
        assert found, (tmp_path / "worker.log").read_text()[-3000:]
        assert {(r["job_id"], r["rank"], r["fault"]) for r in found} == {(job, 5, "slow_rank")}
        # status reads the broker (metadata, end offsets, the groups' lag) the same way
        st = subprocess.run([sys.executable, "-m", "failslow.cli", "status", *conn, "--format",
                             "json"], capture_output=True, text=True, env=env, timeout=60)
        outputs.append(st.stdout + st.stderr)
        report = orjson.loads(st.stdout)
        assert report["broker"]["ok"], report
        assert report["topics"] and all(t["exists"] for t in report["topics"]), report
        deadline = time.monotonic() + 30
        while job not in (tmp_path / "notify.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert job in (tmp_path / "notify.log").read_text()
    finally:
        codes = [_stop(p) for p in (worker, sink, notify)]
    assert codes == [0, 0, 0]
    password = env.get("FAILSLOW_KAFKA_PASSWORD") or ""
    if env.get("FAILSLOW_KAFKA_PASSWORD_FILE"):
        password = Path(env["FAILSLOW_KAFKA_PASSWORD_FILE"]).read_text().strip()
    if password:
        for log in ("worker", "sink", "notify"):
            outputs.append((tmp_path / f"{log}.log").read_text())
        assert not [o for o in outputs if password in o]


def test_every_process_works_through_tls(tls_broker, tmp_path):
    """Every process over mutual TLS with hostname verification."""
    ca, proxy, bootstrap = tls_broker
    kafka_security.use(KafkaSecurity(ca_file=str(ca.ca), cert_file=str(ca.client_cert),
                                     key_file=str(ca.client_key)))
    _every_process(bootstrap, _tls_env(ca), tmp_path, "tls")
    assert proxy.connections > 0


# -- a real SASL listener -----------------------------------------------------------------

USER, PASSWORD = "failslow-svc", "sasl-Pw-7f3e91"


@pytest.fixture(scope="module")
def sasl_brokers(tmp_path_factory):
    """Two Tansu brokers, one behind a SASL_PLAINTEXT proxy and one behind a SASL_SSL proxy
    (tests/sasl_support.py: the proxy authenticates PLAIN / SCRAM-SHA-256 / SCRAM-SHA-512
    itself, then pipes to Tansu); each Tansu advertises its proxy. -> {tls: (proxy,
    bootstrap)} and the CA."""
    ca = make_ca(tmp_path_factory.mktemp("sasl-ca"))
    started: list = []
    out = {}
    try:
        for tls in (False, True):
            port = free_port()
            broker = start_broker(advertised_port=port)
            started.append(broker)
            proxy = SASLProxy(port, broker.port, {USER: PASSWORD},
                              ca=ca if tls else None).start()
            started.append(proxy)
            out[tls] = (proxy, f"127.0.0.1:{port}")
        yield out, ca
    finally:
        for thing in reversed(started):
            if isinstance(thing, SASLProxy):
                thing.stop()
            else:
                thing.stop(timeout=2)


def _sasl(mech: str, tls: bool, ca: TestCA, password: str = PASSWORD) -> KafkaSecurity:
    return KafkaSecurity(sasl_mechanism=mech, username=USER, password=password,
                         ca_file=str(ca.ca) if tls else None)


def _confluent_round_trip(bootstrap: str, topic: str, value: bytes) -> list[bytes]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer(client_conf(bootstrap))
    producer.produce(topic, value)
    assert producer.flush(15) == 0
    consumer = Consumer(client_conf(bootstrap, {"group.id": "sasl-matrix",
                                                "enable.auto.commit": False}))
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline and len(got) < 1:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg.value())
    finally:
        consumer.close()
    return got


def _aiokafka_round_trip(bootstrap: str, sec: KafkaSecurity, topic: str, value: bytes,
                         want: int = 2) -> list[bytes]:
    """Produce ``value`` to partition 0, then read the partition from the start until
    ``want`` records came back (or 20 s passed)."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    async def trip() -> list[bytes]:
        # the keyword arguments faust hands to aiokafka (test_sasl_maps_to_both_clients)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **sec.aiokafka())
        await producer.start()
        try:
            await producer.send_and_wait(topic, value, partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, **sec.aiokafka())
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            consumer.seek(TopicPartition(topic, 0), 0)
            got: list[bytes] = []
            deadline = time.monotonic() + 20
            while len(got) < want and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=1000)
                got += [m.value for msgs in batch.values() for m in msgs]
            return got
        finally:
            await consumer.stop()

    return asyncio.run(asyncio.wait_for(trip(), 60))


@pytest.mark.integration
@pytest.mark.parametrize("tls", [False, True], ids=["SASL_PLAINTEXT", "SASL_SSL"])
@pytest.mark.parametrize("mech", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_each_mechanism_with_both_clients(sasl_brokers, mech, tls):
    """A produce + consume round trip with confluent-kafka and with aiokafka (faust's
    client) through a real SASL login, over plaintext and over TLS."""
    brokers, ca = sasl_brokers
    proxy, bootstrap = brokers[tls]
    sec = _sasl(mech, tls, ca)
    kafka_security.use(sec)
    topic = f"sasl-{mech.lower()}-{uuid.uuid4().hex[:6]}"
    create_topics(bootstrap, Topics(prefix=topic + "."), partitions=1)
    topic = Topics(prefix=topic + ".").all()[0]
    before = proxy.authenticated.get(mech, 0)
    assert _confluent_round_trip(bootstrap, topic, b"from-confluent") == [b"from-confluent"]
    after_confluent = proxy.authenticated.get(mech, 0)
    assert after_confluent > before
    got = _aiokafka_round_trip(bootstrap, sec, topic, b"from-aiokafka")
    assert got == [b"from-confluent", b"from-aiokafka"]
    assert proxy.authenticated.get(mech, 0) > after_confluent
    # Tansu's own ApiVersions answer lists the SASL requests both clients need.
    assert proxy.advertised == {17: (0, 1), 36: (0, 2)}
    # both clients use SaslHandshake v1 + SaslAuthenticate: no unframed v0 tokens
    assert proxy.legacy_handshakes == 0
    assert {v for key, v in proxy.sasl_versions if key == 17} == {1}, proxy.sasl_versions


@pytest.mark.integration
def test_no_or_wrong_credentials_get_nothing(sasl_brokers):
    """The proxy is a real gate: a client without SASL, or with a wrong password (either
    client), never reaches Tansu."""
    brokers, ca = sasl_brokers
    proxy, bootstrap = brokers[False]
    from confluent_kafka.admin import AdminClient

    kafka_security.use(KafkaSecurity())
    before = proxy.refused_unauthenticated
    with pytest.raises(Exception):  # noqa: B017 - librdkafka's KafkaException
        AdminClient(client_conf(bootstrap, {"log_level": 0})).list_topics(timeout=3)
    assert proxy.refused_unauthenticated > before
    for mech in ("PLAIN", "SCRAM-SHA-512"):
        wrong = _sasl(mech, False, ca, password="not-the-password")
        kafka_security.use(wrong)
        before = proxy.failed
        admin = AdminClient(client_conf(bootstrap, {"log_level": 0}))
        with pytest.raises(Exception):  # noqa: B017 - a transport failure
            admin.list_topics(timeout=3)
        assert proxy.failed > before
        # the reason librdkafka queued: the refused login, without the password
        err = kafka_security.refused(admin)
        assert err is not None and "not-the-password" not in str(err), err
        assert f"SASL {mech} user {USER}" in str(err)
        before = proxy.failed
        from aiokafka.errors import KafkaError as AioKafkaError

        with pytest.raises(AioKafkaError):
            _aiokafka_round_trip(bootstrap, wrong, "any", b"x")
        assert proxy.failed > before


@pytest.mark.integration
def test_every_process_works_through_sasl_ssl(sasl_brokers, tmp_path):
    """Every process over SASL_SSL with SCRAM-SHA-512 (password from a 0600 file),
    the broker's certificate and host name checked against the test CA."""
    brokers, ca = sasl_brokers
    proxy, bootstrap = brokers[True]
    kafka_security.use(_sasl("SCRAM-SHA-512", True, ca))
    pw = tmp_path / "kafka-password"
    pw.write_text(PASSWORD + "\n")
    pw.chmod(0o600)
    env = {**os.environ, "FAILSLOW_KAFKA_CA_FILE": str(ca.ca),
           "FAILSLOW_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "FAILSLOW_KAFKA_USERNAME": USER,
           "FAILSLOW_KAFKA_PASSWORD_FILE": str(pw), "PYTHONUNBUFFERED": "1"}
    env.pop("FAILSLOW_KAFKA_PASSWORD", None)
    failed, before = proxy.failed, proxy.authenticated.get("SCRAM-SHA-512", 0)
    _every_process(bootstrap, env, tmp_path, "sasl")
    assert proxy.authenticated.get("SCRAM-SHA-512", 0) > before
    assert proxy.failed == failed


@pytest.mark.integration
def test_a_wrong_password_stops_a_command_with_one_line(sasl_brokers, tmp_path):
    """notify (a long-running confluent-kafka consumer) and the worker (its first metadata
    request) exit 2 with one line naming the refused login; status reports it as the
    broker's problem; none prints the password."""
    brokers, ca = sasl_brokers
    proxy, bootstrap = brokers[True]
    wrong = "wrong-Pw-c0ffee"
    env = {**os.environ, "FAILSLOW_KAFKA_CA_FILE": str(ca.ca),
           "FAILSLOW_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "FAILSLOW_KAFKA_USERNAME": USER,
           "FAILSLOW_KAFKA_PASSWORD": wrong, "PYTHONUNBUFFERED": "1"}
    env.pop("FAILSLOW_KAFKA_PASSWORD_FILE", None)
    conn = ["--bootstrap", bootstrap, "--home", str(tmp_path)]
    before = proxy.failed
    # the worker waits 10 s for the metadata it cannot get: it runs alongside the rest
    worker = subprocess.Popen([sys.executable, "-m", "failslow.cli", "worker", *conn],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env, stdin=subprocess.DEVNULL)
    out = subprocess.run([sys.executable, "-m", "failslow.cli", "notify", *conn, "--console",
                          "--state-dir", str(tmp_path / "notify")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr[-2000:]
    # failslow says it once, as its last line (librdkafka's own log lines, ``%3|...|FAIL|``
    # from its threads, may come before or after it, and a thread's line written in two
    # pieces may leave an empty line after ours: one CI run saw that)
    ours = [x for x in out.stderr.splitlines() if x.strip() and not x.startswith("%")]
    assert ours and sum("refused" in x for x in ours) == 1, out.stderr[-3000:]
    assert ours[-1].startswith("failslow notify: the Kafka broker refused the credentials "
                               f"(SASL SCRAM-SHA-512 user {USER}): "), ours
    assert "Authentication failed" in ours[-1]
    assert wrong not in out.stdout + out.stderr
    assert proxy.failed > before
    status = subprocess.run([sys.executable, "-m", "failslow.cli", "status", *conn],
                            capture_output=True, text=True, env=env, timeout=60)
    assert status.returncode != 0
    broker_line = next(x for x in status.stdout.splitlines() if x.startswith("broker"))
    assert "DOWN: the Kafka broker refused the credentials" in broker_line, status.stdout
    assert wrong not in status.stdout + status.stderr
    try:
        worker_out, _ = worker.communicate(timeout=90)
    finally:
        _stop(worker)
    assert worker.returncode == 2, worker_out[-3000:]
    last = [x for x in worker_out.splitlines() if not x.startswith("%")][-1]
    assert last.startswith("failslow worker: the Kafka broker refused the credentials "
                           f"(SASL SCRAM-SHA-512 user {USER}): "), worker_out[-3000:]
    assert wrong not in worker_out
