"""Launch, find and stop SGLang replicas (one `sglang.launch_server` process tree each).

On a CPU-only machine the replica runs with SGLang's CPU flags, a bounded KV pool and our
compatibility layer (serving.replica.cpu_compat); on a GPU it runs plain SGLang. A replica records its
pid, URL and log under $FLYWHEEL_HOME/replicas/<port>.json so `flywheel replica stop` finds it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from contracts import replica_keys
from infra.config import option
from infra.paths import REPO_ROOT, flywheel_home
from infra.procs import (
    identity,
    in_netns,
    pid_alive,
    read_state,
    reserve_port,
    same_process,
    spawn,
    stop_pid,
    stop_recorded,
    tail,
    wait_until,
    write_state,
)
from weight_patch import format as weight_patch

TMP_PREFIX = "flywheel-replica-"  # a replica's own temp dir: <tmp>/flywheel-replica-<port>-<random>

CPU_FLAGS = [
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--sampling-backend",
    "pytorch",
    "--grammar-backend",
    "none",
    "--disable-cuda-graph",
    "--sleep-on-idle",
]


@dataclass
class ReplicaConfig:
    """One replica's launch settings; the options are also `flywheel replica start`'s flags (serving.cli)."""

    model_path: Path = option(flag="model", help="checkpoint dir (Hugging Face layout)")
    port: int = option(0, help="port to listen on; 0: a free one")
    host: str = option("127.0.0.1", help="address to listen on")
    netns: str | None = None  # a test host's network namespace to run in (then give the port)
    device: str = option("cpu", help="cpu: SGLang's CPU flags and our compat layer; cuda: plain SGLang")
    # float32 on CPU: bf16 checkpoints are upcast, so trainer and server compute the same numbers.
    dtype: str = option("float32", help="weights and activations dtype")
    # SGLang sizes its KV pool to fill free RAM unless bounded (facts.md: ~14 GB for a tiny model).
    # 64k: a 32k-token agent prompt (and its answer) fits beside others; the test model's KV is 0.5 KB a token
    max_total_tokens: int = option(65536, help="KV pool bound (tokens)")
    max_running_requests: int = option(64, help="requests decoded together at most")
    chunked_prefill_size: int = option(4096, help="prompt tokens prefilled per step at most")
    weight_version: int = option(0, help="the version reported until the first switch (the launch checkpoint's)")
    random_seed: int = option(0, help="SGLang's sampling seed")
    # Replicas sharing a CPU machine should split the cores: two replicas of two threads each on two cores
    # measured a 10x worse p99 (benchmarks.delta). With one, the replica's SGLang children are also forked
    # instead of spawned (no OpenMP worker runs in the launcher; serving.replica.cpu_compat): ready in about half the
    # time.
    threads: int = option(
        0, help="torch intra-op threads; 0: torch's default (all cores)", env="FLYWHEEL_REPLICA_THREADS"
    )
    extra_args: list[str] = field(default_factory=list)
    # Its two keys (contracts.replica_keys): SGLang refuses a caller without the right one. Never flags
    # (a command line is world-readable): None takes the launching process's environment; "" runs without.
    api_key: str | None = field(default=None, repr=False)
    admin_api_key: str | None = field(default=None, repr=False)
    log_dir: Path | None = None
    start_timeout_s: float = option(240.0, help="seconds to wait until it generates, then stop it and fail")


@dataclass
class Replica:
    pid: int
    port: int
    url: str
    log_file: Path
    model_path: str
    api_key: str = field(default="", repr=False)  # the keys it was started with ("": none)
    admin_api_key: str = field(default="", repr=False)
    tmp_dir: str = ""  # its TMPDIR: SGLang's ZMQ sockets, metric files and locks, removed when it stops
    # Its port, held from launch until it listens (infra.procs.reserve_port), when the port was ours to pick.
    port_hold: socket.socket | None = field(default=None, repr=False, compare=False)

    def _release_port(self) -> None:
        if self.port_hold is not None:
            self.port_hold.close()
            self.port_hold = None

    def stop(self, timeout: float = 30.0) -> bool:
        try:
            stopped = stop_recorded(self.pid, _state_dir() / f"{self.port}.json", timeout)
        finally:
            self._release_port()  # after it is gone: nobody else takes its port while it may still bind
        if stopped and self.tmp_dir:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
        return stopped

    def alive(self) -> bool:
        return pid_alive(self.pid)

    def ready(self, timeout_s: float = 240.0) -> "Replica":
        """Wait until it generates; if it dies or times out, stop it and raise with its log's tail."""
        try:
            wait_until(
                lambda: healthy(self.url),
                timeout_s,
                interval=0.5,
                what=f"SGLang replica on {self.url}",
                alive=self.alive,
            )
        except (TimeoutError, RuntimeError) as e:
            self.stop()
            raise RuntimeError(f"{e}\n--- {self.log_file} ---\n{tail(self.log_file, 40)}") from None
        except BaseException:  # Ctrl-C while it loads: a half-started replica is not left behind
            self.stop()
            raise
        self._release_port()  # it listens: the hold has done its job
        return self


def _state_dir() -> Path:
    d = flywheel_home() / "replicas"
    d.mkdir(parents=True, exist_ok=True)
    return d


