"""The secret scanner's own throughput (serving.event_log.secret_scrub, in this process; benchmarks.gateway reports
it beside the gateway's overhead, `--scrub-only` alone): over events shaped like IDE traffic, 2 KB prompts of real
code (this repository's), a suffix and an output, 1% holding a (fake) secret, every line scanned; and over events
that follow a cursor through one file, with the shipper's clean-line cache.
"""

from __future__ import annotations

import random
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


def scrub_throughput(n: int) -> dict:
    """The scanner alone on one core (CPU time): every line scanned (no cache: the worst case), and events that
    follow a cursor through a file (each prompt ~4 lines on from the last, as an IDE sends them; the clean-line
    cache on, as in the shipper)."""
    from serving.event_log.secret_scrub import Scrubber, ScrubConfig

    events = scrub_events(n)
    scrubber = Scrubber(ScrubConfig(cache_lines=0))  # every line scanned, as if never seen before
    t = time.thread_time()
    found = [bool(scrubber.find(texts)) for texts, _ in events]
    distinct_s = time.thread_time() - t
    missed = sum(secret and not f for (_, secret), f in zip(events, found))
    flagged_clean = sum(f and not secret for (_, secret), f in zip(events, found))
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
    return {
        "scrub_events_per_s": round(n / distinct_s, 1),
        "scrub_events_per_s_following_cursor": round(n / following_s, 1),
        "scrub_events": n,
        "scrub_secret_share": round(sum(s for _, s in events) / n, 4),
        "scrub_missed": missed,
        "scrub_flagged_clean_share": round(flagged_clean / max(1, sum(not s for _, s in events)), 4),
    }
