"""benchmarks._load_rounds: paired rounds, their ratios, and CPU per request by part."""

from benchmarks import _load_rounds as lr


def test_every_round_loads_every_gateway_and_no_gateway_always_follows_the_same_one():
    names = ["on", "off", "noscrub"]
    orders = [lr.order(names, r) for r in range(9)]
    assert all(sorted(o) == sorted(names) for o in orders)
    on_first = sum(o.index("on") < o.index("off") for o in orders)
    assert 4 <= on_first <= 5  # 9 rounds: as near half as an odd count allows


def test_ratios_are_paired_by_round_and_cpu_is_charged_per_request(monkeypatch):
    clock = {"t": 0.0}

    def snapshot(parts):  # per turn, each part burns 0.5 s of CPU and the machine 1.5 s
        clock["t"] += 0.5
        return {**{k: clock["t"] for k in parts}, "machine": 3 * clock["t"]}

    monkeypatch.setattr(lr.pc, "snapshot", snapshot)
    monkeypatch.setattr(lr.time, "sleep", lambda s: None)
    served = {"on": iter([90, 100, 80]), "off": iter([100, 100, 100])}
    parts = {"on": {"gateway_loop": (1, "main")}, "off": {"gateway_loop": (2, "main"), "replica": (3, "tree")}}
    res = lr.run(parts, lambda name, secs: next(served[name]), rounds=3, seconds=1.0)
    assert res.ratios("on", "off") == [0.9, 1.0, 0.8]
    assert res.summary("on", "off") == {"median": 0.9, "min": 0.8, "max": 1.0}
    on = res.cpu_ms_per_request("on")  # 3 turns x 0.5 s per part over 270 requests
    assert on["gateway_loop"] == round(1500 / 270, 3)
    assert on["other"] == round(3 * 1500 / 270 - 1500 / 270, 3)
    off = res.cpu_ms_per_request("off")
    assert off["replica"] == 5.0 and off["other"] == 5.0 and off["total"] == 15.0


def test_a_round_in_slices_interleaves_short_turns_and_sums_them(monkeypatch):
    monkeypatch.setattr(lr.pc, "snapshot", lambda parts: {**dict.fromkeys(parts, 0.0), "machine": 0.0})
    monkeypatch.setattr(lr.time, "sleep", lambda s: None)
    turns = []

    def load(name, secs):
        turns.append((name, secs))
        return 10

    parts = {"on": {}, "off": {}}
    res = lr.run(parts, load, rounds=2, seconds=8.0, slices=4)
    assert res.counts == {"on": [40, 40], "off": [40, 40]}
    assert len(turns) == 16 and {secs for _, secs in turns} == {2.0}
    assert [n for n, _ in turns[:4]] == ["on", "off", "off", "on"]  # the order rotates from turn to turn
