"""Shared fixtures: a real Kafka broker, a real S3 server (S3Proxy), the bootstrapped test model, a real SGLang
replica.

Each server is started here, on 127.0.0.1 and free ports, and stopped here by PID. Set
FLYWHEEL_KAFKA_BOOTSTRAP to use an external broker instead of starting one.

Where tests live and how `make test` runs them in parallel: tests/README.md. Under pytest-xdist each worker is a
process with session fixtures of its own; `--dist loadfile` keeps each file's tests on one worker, and here every
file that uses the session's replicas (`replica`, `second_replica`, `gateway`) goes to one worker, so that they
are started once and those files run in the order they would alone (pytest_xdist_make_scheduler below).
"""

from __future__ import annotations

import os
from pathlib import Path

# Every process of the suite (the tests, and the trainers and tools they start) waits passively at OpenMP's
# barriers: two workers' torch threads share two cores, and spinning ones burn the time the other needs (the
# learning test beside a copy of itself: 214 s -> 110 s, user CPU 5 min 19 s -> 39 s). libgomp reads it when
# torch loads, so it is set before anything imports torch. SGLang replicas run passive already.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402

from contracts import replica_keys  # noqa: E402

# The session's replicas run with both keys, as a fleet's do (contracts.replica_keys): the test process holds
# both, and what it starts inherits them; tests of the boundary itself call without them, or with the wrong one.
os.environ.setdefault(replica_keys.INFERENCE_ENV, replica_keys.new_key("inference"))
os.environ.setdefault(replica_keys.ADMIN_ENV, replica_keys.new_key("admin"))


SESSION_REPLICA_FIXTURES = {"launched_replicas", "replica", "second_replica", "gateway"}
# Files that run fleets over test hosts, each with a three-node Kafka cluster: one worker runs them one after the
# other. Beside each other they overloaded the two cores (the cluster test 35 s -> 154 s, and both failed: events
# not read back in 120 s, a fleet's requests answered 502).
MULTI_HOST_FILES = {
    "tests/integration/flywheel/hosts/test_hosts.py",
    "tests/integration/flywheel/kafka/test_kafka_cluster.py",
    "tests/integration/loadtests/test_host_fleet.py",
}


