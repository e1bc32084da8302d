"""The bootstrap corpus teaches the tool language serving speaks: each agent turn's prompt is byte for byte
what the gateway renders for that conversation, a configured share of the calls is malformed, and the
call check online_rl uses judges like the gateway's parser."""

import json
import random
import re

import pytest

from online_rl.model import bootstrap as B, bpe, midtrain
from online_rl.model.loss_mask import system_spans
from online_rl.tasks import agent_episodes as A, corpus as TC, synthetic as T
from serving.protocol import tool_calls as tc
from serving.protocol.openai import Limits, parse_chat, render_chat

CFG = TC.CorpusConfig(seed=0, documents=8000)
# a call and its result (the tool lines sit before the newest result: tool_format.render_chat)
_HISTORY = re.compile(
    r"<tool_call>\n(.*?)\n</tool_call>\n(?:# tools: [^\n]*\n)*<tool_response>\n(.*?)\n</tool_response>\n", re.S
)


@pytest.fixture(scope="module")
def docs():
    return TC.corpus(CFG)


def _split(doc: str) -> tuple[str, str]:
    """An agent document back into (prompt, the assistant's turn): a call, or the text after the last result."""
    assert doc.endswith(T.EOS) and A.TOOL_LINES[0] + "\n" in doc
    doc = doc[: -len(T.EOS)]
    cut = doc.rfind("<|assistant|>\n") + len("<|assistant|>\n")  # the prompt's last line: the turn follows
    return doc[:cut], doc[cut:]


def _openai_messages(prompt: str) -> list[dict]:
    """The chat a client would send for that prompt: the user's line, then each call and its result."""
    user = re.search(r"^# user: (.*)$", prompt, re.M).group(1)
    msgs = [{"role": "user", "content": user}]
    for i, (call, result) in enumerate(_HISTORY.findall(prompt)):
        obj = json.loads(call)
        msgs += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": obj["name"], "arguments": json.dumps(obj["arguments"])},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"call_{i}", "content": result},
        ]
    return msgs


def _spec():
    return tc.parse_tools({"tools": A.openai_tools()})


def test_agent_turn_prompts_are_what_serving_renders(docs):
    agent = [d for d in docs if "\n# tools: " in d or d.startswith("# tools: ")]
    assert len(agent) / len(docs) == pytest.approx(CFG.agent_share, abs=0.02)
    depth = set()
    flywheel = [d for d in agent if not d.startswith("# system:") and A.TOOL_LINES[0] in d]  # no client context
    for doc in flywheel:
        prompt, turn = _split(doc)
        msgs = _openai_messages(prompt)
        depth.add(len(msgs))
        served = parse_chat({"model": "m", "messages": msgs, "tools": A.openai_tools()}, Limits())
        assert served.prompt == prompt  # byte for byte
        assert render_chat(served.messages, served.tools) == prompt
        assert turn and T.EOS not in turn and "<tool_response>" not in turn  # a turn never invents a result
    assert depth == {1, 3, 5, 7}  # every turn of the episode: read, write, run the tests, answer


