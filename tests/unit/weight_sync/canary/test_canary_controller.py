"""The canary controller's loop on its own (its gateway calls and topic reads replaced; the live controller against a
real gateway and broker is tests/integration/weight_sync/canary/test_canary.py): an override read with other records
loses none of them, and a gateway that fails during a trial neither ends the controller nor leaves the split."""

from __future__ import annotations

import threading
import urllib.error

from admin_api.client import AdminClient
from weight_sync.canary.controller import CanaryConfig, CanaryController
from weight_sync.manifest import generate_key
from weight_sync.publish import PublishConfig


def arm(n: int, p: float) -> dict:
    a = round(n * p)
    return {"requests": n, "errors": 0, "accepts": a, "rejects": n - a, "feedback": n, "acceptance": p, "p99_ms": 90.0}


class Gateway(AdminClient):
    """The admin API as the controller calls it: two replicas, r1 loads what a canary record names; GET
    /admin/canary fails `failures` times first (a gateway restarting), then reports a clearly better canary."""

    def __init__(self, failures: int = 0, fail_put: int = 0):
        super().__init__("http://unused", "t")
        self.failures, self.fail_put, self.canary_version, self.split, self.calls = failures, fail_put, None, None, []

    def call(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> dict:
        self.calls.append((method, path))
        if path == "/admin/weights":
            return {"replicas": {"r0": 1, "r1": self.canary_version or 1}}
        if method == "PUT":
            if self.fail_put:
                self.fail_put -= 1
                raise urllib.error.URLError("connection refused")
            self.split = body
            return {"canary": body}
        if method == "DELETE":
            self.split = None
            return {"canary": None}
        if self.failures:
            self.failures -= 1
            raise urllib.error.URLError("connection refused")
        return {"canary": {"arms": {"canary": arm(400, 0.8), "stable": arm(400, 0.5)}}}


def controller(tmp_path, gateway: Gateway, records: list[list[dict]]) -> tuple[CanaryController, list]:
    generate_key(tmp_path / "s.pem", tmp_path / "s.pub")
    cfg = CanaryConfig(
        gateway_url="http://unused",
        admin_token="t",
        publish=PublishConfig(store=tmp_path / "store", private_key=tmp_path / "s.pem"),
        poll_s=0.01,
        max_trial_s=30.0,
        switch_timeout_s=5.0,
    )
    ctl = CanaryController(cfg)
    announced: list[tuple[str, int]] = []

    def announce(kind: str, version: int, reason: str, **extra) -> dict:
        announced.append((kind, version))
        if kind == "canary":
            gateway.canary_version = version
        rec = {"type": kind, "version": version, "reason": reason, "seq": len(announced), **extra}
        ctl._mine.add(rec["seq"])
        return rec

    ctl.admin, ctl._announce = gateway, announce
    ctl._records = lambda: records.pop(0) if records else []
    return ctl, announced


def run_until_decided(ctl: CanaryController, gateway: Gateway) -> None:
    """The controller's main loop in a thread (its topic reads already replaced) until its first decision."""

    class Consumer:
        def close(self):
            pass

    ctl._open = lambda: Consumer()
    done, decided = threading.Event(), ctl._decided

    def decided_then_stop(rec):
        done.set()
        ctl._stop.set()
        return decided(rec)

    ctl._decided = decided_then_stop
    t = threading.Thread(target=ctl.run, daemon=True)
    t.start()
    assert done.wait(20), gateway.calls
    t.join(10)
    assert not t.is_alive()


def test_an_override_keeps_the_records_read_with_it(tmp_path):
    promote = {"type": "promote", "version": 5, "seq": 101, "reason": "SRE"}
    later = {"type": "version", "version": 6, "canary": True, "seq": 102}
    ctl, _ = controller(tmp_path, Gateway(), [[{"type": "version", "version": 4}, promote, later]])
    assert ctl._override(5) == promote
    assert ctl._pending == [{"type": "version", "version": 4}, later]  # before: v6 was dropped, never trialled


def test_a_gateway_failing_mid_trial_is_waited_for(tmp_path):
    gateway = Gateway(failures=3)
    ctl, announced = controller(tmp_path, gateway, [])
    rec = ctl.trial(2)
    assert rec["type"] == "promote" and announced == [("canary", 2), ("promote", 2)]
    assert gateway.split is None  # the split ended with the trial
    assert gateway.calls.count(("GET", "/admin/canary")) == 4  # three failures waited out (before: raised)


def test_a_trial_the_gateway_broke_starts_again_and_the_split_ends(tmp_path, monkeypatch):
    """The PUT of the split refused: the controller lives on, ends any split, and trials the version again."""
    monkeypatch.setattr("weight_sync.canary.controller.RETRY_TRIAL_S", 0.01)
    gateway = Gateway(fail_put=1)
    records = [[{"type": "version", "version": 2, "canary": True, "seq": 1}]]
    ctl, announced = controller(tmp_path, gateway, records)

    run_until_decided(ctl, gateway)
    assert announced == [("canary", 2), ("canary", 2), ("promote", 2)]  # before: run() died at the PUT
    puts = [i for i, c in enumerate(gateway.calls) if c == ("PUT", "/admin/canary")]
    assert len(puts) == 2 and ("DELETE", "/admin/canary") in gateway.calls[puts[0] : puts[1]]  # split ended between
    assert gateway.split is None and ctl.decisions[-1]["type"] == "promote"


def test_a_retried_trial_keeps_its_stable_version_and_a_hopeless_one_is_rolled_back(tmp_path, monkeypatch):
    """The canary replica already serves the candidate when its trial is retried: stable stays the version
    the first attempt compared against (a tie of one replica each once made the candidate its own stable).
    A trial the gateway breaks every time is rolled back after MAX_TRIAL_ATTEMPTS, never retried forever."""
    monkeypatch.setattr("weight_sync.canary.controller.RETRY_TRIAL_S", 0.01)
    gateway = Gateway(fail_put=10**6)
    records = [[{"type": "version", "version": 9, "canary": True, "seq": 1}]]
    ctl, announced = controller(tmp_path, gateway, records)
    gateway.calls.clear()

    run_until_decided(ctl, gateway)
    from weight_sync.canary.controller import MAX_TRIAL_ATTEMPTS

    assert announced == [("canary", 9)] * MAX_TRIAL_ATTEMPTS + [("rollback", 9)]
    assert ctl.decisions[-1]["stable"] == 1  # r0's version, though r1 served v9 from the first attempt on
    assert gateway.split is None
