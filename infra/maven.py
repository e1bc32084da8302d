"""Jars from Maven Central, resolved once with `mvn` into a cache directory (the Kafka broker, S3Proxy)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from infra.paths import flywheel_home


def resolve_jars(pom: Path, libs: Path, what: str, main_jar: str, quiet: bool = False) -> Path:
    """The runtime classpath of the small Maven project `pom`, copied into `libs` (once: a complete `libs`
    is returned as it is). `main_jar`: the prefix of a jar that must be among them (else nothing is kept)."""
    marker = libs / ".complete"
    if marker.exists():
        return libs
    if shutil.which("mvn") is None:
        raise RuntimeError(f"mvn not found: Maven is needed once to fetch the {what} jars")
    libs.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="libs-", dir=libs.parent))
    cmd = [
        "mvn",
        "-B",
        "-q",
        "-f",
        str(pom),
        f"-Dmaven.repo.local={flywheel_home() / 'm2'}",
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    if not quiet:
        print(f"fetching {what} jars from Maven Central ...", file=sys.stderr)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    jars = list(staging.glob("*.jar"))
    if proc.returncode != 0 or not any(j.name.startswith(main_jar) for j in jars):
        shutil.rmtree(staging, ignore_errors=True)
        if proc.returncode != 0:
            raise RuntimeError(f"mvn failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        raise RuntimeError(f"mvn resolved no {main_jar}* jar for {what}")
    if libs.exists():
        shutil.rmtree(libs)
    os.replace(staging, libs)
    marker.write_text(f"{len(jars)} jars in {time.monotonic() - t0:.1f}s\n")
    if not quiet:
        print(f"{what}: {len(jars)} jars in {libs}", file=sys.stderr)
    return libs
