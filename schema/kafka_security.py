"""Kafka connection security (TLS, SASL), mapped once to both clients in use:
confluent-kafka (librdkafka property names) and aiokafka (through faust's credentials).

The entry point resolves a ``KafkaSecurity`` from flags / FAILSLOW_KAFKA_* variables and
calls ``use(security)`` once; every Kafka client of the process then builds its
configuration with ``client_conf(bootstrap, **extra)`` (confluent-kafka) or
``faust_credentials()`` (faust/aiokafka), so no client can forget it.

>>> sec = KafkaSecurity(ca_file="/ca.pem", sasl_mechanism="SCRAM-SHA-256",
...                     username="u", password="hunter2")
>>> sec.protocol
'SASL_SSL'
>>> sorted(sec.confluent())[:3]
['sasl.mechanism', 'sasl.password', 'sasl.username']
>>> "hunter2" in repr(sec)
False
"""

from __future__ import annotations

import contextlib
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any

from failslow.schema.errors import FailslowError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class KafkaSecurityError(ValueError):
    """An inconsistent or unsupported Kafka security setting."""


class KafkaAuthError(FailslowError):
    """The broker refused this process's SASL credentials (a configuration error: retrying
    with the same credentials cannot succeed, so the process stops with one line)."""


@dataclass(frozen=True)
class KafkaSecurity:
    """How to reach a secured Kafka. ``protocol`` None: inferred (TLS when any TLS file
    or ``tls`` is given, SASL when a mechanism or username is given)."""

    protocol: str | None = None
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify_hostname: bool = True
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        proto = self.protocol.upper() if self.protocol else self._inferred()
        if proto not in PROTOCOLS:
            raise KafkaSecurityError(f"unknown Kafka security protocol {self.protocol!r} "
                                     f"(one of {', '.join(PROTOCOLS)})")
        object.__setattr__(self, "protocol", proto)
        if self.uses_sasl:
            mech = (self.sasl_mechanism or "PLAIN").upper()
            if mech not in MECHANISMS:
                raise KafkaSecurityError(f"unknown SASL mechanism {self.sasl_mechanism!r} "
                                         f"(one of {', '.join(MECHANISMS)})")
            object.__setattr__(self, "sasl_mechanism", mech)
            if not self.username or self.password is None:
                raise KafkaSecurityError("SASL needs a username and a password "
                                         "(FAILSLOW_KAFKA_USERNAME, FAILSLOW_KAFKA_PASSWORD[_FILE])")
        if bool(self.cert_file) != bool(self.key_file):
            raise KafkaSecurityError("a Kafka client certificate needs both a cert file and a key file")

    def _inferred(self) -> str:
        tls = self.tls or bool(self.ca_file or self.cert_file or self.key_file)
        sasl = bool(self.sasl_mechanism or self.username)
        return ("SASL_" if sasl else "") + ("SSL" if tls else "PLAINTEXT")

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def describe(self) -> str:
        """One line for logs, no secret in it."""
        parts = [str(self.protocol)]
        if self.uses_tls:
            parts.append(f"ca={self.ca_file or 'system'}")
            if self.cert_file:
                parts.append(f"cert={self.cert_file}")
            if not self.verify_hostname:
                parts.append("hostname-unverified")
        if self.uses_sasl:
            parts.append(f"{self.sasl_mechanism} user={self.username}")
        return " ".join(parts)

    def confluent(self) -> dict[str, Any]:
        """librdkafka properties."""
        conf: dict[str, Any] = {"security.protocol": self.protocol}
        if self.uses_tls:
            if self.ca_file:
                conf["ssl.ca.location"] = self.ca_file
            if self.cert_file:
                conf["ssl.certificate.location"] = self.cert_file
                conf["ssl.key.location"] = self.key_file
            conf["ssl.endpoint.identification.algorithm"] = "https" if self.verify_hostname else "none"
        if self.uses_sasl:
            conf["sasl.mechanism"] = self.sasl_mechanism
            conf["sasl.username"] = self.username
            conf["sasl.password"] = self.password
        return conf

    def ssl_context(self) -> ssl.SSLContext | None:
        """The context aiokafka uses; None without TLS."""
        if not self.uses_tls:
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file)
        ctx.check_hostname = self.verify_hostname
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def aiokafka(self) -> dict[str, Any]:
        """aiokafka client keyword arguments."""
        kw: dict[str, Any] = {"security_protocol": self.protocol}
        ctx = self.ssl_context()
        if ctx is not None:
            kw["ssl_context"] = ctx
        if self.uses_sasl:
            kw.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.username,
                      sasl_plain_password=self.password)
        return kw

    def faust_credentials(self) -> Any:
        """``broker_credentials`` for faust.App (faust maps them to the aiokafka
        arguments above); None for PLAINTEXT."""
        import faust

        if self.uses_sasl:
            return faust.SASLCredentials(username=self.username, password=self.password,
                                         mechanism=self.sasl_mechanism,
                                         ssl_context=self.ssl_context())
        if self.uses_tls:
            return faust.SSLCredentials(self.ssl_context())
        return None


