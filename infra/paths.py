"""Where Flywheel keeps what outlives a checkout: the virtualenv, Kafka jars, built models."""

from __future__ import annotations

from pathlib import Path

from infra.config import env

REPO_ROOT = Path(__file__).resolve().parents[1]


def flywheel_home() -> Path:
    """$FLYWHEEL_HOME, default ~/.cache/flywheel; created on first use."""
    home = Path(env("FLYWHEEL_HOME") or Path.home() / ".cache" / "flywheel")
    home.mkdir(parents=True, exist_ok=True)
    return home