def _as_chat(messages: list[dict]) -> list[dict]:
    """An episode's conversation as a client sends it to the chat API."""
    out, n = [], 0
    for m in messages:
        if m["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": f"call_{n - 1}", "content": m["content"]})
        elif m.get("calls"):
            c = m["calls"][0]
            call = {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
            }
            out.append({"role": "assistant", "content": m["content"] or None, "tool_calls": [call]})
            n += 1
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def test_client_style_turns_are_what_each_api_renders():
    """Turns through a client's shell, inside a client's context (system prompt, environment, reminders): the
    prompt is byte for byte what the gateway renders for the same conversation on the chat, Responses and
    Messages APIs."""
    from flywheel.demo.agent_session import to_anthropic
    from online_rl.tasks import agent_clients as C
    from serving.protocol import messages as messages_api, responses as responses_api

    rng = random.Random(3)
    tasks_ = T.tasks("train")
    seen = set()
    for _ in range(40):
        shell = C.client_shell(rng)
        context = C.client_context(rng, shell.style, 3000)
        task = rng.choice(tasks_)
        messages, turns = A.episode(
            task, task.reference, rng.choice(A.SHELL_PATHS), A.SHELL_ASKS[0], shell, context, rng
        )
        tools = [{"type": "function", "function": dict(t)} for t in shell.tools]
        chat = _as_chat(messages)
        n_user = next(i for i, m in enumerate(chat) if m["role"] == "assistant")
        for k, turn in enumerate(turns):
            upto = chat[: n_user + 2 * k]
            served = parse_chat({"model": "m", "messages": upto, "tools": tools}, Limits())
            assert served.prompt == turn.prompt
            body = {"model": "m", "input": [_response_item(m) for m in upto]}
            resp = responses_api.read_request({**body, "tools": [{"type": "function", **t} for t in shell.tools]})
            assert responses_api.to_spec(resp, [], Limits(), "m").prompt == turn.prompt
            anthropic_tools = [
                {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                for t in shell.tools
            ]
            body = {"model": "m", "max_tokens": 64, "messages": to_anthropic(upto), "tools": anthropic_tools}
            assert messages_api.to_spec(messages_api.read_request(body), Limits(), "m").prompt == turn.prompt
            seen.add((shell.name, bool(context.system), k))
    assert len({s[0] for s in seen}) >= 3 and {s[2] for s in seen} == {0, 1, 2, 3}


def _response_item(m: dict) -> dict:
    if m["role"] == "tool":
        return {"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]}
    if m.get("tool_calls"):
        c = m["tool_calls"][0]
        return {
            "type": "function_call",
            "call_id": c["id"],
            "name": c["function"]["name"],
            "arguments": c["function"]["arguments"],
        }
    return {"role": m["role"], "content": m["content"]}


def test_an_episode_reads_writes_tests_and_answers_honestly():
    task = T.Task("add", 3, "x")
    neg = sum(x < 0 for x in task.test_inputs())
    assert 0 < neg < 10
    for body, result, final in (
        (task.reference, "10 passed", A.DONE),
        (task.render_body("return {a} - {k}"), "10 failed", A.STILL_FAILING),
        ("    return abs(x) + 3\n", f"{neg} failed, {10 - neg} passed", A.STILL_FAILING),
    ):
        messages, turns = A.episode(task, body, "app.py", A.ASKS[0])
        assert [t.call for t in turns] == ["read_file", "write_file", "run_tests", None]
        assert messages[2]["content"] == task.prompt  # the file holds the task's prompt
        assert json.loads(turns[1].target.split("\n")[1])["arguments"]["content"] == task.prompt + body
        assert messages[-2]["content"] == result and turns[-1].target == final
        assert all(A.call_outcome(t.target) == "valid" for t in turns[:3])
        assert A.call_outcome(turns[3].target) == "none"


def test_malformed_calls_appear_at_the_configured_share():
    # Flywheel's tools only (a client's shell is malformed at the same share; judging needs each turn's tools)
    mine = TC.corpus(TC.CorpusConfig(seed=0, documents=8000, client_share=0.0, context_share=0.0))
    calls = [_split(d)[1] for d in mine if A.TOOL_LINES[0] in d and _split(d)[1].startswith("<tool_call>")]
    outcomes = [A.call_outcome(c) for c in calls]
    bad = len(outcomes) - outcomes.count("valid")
    assert len(calls) > 200 and bad / len(calls) == pytest.approx(CFG.malformed_call_share, abs=0.04)
    assert {"malformed", "unknown_tool"} <= set(outcomes)
    spec = _spec()
    assert [tc.parse(c, spec).outcome for c in calls] == outcomes  # the gateway counts them the same
    none = TC.corpus(TC.CorpusConfig(seed=0, documents=1000, malformed_call_share=0.0))
    assert all(A.call_outcome(_split(d)[1]) in ("valid", "none") for d in none if A.TOOL_LINES[0] in d)


CALLS = [
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>',
    'Reading it.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>',
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>\n<tool_call>\n'
    '{"name": "run_tests", "arguments": {"path": "a.py"}}\n</tool_call>',
    '<tool_call>\n{"name": "read_file", "arguments": "{\\"path\\": \\"a.py\\"}"}\n</tool_call>',
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}\n</tool_call>',
    '<tool_call>\n{"name": "read_file", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "read_file", "arguments": {"path": 3}}\n</tool_call>',
    '<tool_call>\n{"name": "write_file", "arguments": {"path": "a.py"}}\n</tool_call>',
    '<tool_call>\n{"name": "open_file", "arguments": {"path": "a.py"}}\n</tool_call>',
    '<tool_call>\n{"name": "open_file", "arguments": "not json"}\n</tool_call>',
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}, "id": 1}\n</tool_call>',
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>\n<tool_response>\nok',
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}',
    '<tool_call>\n["read_file"]\n</tool_call>',
    "def f(x):\n    return x\n",
    "Done: the tests pass.",
]


