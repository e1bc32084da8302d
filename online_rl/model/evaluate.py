"""The base model's report card: held-out pass rates (greedy and sampled, hinted), and the agent turns' valid
tool calls, judged in the sandbox."""

from __future__ import annotations

import random

from online_rl.model.presets import BootstrapConfig
from online_rl.tasks import synthetic as T


def evaluate(model, tok, cfg: BootstrapConfig, progress: bool = True) -> dict:
    """Pass rate on held-out tasks (never in the corpus): greedy, and per sample at temperature 1; with
    multi-line families in the corpus, theirs apart (`..._multiline`)."""
    held = T.tasks("heldout", cfg.seed, cfg.corpus.heldout_share)
    held = random.Random(cfg.seed).sample(held, min(cfg.eval.tasks, len(held)))
    out = _pass_rates(model, tok, cfg, held, progress)
    if cfg.corpus.multiline_share:
        multi = T.tasks("heldout", cfg.seed, cfg.corpus.heldout_share, families="multiline")
        multi = random.Random(cfg.seed).sample(multi, min(cfg.eval.tasks, len(multi)))
        out.update({f"{k}_multiline": v for k, v in _pass_rates(model, tok, cfg, multi, progress).items()})
    return {**out, **evaluate_agent(model, tok, cfg, held, progress)}


