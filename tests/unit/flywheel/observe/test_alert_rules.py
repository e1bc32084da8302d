"""deploy/prometheus/alerts.yml: valid for Prometheus (promtool check), each alert's firing and quiet cases
pass (promtool test rules on alerts_test.yml), and every alert has its tests and a runbook whose commands
exist in the real command line."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from flywheel.observe.alert_rules import (
    ALERTS_FILE,
    RUNBOOKS_DIR,
    TESTS_FILE,
    alert_names,
    load_rules,
    runbook_commands,
    with_for,
    write_rules,
)

PROMTOOL = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (scripts/setup.sh installs it)")
# What a runbook command may use: the fleet's environment (LocalFleet.env) and the names docs/runbooks/README.md
# defines (the alert's labels, the SRE's choice, a deployment's own flags).
FLEET_ENV = {
    "FLYWHEEL_GATEWAY_URL",
    "FLYWHEEL_ADMIN_TOKEN",
    "FLYWHEEL_KAFKA_BOOTSTRAP",
    "FLYWHEEL_STORE_URL",
    "FLYWHEEL_WEIGHTS_STORE",
    "FLYWHEEL_SIGNING_KEY",
    "FLYWHEEL_PUBLIC_KEY",
}
ALERT_ENV = {"REPLICA", "VERSION", "STABLE_VERSION"}
DEPLOYMENT_ENV = {
    "MODEL_DIR",
    "REPLICA_URL",
    "REPLICA_PORT",
    "REPLICA_THREADS",
    "KAFKA_DATA_DIR",
    "KAFKA_PORT",
    "GATEWAY_STATE_DIR",
    "GATEWAY_PORT",
    "AGENT_METRICS_PORT",
    "AGENT_WORK_DIR",
    "TRAINER_WORK_DIR",
    "TRAINER_METRICS_PORT",
}


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def alerting_rules() -> list[dict]:
    return [r for g in load_rules() for r in g["rules"] if "alert" in r]


@needs_promtool
def test_promtool_accepts_the_rules():
    run = promtool("check", "rules", str(ALERTS_FILE))
    assert run.returncode == 0, run.stdout + run.stderr


@needs_promtool
def test_promtool_unit_tests_pass():
    run = promtool("test", "rules", str(TESTS_FILE))
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_alert_has_a_firing_and_a_quiet_case():
    cases: dict[str, list[bool]] = {}
    for test in yaml.safe_load(TESTS_FILE.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], []).append(bool(case.get("exp_alerts")))
    names = alert_names(load_rules())
    assert set(cases) == set(names), f"tested {sorted(cases)}, defined {names}"
    for name in names:
        assert True in cases[name] and False in cases[name], f"{name}: needs a case that fires and one that does not"


def test_every_alert_says_how_bad_what_and_where_its_runbook_is():
    for rule in alerting_rules():
        name = rule["alert"]
        assert re.fullmatch(r"(?:[A-Z][a-z0-9]*|SLO)+", name), f"{name}: CamelCase"
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], name
        assert notes["runbook_url"] == f"docs/runbooks/{name}.md", name
        assert (RUNBOOKS_DIR / f"{name}.md").is_file(), f"{name}: no runbook"
        assert "for" in rule, f"{name}: no for: (a blip would page)"


def test_every_runbook_is_an_alerts_and_the_index_names_them_all():
    names = set(alert_names(load_rules()))
    pages = {p.stem for p in RUNBOOKS_DIR.glob("*.md")} - {"README"}
    assert pages == names, f"runbooks without an alert: {pages - names}; alerts without one: {names - pages}"
    index = (RUNBOOKS_DIR / "README.md").read_text()
    for name in names:
        text = (RUNBOOKS_DIR / f"{name}.md").read_text()
        assert text.startswith(f"# {name}\n"), name
        assert f"[`{name}`](../../deploy/prometheus/alerts.yml)" in text, f"{name}: no link back to its rule"
        assert f"[{name}]({name}.md)" in index, f"{name}: not in docs/runbooks/README.md"


def _placeholder(var: str) -> str:
    """A stand-in value that the command's flags would accept."""
    if var.endswith(("VERSION", "PORT", "THREADS")):
        return "3"
    if var == "REPLICA":
        return "r0"
    if var.endswith("URL") or var == "FLYWHEEL_KAFKA_BOOTSTRAP":
        return "http://127.0.0.1:1"
    return f"/tmp/{var.lower()}"


def test_runbook_commands_exist_and_use_only_the_documented_variables():
    from flywheel.cli import build_parser

    parser = build_parser()
    allowed = FLEET_ENV | ALERT_ENV | DEPLOYMENT_ENV
    for name in alert_names(load_rules()):
        commands = runbook_commands(name)
        assert commands, f"{name}: no command"
        assert any(c.startswith("flywheel ") for c in commands), f"{name}: no flywheel command"
        for command in commands:
            used = set(re.findall(r"\$\{?([A-Z_]+)", command))
            assert used <= allowed, f"{name}: {command!r} uses {used - allowed}"
            argv = shlex.split(re.sub(r"\$\{?([A-Z_]+)\}?", lambda m: _placeholder(m[1]), command))
            if argv[0] == "curl":
                assert any(a.startswith(("http://", "https://")) for a in argv), command
                continue
            assert argv[0] == "flywheel", f"{name}: {command!r} is neither flywheel nor curl"
            try:
                parser.parse_args(argv[1:])
            except SystemExit:
                pytest.fail(f"{name}: the command line refuses {command!r}")


@needs_promtool
def test_rules_with_a_short_for_are_still_valid(tmp_path):
    """What the live test does: every alert's for: cut to 0 s, recording rules left alone (they take none)."""
    groups = load_rules()
    fast = with_for(groups, "0s")
    assert groups != fast and all(r.get("for") == "0s" for g in fast for r in g["rules"] if "alert" in r)
    assert not any("for" in r for g in fast for r in g["rules"] if "record" in r)
    run = promtool("check", "rules", str(write_rules(fast, tmp_path / "fast.yml")))
    assert run.returncode == 0, run.stdout + run.stderr
