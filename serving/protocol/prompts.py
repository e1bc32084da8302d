"""From a checked request to what a replica runs: prompt token ids (with their limits) and SGLang's
sampling parameters. The served model's tokenizer and config are read once, here."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from contracts import tool_format as tf
from serving.protocol.limits import Limits
from serving.protocol.openai import GenerationSpec
from serving.protocol.schema import ApiError

FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE, EOS = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|endoftext|>"


class Prompter:
    def __init__(self, model_dir: Path, limits: Limits):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        model_cfg = json.loads((Path(model_dir) / "config.json").read_text())
        self.layers, self.top_k = model_cfg["num_hidden_layers"], model_cfg["num_experts_per_tok"]
        self.limits = limits
        positions = model_cfg["max_position_embeddings"]
        limits.context_tokens = min(limits.context_tokens or positions, positions)
        # a prompt must leave room for one token of answer
        limits.max_prompt_tokens = min(limits.max_prompt_tokens or limits.context_tokens - 1, limits.context_tokens - 1)
        # Control tokens end a plain completion: the model must not wander into fill-in-the-middle syntax.
        self.stop_token_ids = sorted(
            i for t in (EOS, FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE) if (i := self.tok.token_to_id(t)) is not None
        )
        # No token stands for more bytes than this (a text has at least bytes / this many tokens).
        self.max_token_bytes = max(
            len(self.tok.decode([i], skip_special_tokens=False).encode()) for i in range(self.tok.get_vocab_size())
        )

    async def prompt_ids(self, spec: GenerationSpec) -> list[int]:
        text = spec.prompt if spec.suffix is None else f"{FIM_PREFIX}{spec.prompt}{FIM_SUFFIX}{spec.suffix}{FIM_MIDDLE}"
        lim = self.limits
        # Too long to fit whatever its tokens: refused without tokenizing (up to a MiB of text would hold
        # this event loop, and every tenant on it, for as long as that takes).
        if len(text) > lim.max_prompt_tokens * self.max_token_bytes:
            raise ApiError(
                400,
                f"prompt is {len(text)} characters, more than {lim.max_prompt_tokens} tokens can "
                f"hold; the limit is {lim.max_prompt_tokens} tokens",
                param="prompt",
                code="context_length_exceeded",
            )
        if len(text) > 4096:  # long enough to be worth a thread (the tokenizer releases the GIL)
            ids = (await asyncio.get_running_loop().run_in_executor(None, self.tok.encode, text)).ids
        else:
            ids = self.tok.encode(text).ids
        if len(ids) > lim.max_prompt_tokens:
            raise ApiError(
                400,
                f"prompt is {len(ids)} tokens; the limit is {lim.max_prompt_tokens}",
                param="prompt",
                code="context_length_exceeded",
            )
        spec.prompt_tokens = len(ids)
        if spec.clamp:  # what the context leaves after the prompt, at most the server's limit
            spec.max_tokens = min(spec.max_tokens, lim.max_tokens, lim.context_tokens - len(ids))
            spec.min_tokens = min(spec.min_tokens, max(spec.max_tokens, 0))
        if spec.clamp and spec.max_tokens < 1:
            raise ApiError(
                400,
                f"prompt ({len(ids)} tokens) leaves no room to answer in the model's context of "
                f"{lim.context_tokens} tokens",
                param="messages",
                code="context_length_exceeded",
            )
        if len(ids) + spec.max_tokens > lim.context_tokens:
            raise ApiError(
                400,
                f"prompt ({len(ids)} tokens) plus max_tokens ({spec.max_tokens}) exceeds the "
                f"model's context of {lim.context_tokens} tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return ids

    def sampling(self, spec: GenerationSpec) -> dict:
        stop = list(spec.stop)
        if spec.tools is not None and spec.tools.active and spec.tools.single:
            stop.append(tf.CALL_CLOSE)  # one call and done (SGLang trims it: tool_calls.trimmed_close puts it back)
        s = {
            "max_new_tokens": spec.max_tokens,
            "temperature": spec.temperature,
            "top_p": spec.top_p,
            "stop": stop or None,
            "stop_token_ids": self.stop_token_ids,
            "presence_penalty": spec.presence_penalty,
            "frequency_penalty": spec.frequency_penalty,
        }
        if spec.top_k > 0:
            s["top_k"] = spec.top_k
        if spec.seed is not None:
            s["sampling_seed"] = spec.seed
        if spec.min_tokens:
            s["min_new_tokens"] = spec.min_tokens
        return s

    def token_strings(self, ids: list[int]) -> list[str]:
        return [self.tok.decode([i], skip_special_tokens=False) for i in ids]
