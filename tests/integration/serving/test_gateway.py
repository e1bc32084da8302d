"""The gateway against a real SGLang replica and the real broker, through the official openai client.

Why one file: these tests share one session-scoped replica, broker and gateway process (each
costs seconds to start).
"""

from __future__ import annotations

import json
import time
import uuid

import numpy as np
import openai
import pytest
from kafka import KafkaConsumer

from contracts import events as ev, replica_keys
from infra import kafka_auth
from infra.procs import free_port
from serving import gateway_process
from tests.helpers import GATEWAY_ADMIN, GATEWAY_KEYS, get, post

pytestmark = pytest.mark.timeout(600)

KEYS = GATEWAY_KEYS
ADMIN = GATEWAY_ADMIN
PROMPT = 'def add_three(x):\n    """Return x plus 3."""\n'


def _client(gw, key="key-alice"):
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)


def _engine_greedy(replica, test_model, prompt, max_tokens):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(test_model)(prompt)["input_ids"]
    status, out, _ = post(
        f"{replica.url}/generate",
        {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0, "stop_token_ids": [0, 1, 2, 3]},
        },
        key=replica_keys.inference_key(),
    )
    assert status == 200
    return ids, out


def _read_events(bootstrap, topic, want_ids: set[str], timeout_s=30.0, want: int = 1):
    """Events of these completion ids: until each has `want` of them, or the timeout."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        **kafka_auth.client_config(),
        group_id=f"t-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    found: dict[str, list] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not all(len(found.get(i, [])) >= want for i in want_ids):
            for recs in consumer.poll(timeout_ms=500).values():
                for r in recs:
                    e = ev.decode(r.value)
                    if e.completion_id in want_ids:
                        found.setdefault(e.completion_id, []).append((r.partition, r.key.decode(), e))
    finally:
        consumer.close()
    return found


def test_completions_match_the_engine_and_carry_id_and_version(gateway, replica, test_model):
    ids, direct = _engine_greedy(replica, test_model, PROMPT, 12)
    raw = _client(gateway).completions.with_raw_response.create(
        model="flywheel-coder", prompt=PROMPT, max_tokens=12, temperature=0
    )
    r = raw.parse()
    assert r.choices[0].text == direct["text"]
    assert r.id.startswith("cmpl-") and raw.headers["x-flywheel-model-version"] == "0"
    assert r.model_extra["model_version"] == 0
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == len(direct["output_ids"])


def test_streaming_completions_and_chat(gateway, replica, test_model):
    c = _client(gateway)
    _, direct = _engine_greedy(replica, test_model, PROMPT, 12)
    chunks = list(
        c.completions.create(
            model="m", prompt=PROMPT, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == direct["text"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(direct["output_ids"])
    assert len({ch.id for ch in chunks}) == 1

    chat = c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "add three to x"}], max_tokens=10, temperature=0
    )
    stream = list(
        c.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "add three to x"}],
            max_tokens=10,
            temperature=0,
            stream=True,
        )
    )
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in stream) == chat.choices[0].message.content
    assert stream[-1].choices[0].finish_reason in ("stop", "length")


def test_n_choices_and_logprobs(gateway):
    r = _client(gateway).completions.create(
        model="m", prompt=PROMPT, max_tokens=6, n=3, logprobs=2, temperature=1, seed=7
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) and all(x <= 0 for x in lp.token_logprobs)
    assert all(len(t) <= 2 for t in lp.top_logprobs)


def test_logged_events_match_what_the_client_saw(gateway, kafka_bootstrap, test_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(test_model)
    c = _client(gateway)
    r1 = c.completions.create(model="m", prompt=PROMPT, max_tokens=10, temperature=1.0)
    r2 = c.completions.create(model="m", prompt=PROMPT, max_tokens=10, temperature=1.0, stream=True)
    r2_id, r2_text = None, ""
    for ch in r2:
        r2_id = ch.id
        r2_text += ch.choices[0].text if ch.choices else ""
    assert (
        post(
            f"{gateway.url}/v1/feedback", {"completion_id": r1.id, "kind": "accept", "elapsed_ms": 900}, key="key-alice"
        )[0]
        == 200
    )

    got = _read_events(kafka_bootstrap, ev.TOPIC_COMPLETIONS, {r1.id, r2_id})
    cfg = json.loads((test_model / "config.json").read_text())
    for cid, text in ((r1.id, r1.choices[0].text), (r2_id, r2_text)):
        assert len(got.get(cid, [])) == 1, f"exactly one completion event for {cid}"
        partition, key, e = got[cid][0]
        assert key == cid and e.model_version == 0 and e.source == "user"
        assert list(e.prompt_ids) == tok(PROMPT)["input_ids"]
        assert tok.decode(list(e.output_ids), skip_special_tokens=True) == text
        assert len(e.logprobs) == len(e.output_ids) and np.all(e.logprobs <= 0)
        assert e.routed_experts.shape == (
            len(e.prompt_ids) + len(e.output_ids) - 1,
            cfg["num_hidden_layers"],
            cfg["num_experts_per_tok"],
        )
        assert e.latency["e2e_ms"] > 0 and e.sampling["max_tokens"] == 10
    fb = _read_events(kafka_bootstrap, ev.TOPIC_FEEDBACK, {r1.id})
    ((fb_partition, _, f),) = fb[r1.id]
    assert f.kind == "accept" and f.elapsed_ms == 900 and f.tenant == got[r1.id][0][2].tenant
    assert fb_partition == got[r1.id][0][0], "completion and its feedback share a partition"


def test_feedback_ownership_and_tabby_events(gateway):
    r = _client(gateway).completions.create(model="m", prompt=PROMPT, max_tokens=4)
    url = f"{gateway.url}/v1/feedback"
    assert post(url, {"completion_id": r.id, "kind": "reject"}, key="key-bob")[0] == 403
    status, body, _ = post(url, {"completion_id": "cmpl-1-2-3-4", "kind": "reject"}, key="key-alice")
    assert status == 404 and body["error"]["code"] == "completion_not_found"
    assert post(url, {"completion_id": r.id, "kind": "partial"}, key="key-alice")[0] == 400
    assert post(url, {"completion_id": r.id, "kind": "partial", "accepted_chars": 5}, key="key-alice")[0] == 200
    tabby = f"{gateway.url}/v1/events"
    for etype in ("view", "select", "dismiss"):
        assert (
            post(tabby, {"type": etype, "completion_id": r.id, "choice_index": 0, "elapsed": 10}, key="key-alice")[0]
            == 200
        )
    assert post(tabby + "?select_kind=line", {"type": "select", "completion_id": r.id}, key="key-bob")[0] == 403


def test_session_feedback_is_checked_and_logged_once(gateway):
    url = f"{gateway.url}/v1/feedback"
    r = _client(gateway).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    derived = r.model_extra["session_id"]  # a first turn names the session by its (signed) completion id
    assert post(url, {"session_id": derived, "kind": "reject"}, key="key-bob")[0] == 403  # another tenant's
    status, body, _ = post(url, {"session_id": "cmpl-1-2-3-4", "kind": "accept"}, key="key-alice")
    assert status == 404 and body["error"]["code"] == "completion_not_found"
    bad = [
        ({"session_id": derived, "completion_id": r.id, "kind": "accept"}, "completion_id"),
        ({"kind": "accept"}, "completion_id"),
        ({"session_id": derived, "kind": "partial"}, "score"),
        ({"session_id": derived, "kind": "partial", "score": 1.5}, "score"),
        ({"session_id": derived, "kind": "accept", "score": 0.5}, "score"),
        ({"session_id": derived, "kind": "accept", "choice_index": 0}, "choice_index"),
        ({"session_id": "", "kind": "accept"}, "session_id"),
        ({"session_id": "caf\u00e9", "kind": "accept"}, "session_id"),
        ({"completion_id": r.id, "kind": "partial", "accepted_chars": 1, "score": 0.5}, "score"),
    ]
    for payload, param in bad:
        status, body, _ = post(url, payload, key="key-alice")
        assert status == 400 and body["error"]["param"] == param, (payload, body)
    first = _metric(gateway, "flywheel_gateway_session_feedback_total", "partial")
    for _ in range(3):
        status, body, _ = post(url, {"session_id": derived, "kind": "partial", "score": 0.5}, key="key-alice")
        assert status == 200 and body == {"status": "ok", "session_id": derived}
    assert _metric(gateway, "flywheel_gateway_session_feedback_total", "partial") - first == 1
    assert post(url, {"session_id": "my-ide-session-7", "kind": "accept"}, key="key-alice")[0] == 200  # client-named
    chat = f"{gateway.url}/v1/chat/completions"
    turn = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, body, _ = post(chat, turn, key="key-alice", headers={"X-Session-Id": "cmpl-1-2-3-4"})
    assert status == 400 and body["error"]["param"] == "session_id"  # our ids' shape, not one we issued
    assert post(chat, turn, key="key-bob", headers={"X-Session-Id": derived})[0] == 400  # alice's session
    status, body, _ = post(chat, turn, key="key-alice", headers={"X-Session-Id": derived})
    assert status == 200 and body["session_id"] == derived


def test_comments_and_persistence_checks_reach_the_stream_and_bad_ones_get_a_4xx(gateway, kafka_bootstrap):
    r = _client(gateway).completions.create(model="m", prompt=PROMPT, max_tokens=4)
    url, tabby = f"{gateway.url}/v1/feedback", f"{gateway.url}/v1/events"
    bad = [
        ({"kind": "comment"}, "text"),
        ({"kind": "comment", "text": ""}, "text"),
        ({"kind": "comment", "text": "use x + 3\nimport os"}, "text"),  # a line break: a control character
        ({"kind": "comment", "text": "tab\there"}, "text"),
        ({"kind": "comment", "text": "\u00e9" * 1025}, "text"),  # 2050 bytes of UTF-8
        ({"kind": "comment", "text": "ok", "still_present": True}, "still_present"),
        ({"kind": "persisted", "after_s": 30}, "still_present"),
        ({"kind": "persisted", "still_present": True}, "after_s"),
        ({"kind": "persisted", "still_present": "yes", "after_s": 30}, "still_present"),
        ({"kind": "persisted", "still_present": True, "after_s": -1}, "after_s"),
        ({"kind": "persisted", "still_present": True, "after_s": 30, "edit_distance": -1}, "edit_distance"),
        ({"kind": "persisted", "still_present": True, "after_s": 30, "text": "hm"}, "text"),
        ({"kind": "accept", "still_present": True}, "still_present"),
    ]
    for extra, param in bad:
        status, body, _ = post(url, {"completion_id": r.id, **extra}, key="key-alice")
        assert status == 400 and body["error"]["param"] == param, (extra, body)
    status, body, _ = post(url, {"session_id": "s-1", "kind": "comment", "text": "nice"}, key="key-alice")
    assert status == 400 and body["error"]["param"] == "session_id"
    assert post(url, {"completion_id": r.id, "kind": "comment", "text": "x"}, key="key-bob")[0] == 403
    status, body, _ = post(tabby, {"type": "persisted", "completion_id": r.id}, key="key-alice")
    assert status == 400 and body["error"]["param"] == "still_present"

    ok = [
        (url, {"completion_id": r.id, "kind": "comment", "text": "use x + 3 \u2014 not minus"}),
        (url, {"completion_id": r.id, "kind": "persisted", "still_present": False, "after_s": 120.5}),
        (
            tabby,
            {"type": "persisted", "completion_id": r.id, "still_present": True, "after_s": 600, "edit_distance": 4},
        ),
    ]
    first = _metric(gateway, "flywheel_gateway_feedback_total", "persisted")
    for target, payload in ok:
        assert post(target, payload, key="key-alice")[0] == 200, payload
    assert _metric(gateway, "flywheel_gateway_feedback_total", "persisted") - first == 1  # one check per choice counts
    got = _read_events(kafka_bootstrap, ev.TOPIC_FEEDBACK, {r.id}, want=3)
    events = sorted((e for _, key, e in got[r.id] if key == r.id), key=lambda e: e.ts)
    assert [e.kind for e in events] == ["comment", "persisted", "persisted"]
    assert events[0].text == "use x + 3 \u2014 not minus"
    assert (events[1].still_present, events[1].after_s) == (False, 120.5)
    assert (events[2].still_present, events[2].edit_distance, events[2].origin) == (True, 4, "tabby")


def _metric(gateway, name: str, kind: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = get(f"{gateway.url}/metrics")[1]
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and s.labels.get("kind") == kind
    )


def test_only_the_first_feedback_on_a_choice_counts(gateway):
    """A hundred identical accepts are one accept (in the metrics and for a canary), the rest counted apart."""
    r = _client(gateway).completions.create(model="m", prompt=PROMPT, max_tokens=4, n=2)
    first = _metric(gateway, "flywheel_gateway_feedback_total", "accept")
    repeated = _metric(gateway, "flywheel_gateway_feedback_repeated_total", "accept")
    for _ in range(20):
        assert post(f"{gateway.url}/v1/feedback", {"completion_id": r.id, "kind": "accept"}, key="key-alice")[0] == 200
    assert (
        post(
            f"{gateway.url}/v1/feedback", {"completion_id": r.id, "kind": "accept", "choice_index": 1}, key="key-alice"
        )[0]
        == 200
    )  # the other choice is its own
    assert _metric(gateway, "flywheel_gateway_feedback_total", "accept") - first == 2
    assert _metric(gateway, "flywheel_gateway_feedback_repeated_total", "accept") - repeated == 19


def test_auth_errors_are_openai_shaped(gateway):
    for key in (None, "nope"):
        with pytest.raises(openai.AuthenticationError) as e:
            _client(gateway, key or "").completions.create(model="m", prompt="x", max_tokens=1)
        assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    assert get(f"{gateway.url}/admin/replicas")[0] == 401
    assert get(f"{gateway.url}/admin/replicas", key="key-alice")[0] == 401
    status, body = get(f"{gateway.url}/admin/replicas", key=ADMIN)
    assert status == 200 and json.loads(body)["replicas"][0]["healthy"] is True


def test_admin_refuses_to_drain_the_last_active_replica(gateway):
    status, body, _ = post(f"{gateway.url}/admin/replicas/r0/drain", {}, key=ADMIN)
    assert status == 409 and body["error"]["code"] == "last_active"
    assert post(f"{gateway.url}/admin/replicas/r9/drain", {}, key=ADMIN)[0] == 404
    status, body = get(f"{gateway.url}/admin/weights", key=ADMIN)
    assert json.loads(body)["replicas"] == {"r0": 0}


def test_metrics(gateway):
    _client(gateway).completions.create(model="m", prompt=PROMPT, max_tokens=2, stream=True).close()
    status, text = get(f"{gateway.url}/metrics")
    assert status == 200
    for name in (
        "flywheel_gateway_requests_total",
        "flywheel_gateway_time_to_first_token_seconds_bucket",
        "flywheel_gateway_e2e_latency_seconds_bucket",
        "flywheel_replica_inflight_requests",
        'flywheel_events_total{state="produced"}',
        "flywheel_replica_weight_version",
        "flywheel_event_spool_pending_bytes",
    ):
        assert name in text, name


def test_dead_replica_is_routed_around_and_its_admin_states(replica, test_model, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    gw = gateway_process.start([dead, replica.url], test_model, tmp_path / "gw", keys=KEYS, admin_token=ADMIN)
    try:
        c = _client(gw)
        for _ in range(6):
            assert c.completions.create(model="m", prompt=PROMPT, max_tokens=3).choices
        reps = {r["id"]: r for r in json.loads(get(f"{gw.url}/admin/replicas", key=ADMIN)[1])["replicas"]}
        assert reps["r0"]["healthy"] is False and reps["r0"]["served"] == 0 and reps["r1"]["served"] == 6
        # Borrowed replicas take no user traffic; with nothing active the gateway says so (503), never hangs.
        assert post(f"{gw.url}/admin/replicas/r0/activate", {}, key=ADMIN)[0] == 200
        assert post(f"{gw.url}/admin/replicas/r1/borrow", {}, key=ADMIN)[0] == 200
        with pytest.raises(openai.InternalServerError) as e:
            c.completions.create(model="m", prompt=PROMPT, max_tokens=3)
        assert e.value.status_code == 503
        assert post(f"{gw.url}/admin/replicas/r1/return", {}, key=ADMIN)[0] == 200
        assert c.completions.create(model="m", prompt=PROMPT, max_tokens=3).choices
    finally:
        assert gw.stop()


def test_health_checks_take_a_replica_out_and_bring_it_back(replica, test_model, tmp_path):
    from tests.helpers import TcpProxy

    proxy = TcpProxy(replica.port)
    proxy.start()
    gw = gateway_process.start([proxy.url], test_model, tmp_path / "gw", keys=KEYS, admin_token=ADMIN)

    def healthy():
        return json.loads(get(f"{gw.url}/admin/replicas", key=ADMIN)[1])["replicas"][0]["healthy"]

    def wait_for(value, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if healthy() is value:
                return True
            time.sleep(0.3)
        return False

    try:
        c = _client(gw)
        assert c.completions.create(model="m", prompt=PROMPT, max_tokens=2).choices
        proxy.stop()
        assert wait_for(False), "the vanished replica is taken out"
        assert get(f"{gw.url}/health")[0] == 503
        with pytest.raises(openai.InternalServerError):
            c.completions.create(model="m", prompt=PROMPT, max_tokens=2)
        proxy.start()
        assert wait_for(True), "the returning replica is brought back"
        assert c.completions.create(model="m", prompt=PROMPT, max_tokens=2).choices
    finally:
        assert gw.stop()
        proxy.shutdown()


def test_client_closing_a_stream_is_a_quiet_counted_cancel_and_frees_the_replica(gateway, replica):
    """IDE clients cancel all the time: no 500 in the log, a cancel in /metrics, the replica stops generating."""
    import socket
    from urllib.parse import urlparse

    from serving.routing.pool import sglang_gauges

    def generated() -> float:
        return sglang_gauges(get(f"{replica.url}/metrics")[1]).get("sglang:generation_tokens_total", 0.0)

    log_before = gateway.log_file.read_text().count("unhandled error")
    cancels = _metric_route(gateway, "flywheel_gateway_client_cancels_total")
    tokens_before = generated()
    u = urlparse(gateway.url)
    body = json.dumps(
        {"model": "m", "prompt": PROMPT, "max_tokens": 256, "min_tokens": 256, "n": 4, "stream": True}
    ).encode()
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-alice\r\n"
            b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        got = b""
        while b"data: " not in got:
            got += s.recv(4096)
    deadline = time.monotonic() + 20
    while _metric_route(gateway, "flywheel_gateway_client_cancels_total") <= cancels and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _metric_route(gateway, "flywheel_gateway_client_cancels_total") == cancels + 1
    while (
        sglang_gauges(get(f"{replica.url}/metrics")[1]).get("sglang:num_running_reqs", 0)
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    # Aborted: far fewer than the 4 x 256 tokens a finished request would have made.
    assert generated() - tokens_before < 0.75 * 4 * 256
    assert gateway.log_file.read_text().count("unhandled error") == log_before


def _metric_route(gateway, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = get(f"{gateway.url}/metrics")[1]
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_a_hung_replica_times_out_fails_over_and_leaves_rotation(replica, test_model, tmp_path):
    """A replica that stops answering (its connections stalled) costs the request one timeout, not a 500:
    it moves to the other replica, and the hung one is out of rotation."""
    from tests.helpers import TcpProxy

    proxy = TcpProxy(int(replica.url.rsplit(":", 1)[1]))
    proxy.start()
    gw = gateway_process.start(
        [proxy.url, replica.url],
        test_model,
        tmp_path / "gw",
        keys=GATEWAY_KEYS,
        admin_token=ADMIN,
        extra_args=["--no-events", "--request-timeout", "3"],
    )
    try:
        proxy.stalled = True
        client = _client(gw)
        outs = [client.completions.create(model="m", prompt=PROMPT, max_tokens=4) for _ in range(3)]
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
        )
        chunks = [c for c in stream if c.choices]
        assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")  # the stream ran to its end
        assert all(o.choices[0].finish_reason for o in outs)
        r0 = next(r for r in json.loads(get(f"{gw.url}/admin/replicas", key=ADMIN)[1])["replicas"] if r["id"] == "r0")
        assert r0["healthy"] is False and "no answer within 3 s" in r0["last_error"], r0
        assert _metric_route(gw, "flywheel_gateway_replica_retries_total") >= 1
        assert "unhandled error" not in gw.log_file.read_text()
    finally:
        assert gw.stop()
        proxy.stalled = False
        proxy.shutdown()
