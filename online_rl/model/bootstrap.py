"""Make the base model here: a byte-level BPE tokenizer and a tiny Qwen3-MoE mid-trained on the task corpus.

`flywheel model bootstrap --preset test|demo` writes a Hugging Face checkpoint directory (config.json,
model.safetensors in bf16, tokenizer.json and friends) that SGLang and transformers both load. The same
preset and seed give the same bytes; results are cached under $FLYWHEEL_HOME/models by preset, seed
and a digest of the code and settings that produced them.

The corpus holds code documents and agent turns (online_rl.tasks.agent_episodes); the report gives held-out
pass rates of the code and the rate of well-formed tool calls in held-out agent episodes.

The cache key (`cache_key`) is a digest of the settings, of the code that turns a corpus into the checkpoint's
bytes (MODEL_CODE: this module, bpe, midtrain, the transformer and its config, the tool format; without
docstrings, comments or imports: a reworded or moved module keeps the key; the presets are settings, in the key
as values) and of the corpus itself, its
documents' bytes: a change to the tasks' code that leaves a preset's corpus as it was (a family the preset does
not draw) keeps that preset's model. The corpus's digest is remembered by the code and settings that made it
(`corpus_digests.json` beside the models), so a lookup does not make the corpus again.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from infra.paths import REPO_ROOT
from online_rl.model.bpe import save_tokenizer, train_tokenizer
from online_rl.model.evaluate import evaluate
from online_rl.model.midtrain import packed_stream, train_model
from online_rl.model.presets import BootstrapConfig, preset
from online_rl.tasks import corpus as TC, synthetic as T

CHECKPOINT_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)
REPORT_FILE = "bootstrap_report.json"  # timings and pass rates: not part of the deterministic bytes
# The code that turns a corpus into a checkpoint's bytes (the tokenizer, the model, the tool format).
MODEL_CODE = (
    "online_rl/model/bootstrap.py",
    "online_rl/model/bpe.py",
    "online_rl/model/midtrain.py",
    "online_rl/model/transformer.py",
    "online_rl/model/config.py",
    "online_rl/model/loss_mask.py",
    "contracts/tool_format.py",
)
# What the tokenizer and mid-training read from the tasks' module besides the corpus: keyed by value, so that a
# change elsewhere in that module (a new family) keys only the corpus.
TASK_SYMBOLS = ("EOS", "SPECIAL_TOKENS")
# The code that makes the corpus: it keys only the remembered corpus digests (the corpus's bytes key the model).
CORPUS_CODE = (
    "online_rl/tasks/family.py",
    "online_rl/tasks/synthetic.py",
    "online_rl/tasks/multiline.py",
    "online_rl/tasks/corpus.py",
    "online_rl/tasks/agent_episodes.py",
    "online_rl/tasks/agent_clients.py",
    "contracts/tool_format.py",
)
CORPUS_DIGESTS = "corpus_digests.json"


class _NoImports(ast.NodeTransformer):
    def visit_Import(self, node: ast.AST) -> None:
        return None

    visit_ImportFrom = visit_Import


def _code_digest(source: str) -> str:
    """The program a source file holds, without its layout, comments or docstrings: reformatting or
    rewording a file keeps the key, so a formatter run never rebuilds a model that would come out the same.
    Imports are left out too: a module moved to another package (or imported by another name) keeps it."""
    tree = _NoImports().visit(ast.parse(source))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def _code_digests(files: tuple[str, ...]) -> bytes:
    return "".join(_code_digest((REPO_ROOT / rel).read_text()) for rel in files).encode()


class StaleCorpusDigest(RuntimeError):
    """The remembered digest of a corpus is not the digest of the corpus made now (corpus code outside
    CORPUS_CODE changed, or the memo was edited): the entry is corrected, and the model must be keyed again."""


def _corpus_made_by(cfg: TC.CorpusConfig) -> str:
    h = hashlib.sha256(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode())
    h.update(platform.python_version().encode())
    h.update(_code_digests(CORPUS_CODE))
    return h.hexdigest()


def _memo_path() -> Path:
    from infra.paths import flywheel_home

    return flywheel_home() / "models" / CORPUS_DIGESTS


def _remember(made_by: str, digest: str) -> None:
    """Best effort: a home that cannot be written costs only making the corpus again next time."""
    path = _memo_path()
    try:
        memo = json.loads(path.read_text())
    except (OSError, ValueError):
        memo = {}
    memo[made_by] = digest
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{CORPUS_DIGESTS}.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(memo, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)  # atomic; a concurrent writer's entry may be lost and is made again
    except OSError:
        pass


def _documents_digest(docs: list[str]) -> str:
    return hashlib.sha256("\x00".join(docs).encode()).hexdigest()


def corpus_digest(cfg: TC.CorpusConfig) -> str:
    """sha256 of the corpus's documents, remembered under $FLYWHEEL_HOME/models by a digest of the corpus's
    code, its settings and this Python (the corpus's prose is this Python's docstrings: agent_clients)."""
    made_by = _corpus_made_by(cfg)
    try:
        memo = json.loads(_memo_path().read_text())
    except (OSError, ValueError):
        memo = {}
    if made_by in memo:
        return memo[made_by]
    digest = _documents_digest(TC.corpus(cfg))
    _remember(made_by, digest)
    return digest


def cache_key(cfg: BootstrapConfig) -> str:
    """Digest of the settings, of the code that turns a corpus into bytes, and of the corpus's documents."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "corpus"}  # the corpus's digest has them
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    h.update(_code_digests(MODEL_CODE))
    h.update(json.dumps([getattr(T, name) for name in TASK_SYMBOLS]).encode())
    h.update(corpus_digest(cfg.corpus).encode())
    return h.hexdigest()[:16]


