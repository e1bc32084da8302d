"""The repo's Prometheus alert rules (deploy/prometheus/alerts.yml) and their runbooks (docs/runbooks/), as data.

The rules file is what Prometheus loads; a live test loads it here, cuts every alert's `for:` so that it
can see them fire in seconds, and writes it back (recording rules take no `for:`: Prometheus refuses one).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import yaml

from infra.paths import REPO_ROOT

ALERTS_FILE = REPO_ROOT / "deploy" / "prometheus" / "alerts.yml"
TESTS_FILE = REPO_ROOT / "deploy" / "prometheus" / "alerts_test.yml"
RUNBOOKS_DIR = REPO_ROOT / "docs" / "runbooks"


def load_rules(path: Path | str = ALERTS_FILE) -> list[dict]:
    """The rule groups, as in the file: [{"name", "rules": [{"alert" or "record", "expr", ...}]}]."""
    return yaml.safe_load(Path(path).read_text())["groups"]


def alert_names(groups: list[dict]) -> list[str]:
    """Each alert once, in file order (an alert may have several rules, e.g. one per severity)."""
    return list(dict.fromkeys(r["alert"] for g in groups for r in g["rules"] if "alert" in r))


def with_for(groups: list[dict], duration: str) -> list[dict]:
    """A copy with every alerting rule's `for:` set to `duration` (e.g. "0s"); recording rules untouched."""
    out = copy.deepcopy(groups)
    for g in out:
        for r in g["rules"]:
            if "alert" in r:
                r["for"] = duration
    return out


def write_rules(groups: list[dict], path: Path | str) -> Path:
    path = Path(path)
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


_SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)


def runbook_commands(alert: str, runbooks: Path = RUNBOOKS_DIR) -> list[str]:
    """The commands of an alert's runbook: the first line of each ```sh block, in order (confirm, then fix)."""
    text = (Path(runbooks) / f"{alert}.md").read_text()
    return [block.splitlines()[0] for block in _SH_BLOCK.findall(text) if block.strip()]