def on_session_replicas(root: Path) -> set[str]:
    """The integration test files (paths as in node ids) with a test or fixture that takes one of the session's
    replica fixtures, read with ast: the xdist controller schedules by node id and collects nothing itself."""
    import ast

    found = set()
    for path in sorted((root / "tests" / "integration").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if SESSION_REPLICA_FIXTURES & {a.arg for a in node.args.args + node.args.kwonlyargs}:
                    found.add(path.relative_to(root).as_posix())
                    break
    return found


def pytest_addoption(parser):
    parser.addoption(
        "--record-durations",
        action="store_true",
        help="rewrite tests/durations.json (each file's seconds, the order make test's workers get files in: "
        "tests/schedule.py) from this run",
    )


def pytest_configure(config):
    if config.getoption("record_durations"):
        from tests.schedule import DurationRecorder

        config.pluginmanager.register(DurationRecorder(), "flywheel-duration-recorder")
    config.addinivalue_line(
        "markers",
        "serial: not safe beside another test (it measures wall or CPU time against limits, or fingerprints "
        "directories other tests write); `make test` runs these alone after the parallel run",
    )


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with every file on the session's replicas as one unit: they go to one worker (each
    worker is a process with session fixtures of its own, so the replicas start once) and run there in their
    serial order (a test that switches the replicas' weights puts them back for the tests after it). The
    multi-host files are one unit too (MULTI_HOST_FILES). Every other file is a unit of its own, as loadfile makes
    it. Units are handed out longest first, by an earlier run's seconds (tests/schedule.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    from tests import schedule

    together = on_session_replicas(config.rootpath)
    if moved := sorted(p for p in MULTI_HOST_FILES if not (config.rootpath / p).is_file()):
        raise pytest.UsageError(f"tests/conftest.py: MULTI_HOST_FILES names files that are not there: {moved}")

    class LoadFileSessionReplicasTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path in together:
                return "session-replicas"
            return "multi-host" if path in MULTI_HOST_FILES else path

        def _assign_work_unit(self, node) -> None:
            # The queue is whole before the first unit is handed out (LoadScopeScheduling.schedule): order it once.
            if not getattr(self, "_longest_first", False):
                order = schedule.longest_first(self.workqueue, schedule.load())
                self.workqueue = type(self.workqueue)((scope, self.workqueue[scope]) for scope in order)
                self._longest_first = True
            super()._assign_work_unit(node)

    return LoadFileSessionReplicasTogether(config, log)


def pytest_ignore_collect(collection_path, config):
    # make test's second phase (`-m serial`): a file that never says `mark.serial` has no serial test, and
    # importing every test file is most of the ~14 s a collection of the whole suite takes (torch, hypothesis,
    # the SDKs).
    if config.getoption("markexpr") == "serial" and collection_path.suffix == ".py" and collection_path.is_file():
        if collection_path.name.startswith("test_") and "mark.serial" not in collection_path.read_text():
            return True
    return None


def pytest_collection_modifyitems(config, items):
    # The order of the run: by kind, then by file name, whatever package folder a file sits in (a stable sort:
    # a file's own order kept). The tests were in two flat folders before; moving a file between folders must not
    # change what the session's servers have seen before each test (a replica's weights, its prefix cache).
    items.sort(key=lambda item: (item.path.parent.relative_to(config.rootpath).parts[:2], item.path.name))
    # What the scheduler read from the source must be what the fixtures say (a replica fixture reached through
    # a fixture of a conftest would be missed there).
    uses = {
        item.path.relative_to(config.rootpath).as_posix()
        for item in items
        if SESSION_REPLICA_FIXTURES & set(getattr(item, "fixturenames", ()))
    }
    if missed := uses - on_session_replicas(config.rootpath):
        raise pytest.UsageError(f"tests/conftest.py: on_session_replicas misses {sorted(missed)}")


def pytest_sessionfinish(session, exitstatus):
    # A run that executes no test must fail (e.g. everything deselected or skipped). Under xdist the
    # controller judges the whole run; a worker may well have been sent nothing.
    if hasattr(session.config, "workerinput"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    passed = len(reporter.stats.get("passed", [])) if reporter else 0
    if exitstatus == 0 and passed == 0:
        session.exitstatus = 1
        if reporter:
            reporter.write_line("flywheel: no test passed in this run; failing it", red=True)


@pytest.fixture(scope="session", autouse=True)
def kafka_security(tmp_path_factory):
    """The session's Kafka credentials and CA (flywheel.kafka.security), shared by every broker a test starts
    ($FLYWHEEL_KAFKA_SECURITY_DIR); this process logs in as the operator (`admin`), and so does what it starts
    unless given a role (the gateway fixture: `gateway`; a fleet's processes: theirs)."""
    if os.environ.get("FLYWHEEL_KAFKA_BOOTSTRAP"):  # an external broker: its operator says how to log in
        yield None
        return
    from flywheel.kafka.broker import SECURITY_DIR_ENV
    from flywheel.kafka.security import create_security
    from infra import kafka_auth

    sec = create_security(tmp_path_factory.mktemp("kafka-security"))
    with kafka_auth.acting_as({SECURITY_DIR_ENV: str(sec.dir), **sec.client_env("admin")}):
        yield sec


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory) -> str:
    external = os.environ.get("FLYWHEEL_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    from flywheel.kafka import broker as kafka_broker

    broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp_path_factory.mktemp("kafka")))
    try:
        yield broker.bootstrap
    finally:
        assert broker.stop(), f"broker pid {broker.pid} did not stop"


@pytest.fixture(scope="session")
def s3proxy(tmp_path_factory):
    """S3Proxy (filesystem backend, signed requests) on 127.0.0.1 and a free port, for the whole session;
    stopped by PID here, and by its death signal if pytest itself is killed (infra.procs.spawn)."""
    from flywheel import s3proxy as s3p

    server = s3p.start(s3p.S3ProxyConfig(data_dir=tmp_path_factory.mktemp("s3proxy")))
    try:
        yield server
    finally:
        assert server.stop(), f"S3Proxy pid {server.pid} did not stop"


