"""A real S3 protocol server for tests and benchmarks: S3Proxy (org.gaul:s3proxy) on the jclouds filesystem
backend, on loopback and a free port, with an access key and secret so requests are really signed.

The jars come from Maven Central through the small Maven project beside this file and are cached under
$FLYWHEEL_HOME/s3proxy/<version>/libs (resolved once; a second start downloads nothing). A bucket is a
directory under the data dir's `buckets/` (that is how the filesystem backend stores them), so
`make_bucket` needs no S3 call. The server keeps its pid and endpoint in <data_dir>/s3proxy.json; `start`
returns only once it answers HTTP.

    python -m flywheel.s3proxy fetch     # resolve the jars into the cache (scripts/setup.sh does this)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from infra.maven import resolve_jars
from infra.paths import flywheel_home
from infra.procs import (
    free_port,
    identity,
    read_state,
    same_process,
    spawn,
    stop_recorded,
    tail,
    wait_until,
    write_state,
)

POM = Path(__file__).resolve().parent / "s3proxy_maven" / "pom.xml"
STATE_FILE = "s3proxy.json"  # present while the server runs
MAIN_CLASS = "org.gaul.s3proxy.Main"
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")  # S3's rule for bucket names


def pinned_version() -> str:
    """The S3Proxy version pinned in the Maven project (the one place it is written)."""
    m = re.search(r"<s3proxy\.version>([^<]+)</s3proxy\.version>", POM.read_text())
    assert m, f"no s3proxy.version property in {POM}"
    return m.group(1)


@dataclass
class S3ProxyConfig:
    data_dir: Path = field(default_factory=lambda: flywheel_home() / "s3proxy-data")
    port: int = 0  # 0: a free port
    host: str = "127.0.0.1"
    # Signed requests (AWS signature v2 or v4, as clients choose): a client without these is refused.
    access_key: str = "flywheel"
    secret_key: str = "flywheel-secret"
    # jclouds' own filesystem backend. S3Proxy 2.6 logs it as deprecated in favour of its "filesystem-nio2";
    # both passed our tests; the brief asked for the jclouds one.
    provider: str = "filesystem"
    heap: str = "256m"
    # C1 only: starts in about half the time, for tests. A benchmark turns it off (full JIT: faster uploads).
    quick_start: bool = True
    start_timeout_s: float = 60.0


@dataclass
class S3Proxy:
    pid: int
    endpoint: str  # http://host:port
    data_dir: Path
    access_key: str
    secret_key: str
    log_file: Path

    @property
    def buckets_dir(self) -> Path:
        return self.data_dir / "buckets"

    def make_bucket(self, name: str) -> str:
        """Create a bucket (a directory of the filesystem backend); returns its name."""
        if not _BUCKET.match(name):
            raise ValueError(f"bad bucket name {name!r}")
        (self.buckets_dir / name).mkdir(parents=True, exist_ok=True)
        (self.buckets_dir / name).chmod(0o700)  # private: see _PRIVATE
        return name

    def env(self) -> dict[str, str]:
        """The standard AWS_* variables that point an S3 client at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
        }

    def stop(self, timeout: float = 20.0) -> bool:
        return stop_recorded(self.pid, self.data_dir / STATE_FILE, timeout)


def libs_dir(version: str | None = None) -> Path:
    return flywheel_home() / "s3proxy" / (version or pinned_version()) / "libs"


def fetch_jars(quiet: bool = False) -> Path:
    """Resolve S3Proxy and its runtime classpath with mvn into the cache (once)."""
    version = pinned_version()
    return resolve_jars(POM, libs_dir(version), f"S3Proxy {version}", f"s3proxy-{version}.jar", quiet)


# S3Proxy ships no logging configuration, and logback's default is DEBUG on stdout (hundreds of lines a
# second under load): INFO to a file instead.
_LOGBACK = """\
<configuration>
  <appender name="file" class="ch.qos.logback.core.FileAppender">
    <file>{log}</file>
    <encoder><pattern>%d %-5level %logger{{36}} - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="file"/></root>
</configuration>
"""


# The filesystem backend takes a bucket or an object that others may read (its directory's or file's mode has
# o+r) as public-read, and S3Proxy then answers anonymous GETs and listings of it: with the default umask,
# every bucket made as a directory was readable by anyone who could reach the port, credentials or not. So
# buckets are made 0700 and the server runs under this umask: what it writes is private too.
_PRIVATE = 0o077


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and Path(java_home, "bin", "java").exists():
        return str(Path(java_home, "bin", "java"))
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java not found: S3Proxy needs Java 17 or newer")
    return java


