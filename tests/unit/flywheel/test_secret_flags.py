"""Secrets never travel on command lines (DESIGN, Trust): no `flywheel` subcommand has a flag for the admin
token, an API key or a password (they are read from the environment: a command line shows to every `ps` on
the machine), and the fleet's children get the admin token in their environment, not their argv."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from admin_api import tokens as admin_tokens
from contracts import replica_keys
from flywheel.cli import build_parser, main
from flywheel.kafka.broker import Broker
from flywheel.kafka.security import Security
from infra import kafka_auth
from serving.replica.process import ReplicaConfig

# A flag whose name says it carries a secret's value (paths to key files, e.g. --key or --public-key, are fine).
SECRET_FLAG = re.compile(r"(admin|api|auth|access|bearer)-?token|^--token$|password|api-key|secret-key|^--keys$")


def _options(parser: argparse.ArgumentParser, path: str = "flywheel"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}")
        else:
            for flag in action.option_strings:
                yield path, flag


def _secured_broker(tmp_path) -> Broker:
    """A broker's record with one password per principal (nothing listens: only what children are handed)."""
    passwords = {p: f"{p}-password" for p in (kafka_auth.BROKER, *kafka_auth.ROLES)}
    security = Security(dir=tmp_path, passwords=passwords, tls=False)
    return Broker(pid=0, bootstrap="127.0.0.1:9", data_dir=tmp_path, log_file=tmp_path / "log", security=security)


def test_no_subcommand_takes_a_secret_as_a_flag():
    options = list(_options(build_parser()))
    assert len({p for p, _ in options}) > 30  # every subcommand was walked
    offending = [(p, f) for p, f in options if SECRET_FLAG.search(f)]
    assert not offending, offending


def test_no_config_prints_its_environment_only_secrets():
    """What only the environment may set (option(cli=False): tokens, keys) never shows in a config's repr, so a
    config logged or printed in an error shows no secret."""
    from flywheel.observe.command import ObserveConfig
    from flywheel.status.gather import StatusConfig
    from loadtests.runner import LoadTestConfig
    from serving.config import GatewayConfig
    from weight_sync.agent.config import AgentConfig
    from weight_sync.canary.controller import CanaryConfig

    secret = "s3cr3t-value"
    configs = [
        GatewayConfig(api_keys=secret, admin_token=secret),
        AgentConfig(
            name="r0",
            store_url="http://127.0.0.1:1",
            replica_url="http://127.0.0.1:2",
            initial_model=Path("m"),
            admin_token=secret,
        ),
        CanaryConfig(admin_token=secret),
        StatusConfig(admin_token=secret, store_token=secret),
        ObserveConfig(gateway="http://127.0.0.1:1", admin_token=secret),
        LoadTestConfig(scenario="steady", admin_token=secret),
    ]
    assert [type(c).__name__ for c in configs if secret in repr(c)] == []