def command(cfg: ReplicaConfig, port: int) -> list[str]:
    """The full command line of a replica (our launcher, SGLang's module, then its own flags; the keys are
    added by serving.replica.launch from the environment, out of sight of `ps`)."""
    module = "serving.replica.cpu_compat.launch" if cfg.device == "cpu" else "sglang.launch_server"
    args = [
        sys.executable,
        "-m",
        "serving.replica.launch",
        module,
        "--model-path",
        str(Path(cfg.model_path).resolve()),
        "--host",
        cfg.host,
        "--port",
        str(port),
        "--dtype",
        cfg.dtype,
        "--max-total-tokens",
        str(cfg.max_total_tokens),
        "--max-running-requests",
        str(cfg.max_running_requests),
        "--chunked-prefill-size",
        str(cfg.chunked_prefill_size),
        "--enable-return-routed-experts",
        "--enable-metrics",
        "--weight-version",
        str(cfg.weight_version),
        "--random-seed",
        str(cfg.random_seed),
        "--skip-server-warmup",
        # Deltas applied in place by the weights agent (weight_patch.format)
        "--custom-weight-loader",
        weight_patch.LOADER,
        "--log-level",
        "warning",
    ]
    if cfg.device == "cpu":
        args += CPU_FLAGS
    return args + list(cfg.extra_args)


def keys_of(cfg: ReplicaConfig) -> tuple[str, str]:
    """The (inference, admin) keys a replica of cfg starts with."""
    inference = cfg.api_key if cfg.api_key is not None else replica_keys.inference_key()
    admin = cfg.admin_api_key if cfg.admin_api_key is not None else replica_keys.admin_key()
    return inference or "", admin or ""


def _env(cfg: ReplicaConfig) -> dict:
    env = {**os.environ, **replica_keys.env(*keys_of(cfg))}
    # The launcher module must import from this checkout; SGLang's children inherit the path.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("SGLANG_DISABLE_REQUEST_LOGGING", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if cfg.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        if cfg.threads:
            env["OMP_NUM_THREADS"] = str(cfg.threads)
            # Sharing the machine: OpenMP workers spinning between parallel regions would starve the other
            # replicas. (Alone, spinning is faster: PASSIVE cut one replica's tokens/s by ~30%, benchmarks.foundation.)
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def healthy(url: str, timeout: float = 5.0) -> bool:
    """True when the server answers /health_generate (the scheduler can run a forward pass)."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/health_generate", timeout=timeout) as r:
        return r.status == 200


def start(cfg: ReplicaConfig, die_with_parent: bool = True, wait: bool = True) -> Replica:
    """Start a replica and wait until it generates; on failure the log's tail is in the error. It ends
    with the calling process unless die_with_parent is False (the CLI, which starts it and returns). With
    wait=False it returns at once: call `ready()` (several replicas then load side by side)."""
    if cfg.netns and not cfg.port:
        raise ValueError("a replica in a network namespace needs its port")
    # A port of our picking is held until the replica listens: it binds only once loaded (~20 s), and another
    # process picking a free port meanwhile (a second fleet, a test server) could take it. The hold refuses
    # port-0 picks and plain binds; a bind with SO_REUSEADDR (Kafka's, uvicorn's) still shares it.
    hold = None if cfg.port else reserve_port(cfg.host)
    try:
        port = cfg.port if hold is None else hold.getsockname()[1]
        log_dir = Path(cfg.log_dir) if cfg.log_dir else flywheel_home() / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_file = log_dir / f"replica-{port}.log"
        # SGLang leaves its ipc sockets, prometheus files and locks in the temp dir when it is killed (~3 a
        # replica); a private one is removed with the replica, and by `running()` for one that died unstopped.
        tmp_dir = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{port}-")
        try:
            with open(log_file, "ab") as log:
                proc = spawn(
                    in_netns(cfg.netns, command(cfg, port)),
                    die_with_parent=die_with_parent,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env={**_env(cfg), "TMPDIR": tmp_dir},
                    cwd=REPO_ROOT,
                )
        except BaseException:
            shutil.rmtree(tmp_dir, ignore_errors=True)
            raise
    except BaseException:
        if hold is not None:
            hold.close()
        raise
    url = f"http://{cfg.host}:{port}"
    replica = Replica(
        pid=proc.pid,
        port=port,
        url=url,
        log_file=log_file,
        model_path=str(cfg.model_path),
        api_key=keys_of(cfg)[0],
        admin_api_key=keys_of(cfg)[1],
        tmp_dir=tmp_dir,
        port_hold=hold,
    )
    try:
        write_state(
            _state_dir() / f"{port}.json",
            {
                **identity(proc.pid),
                "port": port,
                "url": url,
                "log_file": str(log_file),
                "model_path": str(cfg.model_path),
                "tmp_dir": tmp_dir,
                "started": time.time(),
            },
        )
    except BaseException:  # unrecorded, it would outlive us unseen: stop it now, by its pid (no state file)
        stop_pid(proc.pid)
        replica._release_port()
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    if wait:
        replica.ready(cfg.start_timeout_s)
    return replica


def find(port: int) -> Replica | None:
    state = read_state(_state_dir() / f"{port}.json")
    if not state or not same_process(state):
        return None
    return Replica(
        pid=state["pid"],
        port=state["port"],
        url=state["url"],
        log_file=Path(state["log_file"]),
        model_path=state["model_path"],
        tmp_dir=state.get("tmp_dir", ""),
    )


def running() -> list[Replica]:
    """The replicas started on this machine that still run; what a dead one left (state, temp dir) goes."""
    out = []
    for f in sorted(_state_dir().glob("*.json")):
        r = find(int(f.stem))
        if r is not None:
            out.append(r)
        else:
            tmp_dir = (read_state(f) or {}).get("tmp_dir")
            if tmp_dir and Path(tmp_dir).name.startswith(TMP_PREFIX):  # only what start() made
                shutil.rmtree(tmp_dir, ignore_errors=True)
            f.unlink(missing_ok=True)
    return out
