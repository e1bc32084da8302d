"""Kafka's boundary, attacked (issue #48, item 1; infra.kafka_auth): a client logs in as one principal and
does that role's work and nothing else; one without a login, with a wrong password, over plaintext or trusting
another CA is refused, also from another host; no principal but the operator can grant itself more."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from contracts import events as ev
from infra import kafka_auth
from infra.kafka_admin import ensure_topics, quiet_kafka
from infra.paths import REPO_ROOT

pytestmark = pytest.mark.timeout(300)

TOPICS = (
    ev.TOPIC_COMPLETIONS,
    ev.TOPIC_FEEDBACK,
    ev.TOPIC_TENANTS,
    ev.TOPIC_WEIGHTS,
    ev.TOPIC_DEADLETTER,
    ev.TOPIC_BAD_RECORDS,
)
# Written out by hand from the issue (not read from kafka_auth.GRANTS, which is what is under test).
MAY_WRITE = {
    "gateway": {ev.TOPIC_COMPLETIONS, ev.TOPIC_FEEDBACK, ev.TOPIC_TENANTS, ev.TOPIC_DEADLETTER},
    "trainer": {ev.TOPIC_WEIGHTS, ev.TOPIC_BAD_RECORDS},
    "agent": {ev.TOPIC_BAD_RECORDS},
    "canary": {ev.TOPIC_WEIGHTS, ev.TOPIC_BAD_RECORDS},
    "status": set(),
}
MAY_READ = {
    "gateway": set(),
    "trainer": {ev.TOPIC_COMPLETIONS, ev.TOPIC_FEEDBACK, ev.TOPIC_TENANTS, ev.TOPIC_WEIGHTS},
    "agent": {ev.TOPIC_WEIGHTS},
    "canary": {ev.TOPIC_WEIGHTS},
    "status": set(),
}


def _writes(bootstrap: str, login: dict) -> set[str]:
    """The topics this login's producer could append a record to."""
    from kafka import KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError

    ok = set()
    for t in TOPICS:  # a producer a topic: kafka-python's producer keeps failing every send after one refused
        # Not idempotent: a principal that may write no topic is refused a producer id (ClusterAuthorization),
        # before any topic's ACL is asked; the fleet's idempotent producers belong to roles that write.
        p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", max_block_ms=8000, enable_idempotence=False, **login)
        try:
            p.send(t, key=b"acl-probe", value=b"{}").get(timeout=10)
            ok.add(t)
        except TopicAuthorizationFailedError:
            pass
        finally:
            p.close()
    return ok


def _reads(bootstrap: str, login: dict) -> set[str]:
    """The topics this login's consumer (no group) could fetch records of."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import TopicAuthorizationFailedError

    ok = set()
    for t in TOPICS:
        c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **login)
        try:
            # The operator's record is in one of them (a role that may not see the topic: partition 0, refused).
            parts = [TopicPartition(t, n) for n in sorted(c.partitions_for_topic(t) or {0})]
            c.assign(parts)
            c.seek_to_beginning(*parts)
            got = {}
            for _ in range(20):  # every topic holds the operator's record: an allowed read sees it
                got = c.poll(timeout_ms=250)
                if got:
                    break
            if got:
                ok.add(t)
        except TopicAuthorizationFailedError:
            pass
        finally:
            c.close()
    return ok


@pytest.fixture(scope="module")
def probe_broker(tmp_path_factory, kafka_security):
    """A broker of this module's own (the session's credentials): its probes write records that are not events
    onto the real topics, which the session's shared broker must never carry (other tests decode every record)."""
    from flywheel.kafka import broker as kafka_broker

    if kafka_security is None:
        pytest.skip("an external broker: its ACLs are its operator's")
    broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp_path_factory.mktemp("kafka-acls")))
    try:
        yield broker.bootstrap
    finally:
        assert broker.stop(), f"broker pid {broker.pid} did not stop"