def answers(endpoint: str, timeout_s: float = 2.0) -> bool:
    """True when something speaks HTTP at endpoint (an anonymous request gets S3's 403: that is an answer)."""
    try:
        with urllib.request.urlopen(endpoint + "/", timeout=timeout_s):
            return True
    except urllib.error.HTTPError:
        return True


def running(data_dir: Path) -> S3Proxy | None:
    """The server recorded in data_dir, if its process is alive."""
    state = read_state(Path(data_dir) / STATE_FILE)
    if not state or not same_process(state):
        return None
    return S3Proxy(
        pid=state["pid"],
        endpoint=state["endpoint"],
        data_dir=Path(data_dir),
        access_key=state["access_key"],
        secret_key=state["secret_key"],
        log_file=Path(state["log_file"]),
    )


def start(cfg: S3ProxyConfig | None = None, die_with_parent: bool = True) -> S3Proxy:
    """Start S3Proxy on the filesystem backend and wait until it answers."""
    cfg = cfg or S3ProxyConfig()
    data_dir = Path(cfg.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    existing = running(data_dir)
    if existing is not None:
        raise RuntimeError(f"S3Proxy already runs from {data_dir} (pid {existing.pid}, {existing.endpoint})")
    libs = fetch_jars(quiet=True)
    data_dir.chmod(0o700)  # the config and state files written below hold the secret
    (data_dir / "buckets").mkdir(exist_ok=True)
    for bucket in (data_dir / "buckets").iterdir():  # made by an earlier start, or by hand
        if bucket.is_dir():
            bucket.chmod(0o700)
    port = cfg.port or free_port(cfg.host)
    endpoint = f"http://{cfg.host}:{port}"
    props = data_dir / "s3proxy.conf"
    props.write_text(
        f"s3proxy.endpoint={endpoint}\n"
        "s3proxy.authorization=aws-v2-or-v4\n"
        f"s3proxy.identity={cfg.access_key}\n"
        f"s3proxy.credential={cfg.secret_key}\n"
        f"jclouds.provider={cfg.provider}\n"
        f"jclouds.filesystem.basedir={data_dir / 'buckets'}\n"
    )
    props.chmod(0o600)  # it holds the secret
    log_file = data_dir / "s3proxy.log"
    logback = data_dir / "logback.xml"
    logback.write_text(_LOGBACK.format(log=log_file))
    cmd = [
        _java(),
        f"-Xmx{cfg.heap}",
        *(["-XX:TieredStopAtLevel=1"] if cfg.quick_start else []),
        "-Djava.awt.headless=true",
        f"-Dlogback.configurationFile={logback}",
        "-cp",
        f"{libs}/*",
        MAIN_CLASS,
        "--properties",
        str(props),
    ]
    stdout = open(data_dir / "s3proxy.stdout", "ab")
    proc = spawn(
        cmd,
        die_with_parent=die_with_parent,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        umask=_PRIVATE,
    )
    stdout.close()
    server = S3Proxy(proc.pid, endpoint, data_dir, cfg.access_key, cfg.secret_key, log_file)
    write_state(
        data_dir / STATE_FILE,
        {
            **identity(proc.pid),
            "endpoint": endpoint,
            "access_key": cfg.access_key,
            "secret_key": cfg.secret_key,
            "log_file": str(log_file),
            "version": pinned_version(),
            "started": time.time(),
        },
    )
    (data_dir / STATE_FILE).chmod(0o600)
    try:
        wait_until(
            lambda: answers(endpoint),
            cfg.start_timeout_s,
            interval=0.25,
            what=f"S3Proxy on {endpoint}",
            alive=lambda: proc.poll() is None,
        )
    except (TimeoutError, RuntimeError) as e:
        server.stop()
        raise RuntimeError(
            f"{e}\n--- s3proxy.stdout ---\n{tail(data_dir / 's3proxy.stdout')}\n--- s3proxy.log ---\n{tail(log_file)}"
        ) from None
    return server


if __name__ == "__main__":
    if sys.argv[1:] != ["fetch"]:
        sys.exit("usage: python -m flywheel.s3proxy fetch")
    print(fetch_jars())