PLAINTEXT = KafkaSecurity()
_current: list[KafkaSecurity] = [PLAINTEXT]


def use(security: KafkaSecurity) -> None:
    """Set the security every Kafka client of this process uses (entry points only)."""
    _current[0] = security


def current() -> KafkaSecurity:
    return _current[0]


def auth_error(err: Any) -> KafkaAuthError | None:
    """The error to stop with when librdkafka's ``err`` (an error_cb argument) says the
    broker refused the SASL credentials, else None. librdkafka itself retries such a
    login forever and reports a metadata request as a mere transport failure."""
    from confluent_kafka import KafkaError

    if err.code() != KafkaError._AUTHENTICATION:
        return None
    sec = _current[0]
    who = f"SASL {sec.sasl_mechanism} user {sec.username}" if sec.uses_sasl else sec.protocol
    text = err.str()
    if sec.password:
        text = text.replace(sec.password, "***")
    return KafkaAuthError(f"the Kafka broker refused the credentials ({who}): {text}")


_refusal: list[KafkaAuthError | None] = [None]  # the last refused login any client reported


def _raise_on_auth_error(err: Any) -> None:
    exc = auth_error(err)
    if exc is None:
        return
    _refusal[0] = exc
    # Raised only in the main thread (the commands' own loops and start-up checks):
    # confluent-kafka re-raises it from the poll()/consume()/flush() that served it. A
    # client polled by a background thread (the worker's host-map reader, its snapshot
    # writer) keeps librdkafka's retries rather than dying in that thread.
    if threading.current_thread() is threading.main_thread():
        raise exc


def refused(client: Any) -> KafkaAuthError | None:
    """After a request of ``client`` (made with ``client_conf``) failed: the refused SASL
    login behind it, if that is why, else None. librdkafka reports a refused login as a
    transport failure of the request and queues the real reason for poll()."""
    _refusal[0] = None
    try:
        client.poll(0)
    except KafkaAuthError as exc:
        return exc
    return _refusal[0]