def test_each_role_writes_and_reads_only_its_topics(probe_broker, kafka_security):
    from concurrent.futures import ThreadPoolExecutor

    if kafka_security is None:
        pytest.skip("an external broker: its ACLs are its operator's")
    ensure_topics(probe_broker)
    assert _writes(probe_broker, kafka_auth.client_config()) == set(TOPICS)  # the operator: everything
    logins = {role: kafka_security.client_config(role) for role in MAY_WRITE}
    with quiet_kafka(), ThreadPoolExecutor(len(logins)) as pool:  # a refused read is a wait: the roles at once
        writes = dict(zip(logins, pool.map(lambda login: _writes(probe_broker, login), logins.values())))
        reads = dict(zip(logins, pool.map(lambda login: _reads(probe_broker, login), logins.values())))
    assert writes == MAY_WRITE
    assert reads == MAY_READ


def test_a_role_reads_only_through_its_own_consumer_groups(probe_broker, kafka_security):
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import GroupAuthorizationFailedError
    from kafka.structs import OffsetAndMetadata

    if kafka_security is None:
        pytest.skip("an external broker: its ACLs are its operator's")
    ensure_topics(probe_broker)
    tp = TopicPartition(ev.TOPIC_WEIGHTS, 0)

    def commit(role: str, group: str) -> bool:
        c = KafkaConsumer(bootstrap_servers=probe_broker, group_id=group, **kafka_security.client_config(role))
        try:
            c.commit({tp: OffsetAndMetadata(0, "", -1)})
            return True
        except GroupAuthorizationFailedError:
            return False
        finally:
            c.close()

    with quiet_kafka():
        assert commit("agent", "flywheel-agent-r7")
        assert commit("trainer", "flywheel-trainer")
        assert not commit("agent", "flywheel-trainer")  # an agent cannot move the trainer's offsets
        assert not commit("trainer", "flywheel-agent-r7")
        assert not commit("canary", "flywheel-agent-r7")


def test_no_principal_but_the_operator_can_grant_itself_more_or_delete_a_topic(probe_broker, kafka_security):
    from kafka.admin import (
        ACL,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePattern,
        ResourceType,
    )
    from kafka.errors import AuthorizationError

    if kafka_security is None:
        pytest.skip("an external broker: its ACLs are its operator's")
    ensure_topics(probe_broker)
    grab = ACL(
        "User:gateway",
        "*",
        ACLOperation.ALL,
        ACLPermissionType.ALLOW,
        ResourcePattern(ResourceType.TOPIC, ev.TOPIC_WEIGHTS, ACLResourcePatternType.LITERAL),
    )
    for role in MAY_WRITE:
        admin = KafkaAdminClient(bootstrap_servers=probe_broker, **kafka_security.client_config(role))
        try:
            with pytest.raises(AuthorizationError):
                result = admin.create_acls([grab])
                if result["failed"]:  # kafka-python reports a refused ACL beside the others, by its error class
                    raise result["failed"][0]()
            with pytest.raises(AuthorizationError):
                admin.delete_topics([ev.TOPIC_WEIGHTS])
            with pytest.raises(AuthorizationError):  # nor make a topic of its own
                admin.create_topics([__import__("kafka.admin").admin.NewTopic(f"mine-{role}", 1, 1)])
        finally:
            admin.close()
    assert ev.TOPIC_WEIGHTS in _writes(probe_broker, kafka_security.client_config("trainer"))


_OUTSIDER = r"""
import json, sys
from concurrent.futures import ThreadPoolExecutor
from kafka import KafkaProducer
from kafka.errors import KafkaError
bootstrap, logins = sys.argv[1], json.loads(sys.argv[2])

def attempt(login):
    try:
        p = KafkaProducer(
            bootstrap_servers=bootstrap, acks="all", max_block_ms=6000, bootstrap_timeout_ms=6000, **login
        )
        try:
            p.send("completions", b"from another host").get(timeout=10)
            return "written"
        finally:
            p.close(timeout=2)
    except KafkaError as e:
        return type(e).__name__

with ThreadPoolExecutor(len(logins)) as pool:  # each refusal waits out its timeout: all at once
    print(json.dumps(dict(zip(logins, pool.map(attempt, logins.values())))))
"""