def cached_dir(cfg: BootstrapConfig) -> Path:
    from infra.paths import flywheel_home

    return flywheel_home() / "models" / f"{cfg.preset}-seed{cfg.seed}-{cache_key(cfg)}"


# ------------------------------------------------------------------------------------------------- build


def build(cfg: BootstrapConfig, out: Path, progress: bool = True, evaluate_model: bool = True) -> dict:
    """Build the checkpoint into `out` (a fresh directory); returns the report."""
    import torch

    from online_rl.model.transformer import save_pretrained

    torch.set_num_threads(cfg.train.threads)
    torch.use_deterministic_algorithms(True)
    timings = {}
    t0 = time.monotonic()
    key = cache_key(cfg)
    docs = TC.corpus(cfg.corpus)
    actual = _documents_digest(docs)
    if actual != corpus_digest(cfg.corpus):  # the key was made from a stale memo: never file bytes under it
        _remember(_corpus_made_by(cfg.corpus), actual)
        raise StaleCorpusDigest(f"the remembered digest of the {cfg.preset} corpus was stale (now corrected)")
    tok = train_tokenizer(docs, cfg.vocab_size)
    eos_id = tok.token_to_id(T.EOS)
    # The trained vocabulary decides the embedding size; the caller's config stays as given.
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, vocab_size=tok.get_vocab_size(), eos_token_id=eos_id, bos_token_id=eos_id),
    )
    ids, learn, long_docs = packed_stream(tok, docs, cfg.train.seq_len)
    timings["corpus_and_tokenizer_s"] = round(time.monotonic() - t0, 2)

    t1 = time.monotonic()
    model, losses = train_model(cfg, ids, learn, progress, long_docs)
    timings["train_s"] = round(time.monotonic() - t1, 2)

    out.mkdir(parents=True, exist_ok=True)
    save_pretrained(model, out, torch.bfloat16)
    save_tokenizer(tok, out, cfg.model.max_position_embeddings)
    (out / "generation_config.json").write_text(
        json.dumps(
            {"eos_token_id": cfg.model.eos_token_id, "pad_token_id": cfg.model.eos_token_id, "do_sample": False},
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )

    report = {
        "preset": cfg.preset,
        "seed": cfg.seed,
        "cache_key": key,
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus_documents": len(docs),
        "corpus_sha256": actual,
        "corpus_tokens": len(ids),
        "vocab_size": cfg.model.vocab_size,
        "train_steps": cfg.train.steps,
        "tokens_trained": cfg.train.steps * cfg.train.batch_size * cfg.train.seq_len,
        "long_documents": len(long_docs),
        "long_document_tokens_max": max((len(d[0]) for d in long_docs), default=0),
        "final_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
        "timings": timings,
    }
    if evaluate_model:
        from online_rl.model.transformer import load_pretrained

        t2 = time.monotonic()
        served = load_pretrained(out, torch.float32)  # the bf16 weights serving will see
        report["eval"] = evaluate(served, tok, cfg, progress)
        timings["eval_s"] = round(time.monotonic() - t2, 2)
    timings["total_s"] = round(time.monotonic() - t0, 2)
    report["loss_curve"] = [round(x, 4) for x in losses[:: max(1, len(losses) // 200)]]
    (out / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    _plot_loss(losses, out / "bootstrap_loss.png", cfg.preset)
    return report


def _plot_loss(losses: list[float], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(losses, lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_title(f"bootstrap mid-training ({title})")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def bootstrap(
    preset_name: str = "test", seed: int = 0, out: Path | None = None, progress: bool = True, force: bool = False
) -> Path:
    """The checkpoint for a preset and seed: from the cache, or built once and cached. Returns its dir."""
    cfg = preset(preset_name, seed)
    try:
        return _bootstrap(cfg, out, progress, force)
    except StaleCorpusDigest:  # corrected: the key is right now
        return _bootstrap(cfg, out, progress, force)


def _bootstrap(cfg: BootstrapConfig, out: Path | None, progress: bool, force: bool) -> Path:
    cache = cached_dir(cfg)
    if force or not (cache / ".complete").exists():
        cache.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{cache.name}-", dir=cache.parent))
        try:
            build(cfg, staging, progress)
            (staging / ".complete").write_text("ok\n")
            if cache.exists():
                shutil.rmtree(cache)
            os.replace(staging, cache)  # atomic: a half-built model is never visible
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        for stale in cache.parent.glob(f"{cfg.preset}-seed{cfg.seed}-*"):  # built by older code or settings
            if stale != cache and (stale / ".complete").exists():
                shutil.rmtree(stale, ignore_errors=True)
    if out is None or Path(out).resolve() == cache.resolve():
        return cache
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in (*CHECKPOINT_FILES, REPORT_FILE, "bootstrap_loss.png"):
        shutil.copy2(cache / name, out / name)
    return out


def report(path: Path) -> dict:
    return json.loads((Path(path) / REPORT_FILE).read_text())