@pytest.fixture(scope="session")
def test_model() -> Path:
    """The test-preset checkpoint (built once per cache, then reused)."""
    from online_rl.model.bootstrap import bootstrap

    return bootstrap("test", seed=0, progress=False)


@pytest.fixture(scope="session")
def gateway(launched_replicas, kafka_bootstrap, kafka_security, replica, test_model, tmp_path_factory):
    """A gateway process (`flywheel serve`) in front of the session replica, logging to the session broker
    (started while the replica loads)."""
    from serving import gateway_process
    from tests.helpers import GATEWAY_ADMIN, GATEWAY_KEYS

    gw = gateway_process.start(
        [replica.url],
        test_model,
        tmp_path_factory.mktemp("gw"),
        kafka=kafka_bootstrap,
        keys=GATEWAY_KEYS,
        admin_token=GATEWAY_ADMIN,
        env=kafka_security.client_env("gateway") if kafka_security else None,
    )
    try:
        yield gw
    finally:
        assert gw.stop(), f"gateway pid {gw.pid} did not stop"


def _launch(test_model, tmp_path_factory, logs: str):
    from serving.replica.process import ReplicaConfig, start

    # One torch thread each (passive OpenMP waits), as fleets run them (two share the cores); and so their
    # children are forked (serving.replica.cpu_compat).
    cfg = ReplicaConfig(model_path=test_model, log_dir=tmp_path_factory.mktemp(logs), threads=1)
    return start(cfg, wait=False)


def _stop(r) -> str:
    """What went wrong stopping r ("" if nothing)."""
    if not r.stop():
        return f"replica pid {r.pid} did not stop"
    return f"replica's temp dir {r.tmp_dir} outlived it" if r.tmp_dir and Path(r.tmp_dir).exists() else ""


def _uses(session, fixture: str) -> bool:
    return any(fixture in getattr(item, "fixturenames", ()) for item in session.items)  # the closure: gateway's too


@pytest.fixture(scope="session")
def launched_replicas(request, test_model, tmp_path_factory):
    """The session's SGLang replicas, launched (not yet ready: `replica` and `second_replica` wait for
    them), so that they load while other fixtures start (the broker) and side by side. Each is launched
    here only if a test of this session uses it (else by its fixture, if asked after all)."""
    launched = {}
    try:
        for name, fixture in (("first", "replica"), ("second", "second_replica")):
            if _uses(request.session, fixture):
                launched[name] = _launch(test_model, tmp_path_factory, f"replica-{name}-logs")
        yield launched
    finally:
        problems = [p for p in (_stop(r) for r in launched.values()) if p]  # every one stopped, then judged
        assert not problems, problems


@pytest.fixture(scope="session")
def replica(launched_replicas, test_model, tmp_path_factory):
    """One SGLang replica serving the test model for the whole session (start-up costs ~20-40 s)."""
    if "first" not in launched_replicas:
        launched_replicas["first"] = _launch(test_model, tmp_path_factory, "replica-first-logs")
    return launched_replicas["first"].ready()


@pytest.fixture(scope="session")
def second_replica(launched_replicas, test_model, tmp_path_factory):
    """A second replica, for fleet tests (weight switches, borrowing). Two replicas share the 2 cores."""
    if "second" not in launched_replicas:
        launched_replicas["second"] = _launch(test_model, tmp_path_factory, "replica-second-logs")
    return launched_replicas["second"].ready()


@pytest.fixture
def make_hosts():
    """Test hosts for one test (flywheel.hosts.netns): `hosts = make_hosts(3)` gives three network namespaces on
    a bridge; every set made is removed when the test ends, failed or not (and by the next run's reaper if
    this one is killed -9). Needs root."""
    from flywheel.hosts.netns import HostsConfig, TestHosts

    made = []

    def up(n: int = 3, **cfg) -> TestHosts:
        made.append(TestHosts.up(HostsConfig(n=n, **cfg)))
        return made[-1]

    yield up
    for hosts in made:
        hosts.down()
