"""The event shipper runs below serving's CPU priority: delivery is on no request's path."""

import psutil

from serving.event_log.pipeline import EventLog, EventLogConfig
from tests.spool_helpers import wait_for


def _nice_of_shipper(tmp_path, **cfg) -> int:
    log = EventLog(EventLogConfig(spool_dir=tmp_path, bootstrap="127.0.0.1:9", **cfg)).start()
    try:
        shipper = psutil.Process(log._shipper.pid)
        mine = psutil.Process().nice()
        assert wait_for(lambda: shipper.nice() != mine or cfg.get("shipper_nice") == 0, timeout=30)
        return shipper.nice() - mine
    finally:
        log.close(timeout=5)


def test_the_shipper_lowers_its_priority_and_zero_leaves_it(tmp_path):
    assert _nice_of_shipper(tmp_path / "a") == 10
    assert _nice_of_shipper(tmp_path / "b", shipper_nice=0) == 0
