"""What the trainer needs of the base model's tokenizer: a completion's length in characters (partial
accepts), a comment's token ids (a hint), where a hint line fits in a prompt, and the ids a completion ends at."""

from __future__ import annotations

from pathlib import Path


def tokenizer_tools(model_dir: Path, eos_ids) -> tuple:
    """(chars of a completion's token ids, token ids of a text, whether a prompt ends where a hint line
    goes: at a line start, not fill-in-the-middle, the token ids a completion ends at), or Nones without a
    tokenizer."""
    from tokenizers import Tokenizer

    from online_rl.tasks.synthetic import FIM_MIDDLE, SPECIAL_TOKENS

    path = Path(model_dir) / "tokenizer.json"
    if not path.exists():
        return None, None, None, None
    tok = Tokenizer.from_file(str(path))
    fim = tok.token_to_id(FIM_MIDDLE)

    def hint_fits(prompt_ids) -> bool:
        last = tok.decode([int(prompt_ids[-1])], skip_special_tokens=False) if len(prompt_ids) else ""
        return last.endswith("\n") and (fim is None or fim not in set(int(i) for i in prompt_ids))

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    stop = {i for i in map(tok.token_to_id, SPECIAL_TOKENS) if i is not None} | set(eos_ids)
    return (lambda ids: len(tok.decode(ids))), encode, hint_fits, stop
