"""benchmarks._gateway_profile.per_request: a measured profile less its baseline, per extra request."""

from benchmarks._gateway_profile import per_request

AIOHTTP = "/venv/lib/python3.11/site-packages/aiohttp/web_protocol.py"
POLICY = "/work/serving/routing/cache_aware.py"
IMPORTS = "~"


def test_the_baseline_is_taken_off_site_by_site_and_divided_by_the_extra_requests():
    served = {(AIOHTTP, 438, "data_received"): 0.30, (POLICY, 60, "pick"): 0.012, (IMPORTS, 0, "marshal.loads"): 1.0}
    base = {(AIOHTTP, 438, "data_received"): 0.03, (POLICY, 60, "pick"): 0.002, (IMPORTS, 0, "marshal.loads"): 1.0}
    out = per_request(served, base, requests=100)
    assert out["by_family_us"] == {"aiohttp": 2700.0, "ours (serving)": 100.0}  # start-up imports cancel out
    assert out["routing_policy_us"] == 100.0
    assert out["profiled_us_per_request"] == 2800.0
    assert out["top_functions_us"][0] == ["web_protocol.py:438:data_received", 2700.0]


def test_a_site_only_the_baseline_has_is_subtracted_and_negative_noise_stays_out_of_families():
    served = {(AIOHTTP, 438, "data_received"): 0.2}
    base = {(AIOHTTP, 438, "data_received"): 0.1, (POLICY, 60, "pick"): 0.01}  # the measured one never ran it
    out = per_request(served, base, requests=10)
    assert out["profiled_us_per_request"] == 9000.0  # 10 ms in aiohttp less 1 ms only the baseline spent
    assert out["routing_policy_us"] == -1000.0
    assert out["by_family_us"] == {"aiohttp": 10000.0}


def test_the_event_loops_idle_wait_is_not_a_cost():
    """The baseline waits in its selector while the measured gateway works: that wait is no request's cost."""
    poll = ("~", 0, "<method 'poll' of 'select.epoll' objects>")
    served = {(AIOHTTP, 438, "data_received"): 0.2, poll: 1.0}
    base = {(AIOHTTP, 438, "data_received"): 0.1, poll: 3.0}
    out = per_request(served, base, requests=10)
    assert out["profiled_us_per_request"] == 10000.0 and out["by_family_us"] == {"aiohttp": 10000.0}
