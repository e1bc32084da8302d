"""The IDE prefix workload (loadtests.ide_prefix): what makes it a cache test, checked without servers."""

import random

from loadtests import ide_prefix as ide


def _prompts(cfg, user_seed=0, n=30):
    rng = random.Random(cfg.seed)
    editors = [ide.Editor.new(rng, cfg) for _ in range(cfg.users)]
    urng = random.Random(user_seed)
    out = []
    for _ in range(n):
        out.append((editors[0].current, *editors[0].request(cfg)))
        editors[0].edit(urng, cfg)
    return out


def test_each_prompt_extends_the_last_of_the_same_file():
    cfg = ide.IdeWorkloadConfig(users=1, switching_share=1.0, switch_every=4)
    prompts = _prompts(cfg)
    assert {f for f, _, _ in prompts} == {0, 1}  # this user switches between two files
    last: dict[int, str] = {}
    for f, prefix, suffix in prompts:
        if f in last:
            assert prefix.startswith(last[f]) and len(prefix) > len(last[f])
        assert prefix.endswith("\n") and len(suffix) <= cfg.suffix_chars  # the cursor is at a line start
        last[f] = prefix


def test_files_have_the_configured_size_and_the_traffic_is_the_same_for_every_target():
    cfg = ide.IdeWorkloadConfig(users=6, file_tokens=(2000, 6000), chars_per_token=2.0, switching_share=0.0)
    rng = random.Random(cfg.seed)
    sizes = [len(ide.Editor.new(rng, cfg).files[0]) for _ in range(cfg.users)]
    assert all(4000 <= n <= 12_200 for n in sizes), sizes
    assert _prompts(cfg, user_seed=3) == _prompts(cfg, user_seed=3)


def test_summary_hit_rate_is_token_weighted():
    t = ide.Target("http://x", "gateway")
    t.samples = [ide.Sample(0, 0.0, 10.0, 20.0, 1000, 900), ide.Sample(1, 0.0, 30.0, 40.0, 3000, 0)]
    s = ide.summarize(t, seconds=2.0)
    assert s["hit_rate"] == 0.225 and s["requests_per_s"] == 1.0 and s["ttft_p50_ms"] == 20.0
