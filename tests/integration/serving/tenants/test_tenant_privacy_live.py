"""Tenants' privacy end to end, for real: a gateway process (`flywheel serve`) in front of the session's
SGLang replica, a broker of this test's own, the trainer in this process, and the operator's commands
(`flywheel tenants ...`). A completion whose prompt holds a secret reaches Kafka without its content; a
tenant forgotten mid-run has nothing left in the gateway's spool, the trainer's checkpoints after the
forget or its ledger from then on, and `flywheel tenants provenance` lists the versions trained on it; a
tenant set to `train: deny` is served and counted and logged without content."""

from __future__ import annotations

import json

import pytest

from contracts import events as ev
from flywheel.cli import main as flywheel
from flywheel.kafka import broker as kafka_broker
from infra.procs import wait_until
from online_rl.config import OptimConfig, PublisherConfig, TrainerConfig
from online_rl.trainer.loop import Trainer
from serving import gateway_process
from tests.helpers import events_until

pytestmark = pytest.mark.timeout(600)
ADMIN = "tenants-admin"
KEYS = {"acme": "key-acme", "initech": "key-initech"}
AWS = "AKIAZ4QW7PLX2MTRB6NE"  # an AWS access key id's shape (not a real key)
AWS_SECRET = "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"


def call(url: str, key: str, path: str, body: dict) -> dict:
    import urllib.request

    req = urllib.request.Request(
        f"{url}{path}",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def complete_and_accept(url: str, tenant: str, prompt: str) -> str:
    cid = call(url, KEYS[tenant], "/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 8})["id"]
    call(url, KEYS[tenant], "/v1/feedback", {"completion_id": cid, "kind": "accept"})
    return cid


def logged(bootstrap: str, *cids: str) -> dict:
    """The completion events on Kafka by id, read until those of `cids` are there (shipped a moment after
    the answer)."""
    events = events_until(bootstrap, ev.TOPIC_COMPLETIONS, lambda es: set(cids) <= {e.completion_id for e in es})
    return {e.completion_id: e for e in events}


def admin(gw_url: str, *args: str) -> int:
    return flywheel(["tenants", *args, "--gateway", gw_url])  # the token from the env, as an operator's


def test_secrets_deny_and_forget_through_the_whole_loop(replica, test_model, tmp_path, capsys, monkeypatch):
    from weight_sync.manifest import generate_key

    monkeypatch.setenv("FLYWHEEL_ADMIN_TOKEN", ADMIN)  # never on a command line

    broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp_path / "kafka"))
    gw = trainer = None
    try:
        gw = gateway_process.start(
            [replica.url], test_model, tmp_path / "gw", kafka=broker.bootstrap, keys=KEYS, admin_token=ADMIN
        )
        generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
        work = tmp_path / "trainer"
        trainer = Trainer(
            TrainerConfig(
                model_dir=test_model,
                work_dir=work,
                kafka_bootstrap=broker.bootstrap,
                group_id="privacy",
                min_batch=1,
                poll_ms=200,
                publish=PublisherConfig(store=tmp_path / "store", key=tmp_path / "k.pem"),
                optim=OptimConfig(lr=1e-4),
            )
        )

        def ingest_until(what: str, cond) -> None:
            def step():
                trainer.ingest()
                return cond()

            wait_until(step, 120, interval=0.1, what=what)

        # 1. Both tenants' code is learned from; a prompt holding a secret is logged without its content.
        acme = [complete_and_accept(gw.url, "acme", f"def acme_ledger_{i}(x):\n") for i in range(4)]
        initech = [complete_and_accept(gw.url, "initech", f"def tps_report_{i}(y):\n") for i in range(4)]
        leaked = complete_and_accept(gw.url, "acme", f'aws_access_key_id = "{AWS}"\naws_secret = "{AWS_SECRET}"\n')
        ingest_until("the first samples", lambda: trainer.joiner.stats.joined >= 8)
        assert trainer.train_step(force=True) is not None
        trainer.checkpoint()
        assert trainer.publish() == 1
        completions = logged(broker.bootstrap, leaked, *acme, *initech)
        assert completions[leaked].withheld == "secret" and completions[leaked].prompt_ids.size == 0
        assert "AWS Access Key" in completions[leaked].secret_types
        assert all(completions[c].withheld == "" and completions[c].prompt_ids.size for c in acme + initech)
        assert leaked not in {e["key"].split(":")[0] for e in _ledger(work)}  # never trained on
        trained_acme = _trained(work, {completions[c].tenant for c in acme})
        assert trained_acme  # acme's code was learned from before it asked to be forgotten

        # 2. acme asks to be forgotten while more of its events are on their way to the trainer.
        late = [complete_and_accept(gw.url, "acme", f"def acme_invoice_{i}(z):\n") for i in range(3)]
        assert admin(gw.url, "forget", "acme", "--json") == 0
        forgot = json.loads(capsys.readouterr().out)
        acme_ids, before = set(forgot["ids"]), forgot["forgotten_before"]
        after = complete_and_accept(gw.url, "initech", "def tps_cover_sheet(y):\n")
        forgotten = lambda: all(  # noqa: E731
            trainer.privacy.policies.get(i, {}).get("forgotten_before") == before for i in acme_ids
        )
        ingest_until("the forget and the later events", lambda: forgotten() and _seen(trainer, after))
        trainer.train_step(force=True)
        trainer.checkpoint()
        assert trainer.publish() == 2

        state = trainer.checkpoints.load(prune=False)
        held = json.dumps(
            {k: v for k, v in state["joiner"].items() if k not in ("seen", "judged", "stats")}, default=repr
        )
        assert not any(s["tenant"] in acme_ids for s in state["buffer"])
        assert not any(i in held for i in acme_ids)  # nothing of acme's waits in the joiner
        assert all(state["privacy"]["policies"][i]["forgotten_before"] == before for i in acme_ids)
        assert _trained(work, acme_ids) == trained_acme  # nothing more of acme's trained after the forget
        assert not {f"{c}:0" for c in late} & _trained(work, acme_ids)

        spool = b"".join(p.read_bytes() for p in (tmp_path / "gw" / "spool").glob("*.log"))
        assert b"acme_ledger" not in spool and b"acme_invoice" not in spool and AWS.encode() not in spool

        # 3. Provenance: v1 was trained on acme's samples; v2's weights still hold them (not un-trained).
        assert admin(gw.url, "provenance", "acme", "--trainer-dir", str(work), "--json") == 0
        prov = json.loads(capsys.readouterr().out)
        assert [v["version"] for v in prov["versions"]] == [1, 2]
        assert sum(prov["versions"][0]["tenants"].values()) >= 1
        assert sum(prov["versions"][1]["tenants"].values()) == 0  # nothing new of acme's in v2

        # 4. initech opts out: served and counted, logged without content, never trained.
        assert admin(gw.url, "policy", "initech", "--train", "deny") == 0
        capsys.readouterr()
        dropped = trainer.privacy.dropped
        withheld = dropped.labels("withheld")._value.get()
        denied = complete_and_accept(gw.url, "initech", "def tps_private(y):\n")
        ingest_until(  # the completion (no content) and its accept (a denying tenant's) are both refused
            "initech's denied events",
            lambda: dropped.labels("withheld")._value.get() > withheld and dropped.labels("deny")._value.get() >= 1,
        )
        records = logged(broker.bootstrap, denied)
        assert records[denied].withheld == "policy" and records[denied].output_ids.size == 0
        want = {("acme", "allow"), ("initech", "deny")}
        policies = events_until(broker.bootstrap, ev.TOPIC_TENANTS, lambda rs: {(r.name, r.train) for r in rs} >= want)
        assert {(r.name, r.train) for r in policies} >= want
        assert all(r.forgotten_before == before for r in policies if r.name == "acme")
        assert all(s.tenant != records[denied].tenant for s in trainer.buffer)
    finally:
        if trainer is not None:
            trainer.reader.close()  # its consumer's threads must not outlive the broker
        if gw is not None:
            assert gw.stop()
        assert broker.stop()


def _seen(trainer, completion_id: str) -> bool:
    return trainer.joiner.stats.consumed and any(
        completion_id in k for k in list(trainer.joiner.judged) + list(trainer.joiner.pending)
    )


def _ledger(work) -> list[dict]:
    return [e for f in sorted((work / "ledger").glob("step-*.json")) for e in json.loads(f.read_text())]


def _trained(work, tenant_ids: set[str]) -> set[str]:
    """The keys of the samples of these tenants the trainer trained (every checkpoint's ledger)."""
    return {e["key"] for e in _ledger(work) if e.get("tenant") in tenant_ids and "dropped" not in e}
