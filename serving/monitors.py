"""Reward-hacking monitors per weight version: what each version's answers do besides being accepted. The public
reference found its reward hacks only by watching production (calls broken on purpose to dodge a negative reward,
needless clarifying questions instead of risky edits); here each such behaviour is a counter per version on
/metrics, a rate per version in GET /admin/weights, and, per canary arm, a guard of the canary
(serving.canary_split, weight_sync.canary.judge).

    series (all labelled by version)                    what
    flywheel_gateway_tool_calls{outcome}                 calls by outcome: valid, malformed, unknown_tool,
                                                         dropped_parallel (serving.protocol.tool_calls)
    flywheel_gateway_tool_calls_repeated                 kept calls identical to an earlier one of the session
    flywheel_gateway_hack_monitor{monitor}               answers (or tool results) a detector flagged:
                                                         failed_call, clarifying, test_edit, early_stop, truncated
                                                         (serving.signals.hacking)
    flywheel_gateway_hack_monitor_base{monitor}          what each is a share of: tool results for failed_call,
                                                         agent answers (tools offered) for clarifying and
                                                         test_edit, answers for early_stop and truncated
    flywheel_gateway_answer_tokens / _answers            tokens generated and answers: mean answer length

Tool calls are counted in calls: a valid answer counts each call it kept, a malformed or unknown_tool answer
counts one (it is returned as text; how many calls it meant to make is unknown). `repeated` is its own counter (such
a call is counted under its outcome too, so the outcomes stay a partition). The monitors count answers (choices).

The `version` label is bounded: the `max_versions` versions most recently seen are kept, an older one is dropped from
the exposition (its series ends; a fleet serves one or two versions at a time, a trial three). "unknown" when the
replica did not say which version answered.
"""

from __future__ import annotations

from collections import OrderedDict

from prometheus_client.core import CounterMetricFamily

from admin_api.types import HACK_MONITORS, MONITOR_BASE
from serving.protocol.tool_calls import MALFORMED, OUTCOMES as TOOL_OUTCOMES

_BASES = tuple(dict.fromkeys(MONITOR_BASE.values()))


