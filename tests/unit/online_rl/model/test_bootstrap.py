"""The model is made here, deterministically: same preset and seed, same bytes."""

import copy
import dataclasses
import hashlib
import json

import pytest

from online_rl.model import bootstrap as B
from online_rl.tasks import corpus as TC

pytestmark = pytest.mark.timeout(300)


def _short(seed=0):
    cfg = B.preset("test", seed)
    cfg.train = dataclasses.replace(cfg.train, steps=5)
    cfg.corpus = dataclasses.replace(cfg.corpus, documents=500)  # what makes bytes differ, at ~1 s a build
    return cfg


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    for name, cfg in (("a", _short()), ("b", _short()), ("c", _short(seed=1))):
        B.build(cfg, tmp_path / name, progress=False, evaluate_model=False)
    for f in B.CHECKPOINT_FILES:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert (tmp_path / "a" / "model.safetensors").read_bytes() != (tmp_path / "c" / "model.safetensors").read_bytes()


def test_checkpoint_layout_is_qwen3_moe(test_model):
    cfg = json.loads((test_model / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["model_type"] == "qwen3_moe"
    assert cfg["num_experts"] >= 4 and cfg["num_experts_per_tok"] == 2 and cfg["torch_dtype"] == "bfloat16"
    from safetensors import safe_open

    with safe_open(str(test_model / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert all(f.get_tensor(k).dtype.is_floating_point for k in keys)
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in keys and "model.layers.0.mlp.gate.weight" in keys
    report = B.report(test_model)
    assert 0.0 <= report["eval"]["pass_rate_t1"] <= 1.0 and report["eval"]["heldout_tasks"] > 0


def test_cached_and_copied_out(test_model, tmp_path):
    again = B.bootstrap("test", 0, progress=False)
    assert again == test_model  # a second call reuses the cache
    out = B.bootstrap("test", 0, out=tmp_path / "copy", progress=False)
    for f in B.CHECKPOINT_FILES:
        assert (out / f).read_bytes() == (test_model / f).read_bytes()


def test_tokenizer_starts_every_prompt_with_eos_like_training(test_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(test_model)
    ids = tok("def f(x):")["input_ids"]
    assert ids[0] == tok.eos_token_id == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "def f(x):"
    # the tool-call markers are one token each and survive decoding as servers do it (special tokens skipped)
    call = '<tool_call>\n{"name": "run_tests", "arguments": {"path": "a.py"}}\n</tool_call>'
    ids = tok(call)["input_ids"]
    assert ids[1] == tok.convert_tokens_to_ids("<tool_call>") and ids[-1] == tok.convert_tokens_to_ids("</tool_call>")
    assert tok.decode(ids, skip_special_tokens=True) == call


def test_report_carries_the_valid_tool_call_rate(test_model):
    ev = B.report(test_model)["eval"]
    cfg = B.preset("test").eval
    assert 0.0 <= ev["tool_call_valid_rate"] <= 1.0 and 0.0 <= ev["tool_call_valid_rate_greedy"] <= 1.0
    assert ev["agent_turns"] == 3 * min(cfg.agent_tasks, ev["heldout_tasks"])
    assert sum(ev["tool_call_outcomes_t1"].values()) == ev["agent_turns"] * cfg.agent_samples
    assert ev["tool_call_outcomes_t1"]["valid"] / (ev["agent_turns"] * cfg.agent_samples) == pytest.approx(
        ev["tool_call_valid_rate"], abs=1e-4
    )


def test_unknown_preset_is_an_error():
    with pytest.raises(ValueError, match="unknown preset"):
        B.preset("huge")


def test_cache_key_follows_the_program_not_its_layout():
    src = 'def f(x):\n    """Doc."""\n    # why\n    return x + 1\n'
    same = "def f(x):\n    return (x\n            + 1)  # reworded\n"
    other = "def f(x):\n    return x + 2\n"
    assert B._code_digest(src) == B._code_digest(same)
    assert B._code_digest(src) != B._code_digest(other)


def test_cache_key_follows_the_corpus_bytes_not_its_settings(tmp_path, monkeypatch):
    """Settings that leave the corpus as it was (no agent turns, so no malformed calls among them; no multi-line
    documents drawn) keep the key: the corpus's bytes key the model, remembered so a lookup does not make them."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path))
    cfg = B.preset("test")
    cfg.corpus = dataclasses.replace(cfg.corpus, documents=300, agent_share=0.0)
    same = copy.deepcopy(cfg)
    same.corpus = dataclasses.replace(cfg.corpus, malformed_call_share=0.9, multiline_share=0.0)
    other = copy.deepcopy(cfg)
    other.corpus = dataclasses.replace(cfg.corpus, multiline_share=0.3)
    assert B.cache_key(cfg) == B.cache_key(same) != B.cache_key(other)
    docs = TC.corpus(cfg.corpus)
    assert B.corpus_digest(cfg.corpus) == hashlib.sha256("\x00".join(docs).encode()).hexdigest()
    memo = json.loads((tmp_path / "models" / B.CORPUS_DIGESTS).read_text())
    assert len(memo) == 3  # one per corpus setting seen

    def no_corpus(_cfg):
        raise AssertionError("the corpus was made again")

    monkeypatch.setattr(TC, "corpus", no_corpus)
    assert B.cache_key(same) == B.cache_key(cfg)  # from the memo


def test_everything_the_build_reads_besides_the_corpus_is_in_the_key():
    """The modules that turn a corpus into bytes import only keyed code: a module in MODEL_CODE, from the tasks'
    module only the names keyed by value (TASK_SYMBOLS), the corpus (keyed by its bytes), the presets (settings,
    keyed as values) and the report's evaluation (not bytes). A new import of unkeyed code fails here, not in a
    stale cache. kernels.batch_invariant is off while a model is built (bi.enabled() is False unless set)."""
    import ast

    from infra.paths import REPO_ROOT
    from kernels import batch_invariant as bi

    assert not bi.enabled()
    keyed = {rel.removesuffix(".py").replace("/", ".") for rel in B.MODEL_CODE}
    allowed = keyed | {
        "online_rl.model.presets",
        "online_rl.model.evaluate",
        "online_rl.tasks.corpus",
        "kernels.batch_invariant",
    }
    for rel in B.MODEL_CODE:
        tree = ast.parse((REPO_ROOT / rel).read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.module):
                continue
            if node.module.split(".")[0] not in ("online_rl", "contracts", "kernels"):
                continue
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                module = name if name in allowed | {"online_rl.tasks.synthetic"} else node.module
                if module == "online_rl.tasks.synthetic":  # `synthetic as T`: only keyed names may be read
                    local = alias.asname or alias.name
                    used = {
                        n.attr
                        for n in ast.walk(tree)
                        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == local
                    }
                    assert used <= set(B.TASK_SYMBOLS), (rel, used - set(B.TASK_SYMBOLS))
                else:
                    assert module in allowed, f"{rel} imports {name}, which the cache key does not cover"


def test_a_stale_remembered_digest_is_corrected_and_never_keys_a_build(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path))
    cfg = _short()
    right = B.corpus_digest(cfg.corpus)
    memo_path = tmp_path / "models" / B.CORPUS_DIGESTS
    memo = json.loads(memo_path.read_text())
    memo = {k: "0" * 64 for k in memo}  # as if corpus code outside CORPUS_CODE had changed the documents
    memo_path.write_text(json.dumps(memo))
    with pytest.raises(B.StaleCorpusDigest):
        B.build(cfg, tmp_path / "out", progress=False, evaluate_model=False)
    assert B.corpus_digest(cfg.corpus) == right  # corrected
    B.build(cfg, tmp_path / "out2", progress=False, evaluate_model=False)
    memo_path.chmod(0o444)
    monkeypatch.setattr(B, "_memo_path", lambda: tmp_path / "read-only" / B.CORPUS_DIGESTS)
    (tmp_path / "read-only").mkdir(mode=0o555)
    other = dataclasses.replace(cfg.corpus, documents=200)
    assert len(B.corpus_digest(other)) == 64  # a home it cannot write costs only the memo
