"""What mid-training does not learn in a document: a client's system prose (read past, never a target) and the
newline after a call inside a turn's history (learnt, it taught the model to run on past its call). Part of the
model's cache key (online_rl.model.bootstrap.MODEL_CODE): a change here changes every model's bytes."""

from __future__ import annotations

from contracts import tool_format as tf


def system_spans(doc: str) -> list[tuple[int, int]]:
    """(start, end) offsets of a document's `# system:` lines: a client's prose, read past, never a target."""
    out, at = [], 0  # type: ignore[var-annotated]  # model code
    for line in doc.splitlines(keepends=True):
        if line.startswith("# system:"):
            if out and out[-1][1] == at:
                out[-1] = (out[-1][0], at + len(line))
            else:
                out.append((at, at + len(line)))
        at += len(line)
    return out


def history_breaks(doc: str) -> list[int]:
    """Offsets of the newlines that follow a call inside a document: history, never the end of a turn."""
    out, at = [], doc.find(tf.CALL_CLOSE + "\n")
    while at >= 0:
        out.append(at + len(tf.CALL_CLOSE))
        at = doc.find(tf.CALL_CLOSE + "\n", at + 1)
    return out
