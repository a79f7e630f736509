"""Settings, resolved in one place: command-line flag > FAILSLOW_* variable > default.

Library code never reads the environment; entry points call ``resolve`` and pass
plain values down. Secrets are kept out of ``__repr__`` so they never reach a log.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from failslow import secrets
from failslow.errors import ConfigError
from failslow.home import private_home
from failslow.schema import kafka_security
from failslow.schema.kafka_security import MECHANISMS, PROTOCOLS, KafkaSecurity, KafkaSecurityError

DEFAULT_PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
STATE_FILE = "stack.json"


@dataclass(frozen=True)
class Settings:
    home: Path
    bootstrap: str
    topic_prefix: str
    clickhouse: str
    slack_webhook_url: str | None = field(default=None, repr=False)
    pagerduty_routing_key: str | None = field(default=None, repr=False)
    pagerduty_url: str = DEFAULT_PAGERDUTY_URL
    webhook_url: str | None = field(default=None, repr=False)
    kafka: KafkaSecurity = field(default_factory=KafkaSecurity)
    clickhouse_password: str | None = field(default=None, repr=False)
    clickhouse_ca_file: str | None = None
    clickhouse_verify: bool = True


HOME, BROKER, KAFKA_SECURITY, CLICKHOUSE = "home", "broker", "kafka-security", "clickhouse"
ALL_FLAGS = (HOME, BROKER, KAFKA_SECURITY, CLICKHOUSE)
# The connection flags each command shows; a command not named here takes them all. Only
# flags a command reads: `detect --help` listing SASL flags would send a user looking for
# a broker that detect never talks to.
FLAG_SETS: dict[str, tuple[str, ...]] = {
    "detect": (),                                   # files in, incidents out
    "report": (HOME, CLICKHOUSE),                   # --trace needs neither
    "replay": (HOME, BROKER, KAFKA_SECURITY),       # HOME: the broker `failslow up` started
    "demo": (HOME,),                                # starts its own broker and database
    "down": (HOME,),
    "run": (),                                      # starts a job that writes files
}


def flag_sets(command: str) -> tuple[str, ...]:
    return FLAG_SETS.get(command, ALL_FLAGS)


def add_connection_flags(parser: argparse.ArgumentParser,
                         sets: tuple[str, ...] = ALL_FLAGS) -> None:
    """The connection flags of ``sets``; each overrides its FAILSLOW_* variable."""
    if not sets:
        return
    g = parser.add_argument_group("connection (flags override FAILSLOW_* variables)")
    if HOME in sets:
        g.add_argument("--home", help="state of the embedded stack [FAILSLOW_HOME, ~/.failslow]")
    if BROKER in sets:
        g.add_argument("--bootstrap", help="Kafka bootstrap servers [FAILSLOW_BOOTSTRAP]")
        g.add_argument("--topic-prefix", help="topic prefix [FAILSLOW_TOPIC_PREFIX, failslow.]")
    if CLICKHOUSE in sets:
        _clickhouse_flags(g)
    if KAFKA_SECURITY in sets:
        _kafka_security_flags(parser)


def _clickhouse_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--clickhouse", help="clickhouse://user@host:9000/db, clickhouses://... "
                   "(TLS) or chdb:///folder [FAILSLOW_CLICKHOUSE]")
    g.add_argument("--clickhouse-password-file", metavar="FILE",
                   help="file holding the ClickHouse password [FAILSLOW_CLICKHOUSE_PASSWORD_FILE; "
                   "or FAILSLOW_CLICKHOUSE_PASSWORD]")
    g.add_argument("--clickhouse-ca-file", metavar="FILE",
                   help="CA bundle for ClickHouse TLS [FAILSLOW_CLICKHOUSE_CA_FILE, system CAs]")
    g.add_argument("--clickhouse-no-verify", action="store_true", default=None,
                   help="do not verify the ClickHouse server certificate "
                   "[FAILSLOW_CLICKHOUSE_VERIFY=0]")


def _kafka_security_flags(parser: argparse.ArgumentParser) -> None:
    k = parser.add_argument_group("Kafka security (flags override FAILSLOW_KAFKA_* variables)")
    k.add_argument("--kafka-security-protocol", choices=PROTOCOLS, metavar="PROTO",
                   help="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL "
                   "[FAILSLOW_KAFKA_SECURITY_PROTOCOL; inferred from the settings below]")
    k.add_argument("--kafka-ca-file", metavar="FILE",
                   help="CA bundle for the brokers' certificates; turns TLS on "
                   "[FAILSLOW_KAFKA_CA_FILE]")
    k.add_argument("--kafka-cert-file", metavar="FILE",
                   help="client certificate (PEM) for mutual TLS [FAILSLOW_KAFKA_CERT_FILE]")
    k.add_argument("--kafka-key-file", metavar="FILE",
                   help="client private key (PEM) [FAILSLOW_KAFKA_KEY_FILE]")
    k.add_argument("--kafka-no-verify-hostname", action="store_true", default=None,
                   help="accept a broker certificate issued for another name "
                   "[FAILSLOW_KAFKA_VERIFY_HOSTNAME=0]")
    k.add_argument("--kafka-sasl-mechanism", choices=MECHANISMS, metavar="MECH",
                   help="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 [FAILSLOW_KAFKA_SASL_MECHANISM]")
    k.add_argument("--kafka-username", help="SASL user [FAILSLOW_KAFKA_USERNAME]")
    k.add_argument("--kafka-password-file", metavar="FILE",
                   help="file holding the SASL password [FAILSLOW_KAFKA_PASSWORD_FILE; "
                   "or FAILSLOW_KAFKA_PASSWORD]")


def state_path(home: Path) -> Path:
    """Where ``failslow up`` records the embedded stack it started (``stack.write_state``)."""
    return home / STATE_FILE


def read_stack_state(home: Path) -> dict | None:
    """The embedded stack's state file written by ``failslow up``, or None."""
    try:
        return orjson.loads(state_path(home).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None


def resolve(args: argparse.Namespace | None = None, env: dict[str, str] | None = None) -> Settings:
    env = dict(os.environ) if env is None else env

    def pick(flag: str, var: str) -> str | None:
        value = getattr(args, flag, None) if args is not None else None
        return value if value not in (None, "") else (env.get(var) or None)

    home = Path(pick("home", "FAILSLOW_HOME") or Path.home() / ".failslow").expanduser()
    private_home(home)
    bootstrap = pick("bootstrap", "FAILSLOW_BOOTSTRAP")
    if bootstrap is None:
        state = read_stack_state(home)
        bootstrap = f"127.0.0.1:{state['port']}" if state else "127.0.0.1:9092"
    clickhouse = pick("clickhouse", "FAILSLOW_CLICKHOUSE") or f"chdb://{home / 'chdb'}"

    def secret(flag: str, var: str) -> str | None:
        path = pick(flag, var + "_FILE")
        if path:
            try:
                return Path(path).expanduser().read_text().rstrip("\r\n")
            except OSError as exc:
                raise ConfigError(f"cannot read {var}_FILE {path}: {exc.strerror}") from None
        return env.get(var) or None

    def flag_off(flag: str, var: str) -> bool:
        if args is not None and getattr(args, flag, None):
            return True
        return env.get(var, "1").strip().lower() in ("0", "false", "no", "off")

    try:
        kafka = KafkaSecurity(
            protocol=pick("kafka_security_protocol", "FAILSLOW_KAFKA_SECURITY_PROTOCOL"),
            ca_file=pick("kafka_ca_file", "FAILSLOW_KAFKA_CA_FILE"),
            cert_file=pick("kafka_cert_file", "FAILSLOW_KAFKA_CERT_FILE"),
            key_file=pick("kafka_key_file", "FAILSLOW_KAFKA_KEY_FILE"),
            verify_hostname=not flag_off("kafka_no_verify_hostname", "FAILSLOW_KAFKA_VERIFY_HOSTNAME"),
            sasl_mechanism=pick("kafka_sasl_mechanism", "FAILSLOW_KAFKA_SASL_MECHANISM"),
            username=pick("kafka_username", "FAILSLOW_KAFKA_USERNAME"),
            password=secret("kafka_password_file", "FAILSLOW_KAFKA_PASSWORD"))
    except KafkaSecurityError as exc:
        raise ConfigError(str(exc)) from None
    # Every Kafka client of this process builds its configuration from it.
    kafka_security.use(kafka)
    ch_password = secret("clickhouse_password_file", "FAILSLOW_CLICKHOUSE_PASSWORD")
    secrets.register(kafka.password, ch_password, env.get("FAILSLOW_SLACK_WEBHOOK_URL"),
                     env.get("FAILSLOW_PAGERDUTY_ROUTING_KEY"), env.get("FAILSLOW_WEBHOOK_URL"))
    secrets.install()
    return Settings(
        home=home,
        bootstrap=bootstrap,
        topic_prefix=pick("topic_prefix", "FAILSLOW_TOPIC_PREFIX") or "failslow.",
        clickhouse=clickhouse,
        slack_webhook_url=env.get("FAILSLOW_SLACK_WEBHOOK_URL") or None,
        pagerduty_routing_key=env.get("FAILSLOW_PAGERDUTY_ROUTING_KEY") or None,
        pagerduty_url=env.get("FAILSLOW_PAGERDUTY_URL") or DEFAULT_PAGERDUTY_URL,
        webhook_url=env.get("FAILSLOW_WEBHOOK_URL") or None,
        kafka=kafka,
        clickhouse_password=ch_password,
        clickhouse_ca_file=pick("clickhouse_ca_file", "FAILSLOW_CLICKHOUSE_CA_FILE"),
        clickhouse_verify=not flag_off("clickhouse_no_verify", "FAILSLOW_CLICKHOUSE_VERIFY"),
    )


def clickhouse_url(settings: Settings) -> str:
    """FAILSLOW_CLICKHOUSE with the TLS and password settings folded in (storage.url
    reads them back from the query string); the result holds the password: never print it."""
    from urllib.parse import urlencode, urlsplit

    url = settings.clickhouse
    if url.startswith("chdb:"):
        if url == f"chdb://{settings.home / 'chdb'}":
            private_home(settings.home, create=True)   # before chdb makes its folders 0755
        return url
    extra = {}
    if settings.clickhouse_password is not None:
        extra["password"] = settings.clickhouse_password
    if settings.clickhouse_ca_file:
        extra["ca_certs"] = settings.clickhouse_ca_file
    if not settings.clickhouse_verify:
        extra["verify"] = "0"
    if not extra:
        return url
    sep = "&" if urlsplit(url).query else "?"
    return url + sep + urlencode(extra)

