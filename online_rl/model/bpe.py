"""The base model's tokenizer: byte-level BPE trained on the corpus (`tokenizers`), with the FIM and tool-call
markers as tokens of their own, saved in Hugging Face layout."""

from __future__ import annotations

import json
from pathlib import Path

from contracts import tool_format as TF
from online_rl.tasks import synthetic as T

# Tokens of their own, as in Qwen's vocabulary, and plain text (not special: decoding keeps them, so the
# gateway reads the calls out of SGLang's text); spelled out they would cost five tokens each.
TOOL_MARKERS = [TF.CALL_OPEN, TF.CALL_CLOSE, TF.RESPONSE_OPEN, TF.RESPONSE_CLOSE, TF.ANSWER]


def train_tokenizer(docs: list[str], vocab_size: int):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    # A newline is always a token of its own: a prompt that ends at a line break (the IDE's cursor at
    # the start of a line) then tokenizes exactly like the same text inside a training document.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("\n", behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=T.SPECIAL_TOKENS,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    plain = [_strip_special(d) for d in docs]
    tok.train_from_iterator(plain, trainer=trainer)
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in TOOL_MARKERS])
    # Every document in the packed training stream follows an <|endoftext|>; the served prompt starts
    # with one too (BOS = EOS, GPT-2 style), so position 0 looks the same in training and serving.
    eos_id = tok.token_to_id(T.EOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{T.EOS} $A", pair=f"{T.EOS} $A {T.EOS} $B", special_tokens=[(T.EOS, eos_id)]
    )
    return tok


def _strip_special(doc: str) -> str:
    for s in T.SPECIAL_TOKENS + TOOL_MARKERS:
        doc = doc.replace(s, "\n")
    return doc


def save_tokenizer(tok, out: Path, model_max_length: int) -> None:
    tok.save(str(out / "tokenizer.json"))
    eos = T.EOS
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": eos,
                "pad_token": eos,
                "bos_token": eos,
                "unk_token": None,
                "model_max_length": model_max_length,
                "clean_up_tokenization_spaces": False,
                "additional_special_tokens": T.SPECIAL_TOKENS[1:],
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps(
            {"eos_token": eos, "pad_token": eos, "bos_token": eos, "additional_special_tokens": T.SPECIAL_TOKENS[1:]},
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
