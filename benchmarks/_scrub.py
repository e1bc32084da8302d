"""The secret scanner's own throughput (serving.event_log.secret_scrub, in this process; benchmarks.gateway reports
it beside the gateway's overhead, `--scrub-only` alone): over events shaped like IDE traffic, 2 KB prompts of real
code (this repository's), a suffix and an output, 1% holding a (fake) secret, every line new to it, with its first
pass and without (every line through every plugin); over events that follow a cursor through one file, with the
shipper's clean-line cache; and its recall and false positives on the labelled corpus (tests.secret_corpus).
"""

from __future__ import annotations

import random
import statistics
import time


def scrub_events(n: int, secret_share: float = 0.01, seed: int = 0) -> list[tuple[list[str], bool]]:
    """n events' texts ([prompt ~2 KB, suffix, output]) cut from this repository's code, `secret_share` of them
    with a (fake) credential on a line of their prompt or output; with whether each holds one."""
    from infra.paths import REPO_ROOT

    files = sorted(
        p for pkg in ("serving", "online_rl", "weight_sync", "kernels") for p in (REPO_ROOT / pkg).rglob("*.py")
    )
    files = [f for f in files if f.name != "secret_scrub.py"]  # its docstring quotes secret shapes
    texts = [f.read_text() for f in files]
    texts = [t for t in texts if len(t) > 3000]
    rng = random.Random(seed)
    fakes = [
        'aws_access_key_id = "' + "AKIA" + "Q3EGRDFJ7XM2KZ4P" + '"',
        'headers = {"Authorization": "token ' + "ghp" + "_Xk92LmQ7vRt3NbW8sYp1ZcH6dJf4Ga0eKu5i" + '"}',
        'engine = create_engine("postgresql://app:' + "Tr0ub4dor-and-3" + '@db.internal:5432/app")',
        "-----BEGIN RSA " + "PRIVATE KEY-----",
        'stripe.api_key = "' + "sk" + "_live_" + "4eC39HqLyjWDarjtT1zdp7dc" + '"',
    ]
    out = []
    for i in range(n):
        t = texts[rng.randrange(len(texts))]
        at = rng.randrange(len(t) - 2400)
        prompt, suffix, output = (
            t[at : at + 2048],
            t[at + 2048 : at + 2248],
            t[at + 2248 : at + 2248 + rng.randrange(40, 400)],
        )
        secret = rng.random() < secret_share
        if secret:
            line = "    " + fakes[i % len(fakes)] + "\n"
            if i % 2:
                output = line + output
            else:
                cut = prompt.rfind("\n", 0, rng.randrange(1, len(prompt))) + 1
                prompt = prompt[:cut] + line + prompt[cut:]
        out.append(([prompt, suffix, output], secret))
    return out


def _cpu_s(scrubber, events: list[tuple[list[str], bool]]) -> tuple[float, list[list[str]]]:
    """Thread CPU seconds to scan every event, and what was found in each."""
    t = time.thread_time()
    found = [scrubber.find(texts) for texts, _ in events]
    return time.thread_time() - t, found


def scrub_throughput(n: int, rounds: int = 3) -> dict:
    """The scanner alone on one core (CPU time): every line new (no cache: the worst case), with the first pass
    (`scrub_distinct_events_per_s`) and every line through every plugin (`..._every_line`, the old path),
    side by side in `rounds` rounds (medians: the cores are shared); events that follow a cursor through a file
    (each prompt ~4 lines on from the last, as an IDE sends them; the clean-line cache on, as in the shipper);
    and both paths' recall and false positives on the labelled corpus (tests.secret_corpus)."""
    from serving.event_log.secret_scrub import Scrubber, ScrubConfig
    from tests.secret_corpus import labelled_corpus, score

    events = scrub_events(n)
    fast, slow = Scrubber(ScrubConfig(cache_lines=0)), Scrubber(ScrubConfig(cache_lines=0, prefilter=False))
    fast_s, slow_s = [], []
    for _ in range(rounds):
        elapsed, found = _cpu_s(fast, events)
        fast_s.append(elapsed)
        elapsed, found_every_line = _cpu_s(slow, events)
        slow_s.append(elapsed)
    second_pass_share = fast.lines_scanned / max(1, slow.lines_scanned)  # before the corpus adds to them
    flagged = [bool(f) for f in found]
    missed = sum(secret and not f for (_, secret), f in zip(events, flagged))
    flagged_clean = sum(f and not secret for (_, secret), f in zip(events, flagged))
    from infra.paths import REPO_ROOT

    code = (REPO_ROOT / "serving" / "routing" / "dispatcher.py").read_text().splitlines(keepends=True)
    following = []
    for i in range(n):
        at = (4 * i) % max(1, len(code) - 80)
        following.append(
            ["".join(code[at : at + 60]), "".join(code[at + 60 : at + 64]), "".join(code[at + 60 : at + 62])]
        )
    scrubber = Scrubber()
    t = time.thread_time()
    for texts in following:
        scrubber.find(texts)
    following_s = time.thread_time() - t
    cases = labelled_corpus()
    new, old = score(fast, cases), score(slow, cases)
    fast_per_s = n / statistics.median(fast_s)
    slow_per_s = n / statistics.median(slow_s)
    return {
        "scrub_distinct_events_per_s": round(fast_per_s, 1),
        "scrub_distinct_events_per_s_every_line": round(slow_per_s, 1),
        "scrub_speedup_first_pass": round(fast_per_s / slow_per_s, 1),
        "scrub_distinct_events_per_s_rounds": [round(n / s, 1) for s in fast_s],
        "scrub_distinct_events_per_s_every_line_rounds": [round(n / s, 1) for s in slow_s],
        "scrub_lines_to_second_pass_share": round(second_pass_share, 4),
        "scrub_events_per_s_following_cursor": round(n / following_s, 1),
        "scrub_events": n,
        "scrub_event_chars_mean": round(sum(len(t) for texts, _ in events for t in texts) / n),
        "scrub_secret_share": round(sum(s for _, s in events) / n, 4),
        "scrub_missed": missed,
        "scrub_flagged_clean_share": round(flagged_clean / max(1, sum(not s for _, s in events)), 4),
        "scrub_findings_differ_between_paths": sum(a != b for a, b in zip(found, found_every_line)),
        "scrub_recall": new["recall"],
        "scrub_false_positive_share": new["false_positive_share"],
        "scrub_recall_every_line": old["recall"],
        "scrub_false_positive_share_every_line": old["false_positive_share"],
        "scrub_corpus": {"positives": new["positives"], "negatives": new["negatives"], "by_part": new["by_part"]},
    }