def client_conf(bootstrap: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A confluent-kafka configuration: bootstrap, this process's security, then ``extra``.
    Unless ``extra`` brings its own ``error_cb``, a SASL login the broker refuses raises
    ``KafkaAuthError`` from the client's next poll()/consume()/flush() in the main thread
    (one line and exit status 2 from the command line) instead of being retried forever
    (librdkafka's way: a wrong password cannot become right by retrying)."""
    # librdkafka's info lines (level 6, e.g. "Purging 1 unserved events from background
    # queue" when a client is destroyed) are noise on a terminal; warnings and errors stay.
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "log_level": 4}
    conf.update(_current[0].confluent())
    if _current[0].uses_sasl:
        conf["error_cb"] = _raise_on_auth_error
    conf.update(extra or {})
    return conf


def group_consumer_conf(bootstrap: str, group_id: str,
                        extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A confluent-kafka consumer in a group that commits its offsets itself (the sink,
    the notifier), tuned for Tansu as for Kafka (MEASURED.md): a short session (Tansu
    answers JoinGroup after half of it) and a 100 ms fetch wait (Tansu holds a fetch for
    the full wait). ``extra`` wins."""
    return client_conf(bootstrap, {
        "group.id": group_id,
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "session.timeout.ms": 3000, "heartbeat.interval.ms": 500,
        "fetch.wait.max.ms": 100, "enable.partition.eof": False, **(extra or {})})



def reader_conf(bootstrap: str, group_id: str,
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A confluent-kafka consumer that is *assigned* partitions and never commits (the
    worker's host-map and snapshot readers, `failslow status`'s probe): a group id only
    because the client wants one, a 50 ms fetch wait (Tansu holds a fetch for the full
    wait). ``extra`` wins."""
    return client_conf(bootstrap, {"group.id": group_id, "enable.auto.commit": False,
                                   "fetch.wait.max.ms": 50, **(extra or {})})


def topic_id_str(desc: Any) -> str:
    """``str(desc.topic_id)`` of a DescribeTopics result, releasing the reference that
    confluent-kafka (2.16.1 measured) leaks on each ``Uuid`` it returns (issue 17: the
    worker's watch asks every second; 300 calls for 5 topics kept 1,500 ``Uuid`` objects,
    ~10 a second in the soak's worker). The leak is detected, not assumed: a reference is
    dropped only when the object holds one more than ``desc``, this frame and the
    count's own argument, so a fixed release leaves it alone."""
    import sys

    uid = desc.topic_id
    out = str(uid)
    if sys.getrefcount(uid) > 3 and sys.implementation.name == "cpython":
        import ctypes

        ctypes.pythonapi.Py_DecRef(ctypes.py_object(uid))
    return out


class TopicIdWatch:
    """Notices topics that the broker lost, by their ids: an in-memory broker (Tansu)
    restarted on the same port, or a topic deleted and recreated, starts them empty at
    offset 0 while a consumer keeps its old, higher positions, and Tansu does not answer
    OFFSET_OUT_OF_RANGE for them (measured, issue 17): the consumer waits until the new
    partitions grow past them and skips every record below. The end offsets cannot tell
    (Tansu reports the newest batch's base offset + 1, MEASURED.md: a partition holding one
    batch of 5,000 records ends at 1), so the topic's id tells: a recreated topic has a new
    one (Tansu too, measured). The one watcher of every component (issue 17):

    - ``lost()``: the topics whose id changed, or that are gone, since their id was learnt
      (a topic's id is learnt the first time it is seen; one DescribeTopics request for all
      ``topics``). While the broker does not answer, nothing is decided (``None``).
    - ``check(consumer, positions)``, for a group consumer that commits its own offsets
      (the sink, the notifier), at most every ``interval_s``: each assigned partition of a
      topic whose id changed is sought to its start (low watermark) and that offset
      committed (so a rebalance does not hand the old position back); ONE WARNING line
      names the lost topics and, for each partition the caller had read, topic, partition,
      position (``positions``: next offset, per partition the caller consumed) and end. It
      returns those partitions: the caller drops offsets it has not committed yet (they
      count in the lost log). A topic that is missing keeps its old id until it is back
      (someone else creates it), and a changed topic none of whose partitions is assigned
      yet (the group is rebalancing after the restart) waits for the next round.
    - the worker (``streams.sends.TopicWatch``) asks ``lost()`` every second and after
      each of its offset commits; when its internal topics are lost (it owns them: for it
      a missing one is lost) it commits the lost topics' start, repairs them and restarts.
    """

    def __init__(self, bootstrap: str, topics: list[str], logger: Any,
                 interval_s: float = 1.0, timeout_s: float = 1.0,
                 extra: dict[str, Any] | None = None) -> None:
        self.bootstrap = bootstrap
        self.topics = list(topics)
        self.log = logger
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.extra = dict(extra or {})
        self.resets = 0
        self.requests = 0
        self._ids: dict[str, str] = {}
        self._admin: Any = None
        self._next = 0.0

    def ids(self) -> dict[str, str | None] | None:
        """Topic -> its id now (None: the broker does not know it); ``None`` when the
        broker did not answer for every topic."""
        from confluent_kafka import KafkaError, KafkaException, TopicCollection
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient(client_conf(self.bootstrap, self.extra))
        self.requests += 1
        ids: dict[str, str | None] = {}
        try:
            futures = self._admin.describe_topics(TopicCollection(self.topics),
                                                  request_timeout=self.timeout_s)
        except KafkaException:
            return None
        for name, fut in futures.items():
            try:
                ids[name] = topic_id_str(fut.result(timeout=self.timeout_s + 1))
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    ids[name] = None
                else:
                    return None  # the broker does not answer: nothing to decide now
            except Exception:  # noqa: BLE001 - a timeout of the future
                return None
        return ids

    def learnt(self) -> dict[str, str]:
        """The ids the topics had when first seen (the ones this process works with)."""
        return dict(self._ids)

    def lost(self) -> dict[str, str] | None:
        """Topic -> "missing" or "recreated" (a new id) for each topic whose id was
        learnt and is no longer the broker's; {} when none; ``None`` when the broker did
        not answer. The learnt id of a lost topic stays until ``forget``."""
        now = self.ids()
        if now is None:
            return None
        out: dict[str, str] = {}
        for name, tid in now.items():
            old = self._ids.get(name)
            if old is None:
                if tid is not None:
                    self._ids[name] = tid
            elif tid is None:
                out[name] = "missing"
            elif tid != old:
                out[name] = "recreated"
        return out

    def forget(self, name: str) -> None:
        """Learn ``name``'s id afresh the next time it is seen."""
        self._ids.pop(name, None)

    def check(self, consumer: Any, positions: dict[tuple[str, int], int]) -> list[tuple[str, int]]:
        import time

        from confluent_kafka import KafkaException, TopicPartition

        now = time.monotonic()
        if now < self._next:
            return []
        self._next = now + self.interval_s
        # a missing topic keeps its old id until it is back (someone else creates it)
        changed = [n for n, why in (self.lost() or {}).items() if why != "missing"]
        if not changed:
            return []
        reset: list[tuple[str, int]] = []
        try:
            assigned = [tp for tp in consumer.assignment() if tp.topic in changed]
        except (KafkaException, RuntimeError):
            return reset
        # A topic is done once its assigned partitions are reset; while none is assigned
        # (the group is rebalancing after the restart) the change waits for the next round.
        done = {tp.topic for tp in assigned}
        read: list[str] = []
        for tp in assigned:
            key = (tp.topic, tp.partition)
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=self.timeout_s, cached=False)
                consumer.seek(TopicPartition(tp.topic, tp.partition, low))
            except KafkaException as exc:
                self.log.debug("%s partition %d: not reset yet (trying again): %s",
                               tp.topic, tp.partition, exc)
                done.discard(tp.topic)
                continue
            with contextlib.suppress(KafkaException):
                consumer.commit(offsets=[TopicPartition(tp.topic, tp.partition, low)],
                                asynchronous=False)
            if key in positions:
                read.append(f"{tp.topic} partition {tp.partition} position "
                            f"{positions.pop(key)} end {high} start {low}")
            self.resets += 1
            reset.append(key)
        if reset:
            self.log.warning(
                "the broker lost %s (restarted without its data, or recreated: the topic ids "
                "changed): reading their %d assigned partition(s) again from the start; read "
                "before: %s", ", ".join(sorted({t for t, _ in reset})), len(reset),
                "; ".join(read) or "none")
        for name in done:
            self.forget(name)   # its new id is learnt next round
        return reset