def _pass_rates(model, tok, cfg: BootstrapConfig, held: list, progress: bool) -> dict:
    import torch

    from infra.progress import bar as progress_bar
    from online_rl.sandbox import judge as sandbox

    gen = torch.Generator().manual_seed(cfg.seed)
    stop = {tok.token_to_id(s) for s in T.SPECIAL_TOKENS}
    by_len: dict[int, list] = {}
    for task in held:
        ids = tok.encode(task.prompt).ids  # with the leading <|endoftext|>, as the server tokenizes
        by_len.setdefault(len(ids), []).append((task, ids))
    greedy, sampled = [], []
    bar = progress_bar(total=len(held), desc="eval held-out", unit="task", enabled=progress)
    for group in by_len.values():
        tasks_, prompts = [t for t, _ in group], [p for _, p in group]
        for task, g in zip(tasks_, model.generate(prompts, cfg.eval.max_new_tokens, 0.0, stop)):
            greedy.append(sandbox.candidate_for(task, tok.decode(g)))
        many = [p for p in prompts for _ in range(cfg.eval.samples)]
        outs = model.generate(many, cfg.eval.max_new_tokens, 1.0, stop, generator=gen)
        for i, s in enumerate(outs):
            sampled.append(sandbox.candidate_for(tasks_[i // cfg.eval.samples], tok.decode(s)))
        bar.update(len(group))
    bar.close()
    vg, vs = sandbox.run(greedy), sandbox.run(sampled)
    hinted = sandbox.run(_hinted_samples(model, tok, cfg, held, stop))
    return {
        "heldout_tasks": len(held),
        "samples_per_task": cfg.eval.samples,
        "pass_rate_greedy": round(sum(v.ok for v in vg) / len(vg), 4),
        "pass_rate_t1": round(sum(v.ok for v in vs) / len(vs), 4),
        # The same tasks with a user's hint before the body (the teacher of text-feedback distillation):
        # it must beat pass_rate_t1 for the teacher to have anything to teach.
        "pass_rate_t1_hinted": round(sum(v.ok for v in hinted) / len(hinted), 4),
        "example": greedy[0].code,
    }


def _hinted_samples(model, tok, cfg: BootstrapConfig, held: list, stop: set) -> list:
    """Temperature-1 samples of held-out tasks whose prompt ends in a hint about one of the task's wrong
    bodies (as the population writes them), one sandbox candidate each."""
    import torch

    from online_rl.sandbox import judge as sandbox

    rng = random.Random(cfg.seed + 2)
    gen = torch.Generator().manual_seed(cfg.seed + 2)
    by_len: dict[int, list] = {}
    for task in held:
        text = task.prompt + T.hint_line(T.hint_for(task, rng.choice(task.wrong_bodies())))
        ids = tok.encode(text).ids
        by_len.setdefault(len(ids), []).append((task, ids))
    out = []
    for group in by_len.values():
        many = [ids for _, ids in group for _ in range(cfg.eval.samples)]
        for i, s in enumerate(model.generate(many, cfg.eval.max_new_tokens, 1.0, stop, generator=gen)):
            out.append(sandbox.candidate_for(group[i // cfg.eval.samples][0], tok.decode(s)))
    return out


def evaluate_agent(model, tok, cfg: BootstrapConfig, held: list, progress: bool = True) -> dict:
    """Tool calls on held-out tasks' agent episodes: of the turns that should call a tool (read, write,
    run the tests), the share whose answer is a well-formed call to a known tool with valid arguments,
    judged by serving's rules (agent_episodes.call_outcome). Greedy, and per sample at temperature 1."""

    from online_rl.tasks import agent_clients as C, agent_episodes as A

    rng = random.Random(cfg.seed)
    turns = []
    for task in held[: cfg.eval.agent_tasks]:
        _, ts = A.episode(task, task.reference, rng.choice(A.PATHS), rng.choice(A.ASKS))
        turns += [t for t in ts if t.call is not None]
    client_turns = []
    for task in held[: cfg.eval.client_tasks]:
        shell = C.client_shell(rng)
        context = C.client_context(rng, shell.style, cfg.corpus.context_chars)
        _, ts = A.episode(task, task.reference, rng.choice(A.PATHS), rng.choice(A.SHELL_ASKS), shell, context, rng)
        client_turns += [t for t in ts if t.call is not None]
    out = _agent_rates(model, tok, turns, cfg.eval.agent_samples, cfg.eval.agent_max_new_tokens, cfg.seed + 1, progress)
    client = _agent_rates(
        model, tok, client_turns, cfg.eval.client_samples, cfg.eval.client_max_new_tokens, cfg.seed + 3, progress
    )
    out.update({f"client_{k}": v for k, v in client.items() if not k.startswith("agent_example")})
    out["client_context_chars_max"] = max((t.context_chars for t in client_turns), default=0)
    return out


def _agent_rates(model, tok, turns: list, n: int, max_new: int, seed: int, progress: bool) -> dict:
    """Of these call turns, the share sampled (greedy, and n each at temperature 1) that is a well-formed
    call to one of the turn's tools (valid), and the one the episode needs (expected)."""
    import torch

    from infra.progress import bar as progress_bar
    from online_rl.tasks import agent_episodes as A

    gen = torch.Generator().manual_seed(seed)
    stop = {tok.token_to_id(s) for s in T.SPECIAL_TOKENS}
    by_len: dict[int, list] = {}
    for t in turns:
        ids = tok.encode(t.prompt).ids  # with the leading <|endoftext|>, as the server tokenizes
        by_len.setdefault(len(ids), []).append((t, ids))
    outcomes: dict[str, list] = {"greedy": [], "t1": []}
    bar = progress_bar(total=len(turns), desc="eval agent turns", unit="turn", enabled=progress)
    for length in sorted(by_len):
        group = by_len[length]
        prompts = [p for _, p in group]
        for (t, _), g in zip(group, model.generate(prompts, max_new, 0.0, stop)):
            outcomes["greedy"].append((t, tok.decode(g)))
        outs = model.generate([p for p in prompts for _ in range(n)], max_new, 1.0, stop, generator=gen)
        outcomes["t1"] += [(group[i // n][0], tok.decode(s)) for i, s in enumerate(outs)]
        bar.update(len(group))
    bar.close()

    def rates(pairs):
        kinds = [A.call_outcome(text, t.tools) for t, text in pairs]
        expected = [k == "valid" and A.call_matches(t, text) for (t, text), k in zip(pairs, kinds)]
        return kinds, round(kinds.count("valid") / max(1, len(kinds)), 4), round(sum(expected) / max(1, len(kinds)), 4)

    kinds, valid_t1, expected_t1 = rates(outcomes["t1"])
    _, valid_greedy, expected_greedy = rates(outcomes["greedy"])
    worst = next((text for (_, text), k in zip(outcomes["t1"], kinds) if k != "valid"), None)
    return {
        "agent_turns": len(turns),
        "agent_samples_per_turn": n,
        "tool_call_valid_rate": valid_t1,
        "tool_call_valid_rate_greedy": valid_greedy,
        "tool_call_expected_rate": expected_t1,
        "tool_call_expected_rate_greedy": expected_greedy,
        "tool_call_outcomes_t1": {k: kinds.count(k) for k in ("valid", "malformed", "unknown_tool", "none")},
        "agent_example": outcomes["greedy"][0][1] if outcomes["greedy"] else None,
        "agent_example_not_valid": worst,
    }