@pytest.mark.parametrize("text", CALLS)
def test_online_rl_judges_calls_like_the_gateway(text):
    assert A.call_outcome(text) == tc.parse(text, _spec()).outcome


def test_agent_turns_tokenize_at_the_turn_boundary(tmp_path):
    cfg = B.preset("test")
    docs = TC.corpus(cfg.corpus)
    tok = bpe.train_tokenizer(docs, cfg.vocab_size)
    for marker in bpe.TOOL_MARKERS:  # one token each, and plain text to the decoder
        assert len(tok.encode(marker, add_special_tokens=False).ids) == 1
        assert tok.decode(tok.encode(marker).ids, skip_special_tokens=True) == marker
    rng, longest = random.Random(0), 0
    train = T.tasks("train")
    for _ in range(100):
        task = rng.choice(train)
        body = task.reference if rng.random() < 0.5 else rng.choice(task.wrong_bodies())
        for turn in A.episode(task, body, rng.choice(A.PATHS), rng.choice(A.ASKS))[1]:
            whole = tok.encode(turn.document).ids  # with the leading <|endoftext|>, as served
            # the served prompt's tokens, then the turn's: what the model is trained on is what it is served
            assert whole == tok.encode(turn.prompt).ids + tok.encode(turn.target + T.EOS, add_special_tokens=False).ids
            longest = max(longest, len(whole))
    assert longest > 100  # (a turn past the training window is trained whole: the test below)
    plain = [d for d in docs if "# system:" not in d]  # a client's system prompt is read, never a target (below)
    ids, learn = midtrain.packed_stream(tok, plain)
    held_out = [i for i, keep in enumerate(learn) if not keep]
    assert held_out and len(ids) == len(learn)
    assert {tok.id_to_token(ids[i]) for i in held_out} == {"Ċ"}  # only the newline after a call in history
    assert {tok.id_to_token(ids[i - 1]) for i in held_out} == {"</tool_call>"}
    assert len(held_out) == sum(d.count("</tool_call>\n") for d in plain)


def test_a_clients_system_prompt_is_read_not_learnt_and_long_turns_stay_whole():
    cfg = B.preset("test")
    docs = TC.corpus(cfg.corpus)
    tok = bpe.train_tokenizer(docs, cfg.vocab_size)
    longer = [d for d in docs if len(tok.encode(d, add_special_tokens=False).ids) >= cfg.train.seq_len]
    short = [d for d in docs[:200] if d not in set(longer)]
    ids, learn, long = midtrain.packed_stream(tok, longer + short, cfg.train.seq_len)
    assert len(long) == len(longer) > 100  # kept whole, out of the stream's windows
    for doc, (seq, mask) in zip(longer, long):
        enc = tok.encode(doc, add_special_tokens=False)
        assert seq == [tok.token_to_id(T.EOS)] + enc.ids and mask[0]
        spans = system_spans(doc)
        learnt = [start for (start, _), keep in zip(enc.offsets, mask[1:]) if keep]
        assert learnt and not any(a <= start < b for start in learnt for a, b in spans)