def test_outsiders_on_another_host_are_refused_and_nothing_secret_is_on_the_command_line(tmp_path, kafka_security):
    """A broker on this machine's bridge address (flywheel kafka start --host), attacked from a test host."""
    from tests.helpers import broker_on_a_test_host

    if kafka_security is None:
        pytest.skip("an external broker")
    gateway = kafka_security.client_config("gateway")
    logins = {
        "no login": {},
        "guessed password": {**gateway, "sasl_plain_password": "fw-" + "0" * 32},
        "the operator's name, the gateway's password": {**gateway, "sasl_plain_username": "admin"},
        "plaintext to the TLS port": {k: v for k, v in gateway.items() if not k.startswith("ssl_")}
        | {"security_protocol": "SASL_PLAINTEXT"},
        "not trusting the fleet's CA": {k: v for k, v in gateway.items() if k != "ssl_cafile"},
        "the gateway": gateway,  # the control: the same client with the right login writes
    }
    data = tmp_path / "kafka"
    with broker_on_a_test_host(data) as (host, state):
        argv = [sys.executable, "-c", _OUTSIDER, state["bootstrap"], json.dumps(logins)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_KAFKA")}
        r = host.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        got = json.loads(r.stdout)
        assert got.pop("the gateway") == "written", got
        assert "written" not in got.values(), got
        # What `ps` shows of the broker: no password; its files are its owner's alone.
        cmdline = open(f"/proc/{state['pid']}/cmdline", "rb").read().decode()
        assert not any(pw in cmdline for pw in kafka_security.passwords.values())
        for f in (
            data / "server.properties",
            kafka_security.dir / "credentials.json",
            kafka_security.dir / "ca.key",
        ):
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
        assert stat.S_IMODE(kafka_security.dir.stat().st_mode) == 0o700


def test_a_data_dir_formatted_open_is_not_started_as_if_secured(tmp_path):
    """A broker formatted before authentication (its metadata holds no SCRAM credential) is refused with the way
    out, rather than started with listeners no client could log in to."""
    from flywheel.kafka import broker as kb

    data = tmp_path / "kafka"
    (data / "logs").mkdir(parents=True)
    (data / "logs" / "meta.properties").write_text("version=1\n")
    (data / kb.PORTS_FILE).write_text(json.dumps({"port": 1, "controller_port": 2}))  # as it was written then
    with pytest.raises(RuntimeError, match="formatted without credentials"):
        kb.start(kb.BrokerConfig(data_dir=data))
    assert not (data / kb.STATE_FILE).exists()


def test_formatting_puts_no_password_on_a_command_line(tmp_path, monkeypatch):
    """`kafka-storage format --add-scram` takes the passwords as arguments: every command the launcher runs (the
    real format among them) shows none of them, and the argument file that held them is gone."""
    import subprocess

    from flywheel.kafka import broker as kb

    argvs = []
    real_run, real_popen = subprocess.run, subprocess.Popen

    def run(argv, *a, **kw):
        argvs.append(list(argv))
        return real_run(argv, *a, **kw)

    def popen(argv, *a, **kw):
        argvs.append(list(argv))
        return real_popen(argv, *a, **kw)

    monkeypatch.setattr(kb.subprocess, "run", run)
    monkeypatch.setattr(kb.subprocess, "Popen", popen)
    data = tmp_path / "kafka"
    broker = kb.start(kb.BrokerConfig(data_dir=data, security_dir=tmp_path / "own-security"))
    try:
        assert broker.security is not None and broker.security.dir == tmp_path / "own-security"
        assert any(str(a[-1]).endswith("@" + str(data.resolve() / "format.args")) for a in argvs)  # the format ran
        shown = " ".join(" ".join(map(str, a)) for a in argvs)
        assert not [pw for pw in broker.security.passwords.values() if pw in shown]
        assert not (data / "format.args").exists()
    finally:
        assert broker.stop()