class VersionMonitors:
    def __init__(self, max_versions: int = 8, max_calls: int = 100_000):
        self.max_versions = max_versions
        self._by_version: OrderedDict[str, dict[str, int]] = OrderedDict()
        self.max_calls = max_calls
        # (tenant, call id) -> (version, canary trial version or None, arm): whose call a tool result answers
        self._calls: OrderedDict[tuple[str, str], tuple[int | None, int | None, str]] = OrderedDict()

    def _row(self, version: int | None) -> dict[str, int]:
        v = "unknown" if version is None else str(version)
        row = self._by_version.get(v)
        if row is None:
            row = self._by_version[v] = {
                **dict.fromkeys(TOOL_OUTCOMES, 0),
                "repeated": 0,
                "answers": 0,  # answers with a call in them
                "malformed_answers": 0,
                **dict.fromkeys(HACK_MONITORS, 0),
                **dict.fromkeys(_BASES, 0),
                "answer_tokens": 0,
            }
            while len(self._by_version) > self.max_versions:
                self._by_version.popitem(last=False)
        self._by_version.move_to_end(v)
        return row

    def count(self, version: int | None, outcome: str, calls: int, repeated: int) -> None:
        """An answer with a tool call in it: its calls by outcome, and those repeating an earlier call."""
        row = self._row(version)
        row[outcome] = row.get(outcome, 0) + calls
        row["repeated"] += repeated
        row["answers"] += 1
        row["malformed_answers"] += outcome in MALFORMED

    def answer(self, version: int | None, agent: bool, flags: dict[str, bool], tokens: int) -> None:
        """Any answer: `agent` when tools were offered; flags: monitor -> flagged (serving.signals.hacking)."""
        row = self._row(version)
        row["all_answers"] += 1
        row["agent_answers"] += agent
        row["answer_tokens"] += tokens
        for name, hit in flags.items():
            row[name] += hit

    def calls_made(self, tenant: str, call_ids: list[str], version: int | None, trial: int | None, arm: str) -> None:
        """An answer's calls (ids), remembered for their results: bounded, least recently used out."""
        for cid in call_ids:
            self._calls[(tenant, cid)] = (version, trial, arm)
            self._calls.move_to_end((tenant, cid))
        while len(self._calls) > self.max_calls:
            self._calls.popitem(last=False)

    def tool_result(self, tenant: str, call_id: str, failed: bool) -> tuple[int | None, str] | None:
        """A call's result as the client sent it back: counted once for the version that made the call (a request
        retried carries it again: forgotten once read). Returns (trial version, arm) of the call, or None if the
        call is not one this gateway remembers."""
        made = self._calls.pop((tenant, call_id), None)
        if made is None:
            return None
        row = self._row(made[0])
        row["tool_results"] += 1
        row["failed_call"] += failed
        return made[1], made[2]

    def view(self) -> dict[str, dict]:
        """Per version: the counts, the malformed and repeated rates, each monitor's rate, the mean answer length."""
        out = {}
        for v, row in self._by_version.items():
            kept = row["valid"] + row["dropped_parallel"]
            rates = {
                f"{name}_rate": round(row[name] / row[base], 4) if row[base] else None
                for name, base in MONITOR_BASE.items()
                if name in HACK_MONITORS
            }
            out[v] = {
                **row,
                "malformed_rate": round(row["malformed_answers"] / row["answers"], 4) if row["answers"] else None,
                "repeated_rate": round(row["repeated"] / kept, 4) if kept else None,
                **rates,
                "mean_answer_tokens": round(row["answer_tokens"] / row["all_answers"], 2)
                if row["all_answers"]
                else None,
            }
        return out

    def collect(self):
        calls = CounterMetricFamily(
            "flywheel_gateway_tool_calls",
            "Tool calls read from answers, by outcome and "
            "by the weight version that wrote them: valid, malformed (returned as text), "
            "unknown_tool (returned as text), dropped_parallel (parallel_tool_calls=false: "
            "only the first kept)",
            labels=["outcome", "version"],
        )
        repeated = CounterMetricFamily(
            "flywheel_gateway_tool_calls_repeated",
            "Kept tool calls identical (name "
            "and arguments) to an earlier call of the same agent session, by version "
            "(also counted under their outcome)",
            labels=["version"],
        )
        flagged = CounterMetricFamily(
            "flywheel_gateway_hack_monitor",
            "Answers (tool results for failed_call) a reward-hacking detector flagged, by monitor and version "
            "(serving.signals.hacking): failed_call, clarifying, test_edit, early_stop, truncated",
            labels=["monitor", "version"],
        )
        base = CounterMetricFamily(
            "flywheel_gateway_hack_monitor_base",
            "What each monitor is a share of, by monitor and version: tool results read back (failed_call), "
            "answers with tools offered (clarifying, test_edit), all answers (early_stop, truncated)",
            labels=["monitor", "version"],
        )
        tokens = CounterMetricFamily(
            "flywheel_gateway_answer_tokens", "Tokens of the answers, by version (length gaming)", labels=["version"]
        )
        answers = CounterMetricFamily("flywheel_gateway_answers", "Answers (choices), by version", labels=["version"])
        for v, row in self._by_version.items():
            for outcome in TOOL_OUTCOMES:
                calls.add_metric([outcome, v], row[outcome])
            repeated.add_metric([v], row["repeated"])
            for name in HACK_MONITORS:
                flagged.add_metric([name, v], row[name])
                base.add_metric([name, v], row[MONITOR_BASE[name]])
            tokens.add_metric([v], row["answer_tokens"])
            answers.add_metric([v], row["all_answers"])
        yield from (calls, repeated, flagged, base, tokens, answers)