@pytest.mark.parametrize(
    "argv",
    [
        ["weights", "agent", "--name", "r0", "--replica", "u", "--store-url", "u", "--initial-model", "m"]
        + ["--admin-token", "t"],
        ["weights", "canary", "--admin-token", "t"],
        ["fleet", "status", "--admin-token", "t"],
        ["tenants", "list", "--admin-token", "t"],
        ["train", "--admin-token", "t"],
        ["loadtest", "steady", "--keys", "k"],
    ],
)
def test_a_secret_flag_is_refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_the_fleet_gives_an_agent_its_admin_token_in_its_environment(tmp_path, monkeypatch):
    """LocalFleet._spawn_agent's child: the token in /proc/<pid>/environ, not in /proc/<pid>/cmdline. The real
    spawn runs, with the agent's whole argv handed to a sleeping python (no broker, store or replica here)."""
    import sys

    from flywheel import local_fleet
    from flywheel.local_fleet import LocalFleet, LocalFleetConfig

    spawned, real_spawn = {}, local_fleet.spawn

    def spawn(cmd, **kw):
        spawned["cmd"] = cmd
        spawned["proc"] = real_spawn([sys.executable, "-c", "import time; time.sleep(30)", *cmd], **kw)
        return spawned["proc"]

    monkeypatch.setattr(local_fleet, "spawn", spawn)
    monkeypatch.setenv("FLYWHEEL_ADMIN_TOKEN", "a-stale-shells-token")
    fleet = LocalFleet.__new__(LocalFleet)  # only what _spawn_agent reads: no broker, store or replica
    fleet.cfg, fleet.out = LocalFleetConfig(model=tmp_path, out_dir=tmp_path), tmp_path
    fleet.relay_ports, fleet.agent_metrics, fleet.store_url = {}, {}, "http://127.0.0.1:9"
    fleet.public_key = tmp_path / "signing.pub"
    fleet.broker = _secured_broker(tmp_path)
    fleet.gateway = type("Gateway", (), {"url": "http://127.0.0.1:9"})()
    monkeypatch.setenv(replica_keys.ADMIN_ENV, "a-stale-shells-replica-key")
    fleet.replica_key, fleet.replica_admin_keys = "fleet-inference", {"r0": "r0-admin", "r1": "r1-admin"}
    fleet.admin_parts = {"status": "st", "weights": "fleet-weights-part", "tenants": "tn"}
    fleet.store_token = "fleet-store-read-credential"
    monkeypatch.setenv("FLYWHEEL_STORE_TOKEN", "a-stale-shells-store-token")
    pid = fleet._spawn_agent("r0", "http://127.0.0.1:9")
    try:
        token = fleet.admin_parts["weights"]  # the admin API's weights part only (admin_api.tokens)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read()
        assert b"weights\0agent" in argv and token.encode() not in argv  # the agent's argv, without the token
        with open(f"/proc/{pid}/environ", "rb") as f:  # this fleet's token, not the shell's
            environ = f.read().split(b"\0")
        assert f"FLYWHEEL_ADMIN_TOKEN={token}".encode() in environ
        assert not any(fleet.cfg.admin_token.encode() in e for e in environ)  # not the operator's, all of it
        # Its replica's two keys (contracts.replica_keys), not another replica's admin key, not the shell's
        assert f"{replica_keys.ADMIN_ENV}=r0-admin".encode() in environ
        assert f"{replica_keys.INFERENCE_ENV}=fleet-inference".encode() in environ
        assert not any(b"r1-admin" in e or b"a-stale-shells-replica-key" in e for e in environ)
        # The fleet read credential it fetches versions with and checks its relay's callers against (weight_sync)
        assert b"FLYWHEEL_STORE_TOKEN=fleet-store-read-credential" in environ and b"store-read" not in argv
        # Its Kafka login is the agent role's, in its environment only; no other principal's password
        assert f"{kafka_auth.USER_ENV}=agent".encode() in environ and b"agent-password" not in argv
        assert f"{kafka_auth.PASSWORD_ENV}=agent-password".encode() in environ
        others = [pw.encode() for p, pw in fleet.broker.security.passwords.items() if p != "agent"]
        assert not any(pw in e for pw in others for e in environ)
    finally:
        spawned["proc"].kill()
        spawned["proc"].wait()


def test_a_fleets_gateways_hold_the_replicas_inference_key_and_no_admin_key(tmp_path, monkeypatch):
    from flywheel.local_fleet import LocalFleet, LocalFleetConfig

    monkeypatch.setenv(replica_keys.ADMIN_ENV, "a-stale-shells-replica-key")
    fleet = LocalFleet(LocalFleetConfig(model=tmp_path, out_dir=tmp_path, replicas=2))
    fleet.broker = _secured_broker(tmp_path)
    cfgs = [fleet.keyed(ReplicaConfig(model_path=tmp_path), f"r{i}") for i in range(2)]
    assert cfgs[0].api_key == cfgs[1].api_key == fleet.replica_key
    assert cfgs[0].admin_api_key != cfgs[1].admin_api_key  # one admin key per replica: one agent each
    assert fleet.keyed(ReplicaConfig(model_path=tmp_path), "r0").admin_api_key == cfgs[0].admin_api_key  # restarts
    env = fleet.gateway_env(FLYWHEEL_ID_SECRET="s")
    parts = {admin_tokens.ENV[cap]: fleet.admin_parts[cap] for cap in admin_tokens.CAPABILITIES}
    keys = {replica_keys.INFERENCE_ENV: fleet.replica_key, replica_keys.ADMIN_ENV: ""}
    kafka = kafka_auth.env("gateway", "gateway-password")  # the gateway's Kafka login, no other role's
    assert env == {**keys, "FLYWHEEL_ID_SECRET": "s", **parts, **kafka}
