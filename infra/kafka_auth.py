"""Who may do what on the broker (DESIGN, Trust boundaries): one Kafka principal per role, each with a SCRAM
password, and the ACLs that say what each may read and write. Clients and the broker's launcher both read
this module: clients for how to log in, the launcher (flywheel.kafka.security) for whom to create.

    gateway   writes completions, feedback, tenants, events.deadletter (stubs of events too large)
    trainer   reads completions, feedback, tenants, weights (its group: flywheel-trainer*); writes weights
              (versions it publishes) and records.deadletter (records it refused)
    agent     reads weights (its group: flywheel-agent-*); writes records.deadletter
    canary    reads and writes weights (its announcements: canary, promote, rollback); writes records.deadletter
    status    describes topics, groups and the cluster (lag for `flywheel status`), reads no record
    admin     the operator (SRE): a super user, as the brokers' own principal `broker` is

A signed record is still checked by its signature: an ACL says who may write a topic, the signing key
which of its records are the trainer's (weight_sync.publish).

A client logs in with $FLYWHEEL_KAFKA_USER and $FLYWHEEL_KAFKA_PASSWORD (SCRAM-SHA-512; the password never
crosses the wire) and, where $FLYWHEEL_KAFKA_CA names the broker's CA certificate, over TLS with the broker's
address checked against its certificate. Credentials travel in the environment, never on a command line. A
process with no user set talks to an open broker (an external one the operator left open).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from contracts import events as ev

USER_ENV = "FLYWHEEL_KAFKA_USER"
PASSWORD_ENV = "FLYWHEEL_KAFKA_PASSWORD"
CA_ENV = "FLYWHEEL_KAFKA_CA"
MECHANISM = "SCRAM-SHA-512"

BROKER = "broker"  # the nodes' own principal (inter-broker and controller traffic)
SUPER_USERS = (BROKER, "admin")
TRAINER_GROUP = "flywheel-trainer"  # a prefix: a second trainer's group may carry a suffix
AGENT_GROUP = "flywheel-agent-"  # an agent's group is this and its replica's name


@dataclass(frozen=True)
class Grant:
    """Allow `ops` on a resource: a topic or a group by name (prefix=True: every name that starts with it;
    "*": every one), or the cluster."""

    resource: str  # "topic" | "group" | "cluster"
    name: str
    ops: tuple[str, ...]  # "read" | "write" | "describe" (read and write imply describe)
    prefix: bool = False


def _topics(ops: tuple[str, ...], *names: str) -> list[Grant]:
    return [Grant("topic", n, ops) for n in names]


GRANTS: dict[str, list[Grant]] = {
    "gateway": _topics(("write",), ev.TOPIC_COMPLETIONS, ev.TOPIC_FEEDBACK, ev.TOPIC_TENANTS, ev.TOPIC_DEADLETTER),
    "trainer": [
        *_topics(("read",), ev.TOPIC_COMPLETIONS, ev.TOPIC_FEEDBACK, ev.TOPIC_TENANTS),
        *_topics(("read", "write"), ev.TOPIC_WEIGHTS),
        *_topics(("write",), ev.TOPIC_BAD_RECORDS),
        Grant("group", TRAINER_GROUP, ("read",), prefix=True),
    ],
    "agent": [
        *_topics(("read",), ev.TOPIC_WEIGHTS),
        *_topics(("write",), ev.TOPIC_BAD_RECORDS),
        Grant("group", AGENT_GROUP, ("read",), prefix=True),
    ],
    "canary": [*_topics(("read", "write"), ev.TOPIC_WEIGHTS), *_topics(("write",), ev.TOPIC_BAD_RECORDS)],
    "status": [
        Grant("topic", "*", ("describe",)),
        Grant("group", "*", ("describe",)),
        Grant("cluster", "", ("describe",)),
    ],
    "admin": [],  # a super user
}
ROLES = tuple(GRANTS)


def client_config() -> dict:
    """kafka-python's keyword arguments for logging in as this process's principal ({} with none set). Read at
    each client's construction, so a test can act as another principal by changing the environment."""
    user = os.environ.get(USER_ENV)
    if not user:
        return {}
    password = os.environ.get(PASSWORD_ENV)
    if not password:
        raise ValueError(f"${USER_ENV} is {user!r} but ${PASSWORD_ENV} is empty")
    cfg: dict[str, object] = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": MECHANISM,
        "sasl_plain_username": user,
        "sasl_plain_password": password,
    }
    ca = os.environ.get(CA_ENV)
    if ca:
        cfg.update(security_protocol="SASL_SSL", ssl_cafile=ca, ssl_check_hostname=True)
    return cfg


def env(user: str | None, password: str | None = None, ca: str | None = None) -> dict[str, str]:
    """A child's environment entries for the principal it holds; none (user=None) sets them empty, so a child
    never inherits its parent's principal."""
    return {USER_ENV: user or "", PASSWORD_ENV: password or "", CA_ENV: ca or ""}


@contextlib.contextmanager
def acting_as(entries: dict[str, str]):
    """This process logs in with `entries` (env() of a principal) inside the block, as it was after: the process
    that launched a broker is its operator while it runs (flywheel.local_fleet, the tests' session broker)."""
    before = {k: os.environ.get(k) for k in entries}
    os.environ.update(entries)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
