"""`flywheel status`: the screen's parts, each drawn from its gathered dict (flywheel.status.gather) as a rich
table: replicas, gateway, kafka, trainer, versions, canary, alerts (DRAW), and the number formats they share. A
part that could not be read is one line saying why (flywheel.status.screen puts them together).
"""

from __future__ import annotations

import datetime
import re
import time

# ----------------------------------------------------------------------------- formatting


def _bytes(n) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "?"


def _span(s: float) -> str:
    s = abs(s)
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h" if s < 172800 else f"{s / 86400:.0f} d"


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _num(x, fmt: str = "{:.0f}") -> str:
    return "–" if x is None else fmt.format(x)


def _ms(seconds) -> str:
    return "–" if seconds is None else f"{1000 * seconds:.0f} ms"


def _parse_ts(text) -> float | None:
    """Prometheus's RFC 3339 activeAt (nanoseconds, Z) -> epoch seconds."""
    if not isinstance(text, str):
        return None
    text = re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00")
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


# ----------------------------------------------------------------------------- the parts


def _problem(part: dict):
    from rich.text import Text

    if part.get("not_given"):
        return Text(f"  – {part['error']}", style="dim")
    return Text(f"  ✗ {part['error']}", style="bold red")


NUMERIC = {"version", "in-flight", "queue", "req/s", "served", "failures", "lag", "completions", "accepts", "rejects"}
NUMERIC |= {"acceptance", "p99", "reward", "requests", "errors", "feedback", "malformed-tool-calls", "for"}


def _table(title: str, *columns: str):
    from rich import box
    from rich.table import Table
    from rich.text import Text

    t = Table(title=Text(title, style="bold"), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, expand=False)
    for c in columns:
        t.add_column(c, justify="right" if c in NUMERIC else "left")
    return t


def _replicas(data: dict):
    part = data["replicas"]
    if "error" in part:
        return _title("Replicas", _problem(part))
    trial = (data.get("canary") or {}).get("trial") or {}
    t = _table(
        f"Replicas (routing: {part.get('routing') or '?'})",
        *"replica state health version in-flight queue req/s served failures note".split(),
    )
    styles = {"active": "green", "draining": "yellow", "borrowed": "cyan"}
    for r in part["replicas"]:
        notes = []
        if r.get("id") in trial.get("replicas", []):
            notes.append(f"canary v{trial.get('version')}")
        if r.get("borrow_pending"):
            notes.append("borrow pending")
        if r.get("drain_lease_s") is not None:
            notes.append(f"drain lease {r['drain_lease_s']:.0f} s")
        if r.get("last_error") and not r.get("healthy"):
            notes.append(str(r["last_error"])[:60])
        state = str(r.get("state", "?"))
        _row(
            t,
            str(r.get("id")),
            _styled(state, styles.get(state, "")),
            _styled("ok", "green") if r.get("healthy") else _styled("down", "bold red"),
            _num(r.get("weight_version"), "v{}"),
            _num(r.get("outstanding")),
            _num(r.get("queue_depth")),
            _num(r.get("request_rate"), "{:.2f}"),
            _num(r.get("served")),
            _num(r.get("failures")),
            "; ".join(notes),
        )
    return t


def _gateway(data: dict):
    from rich.text import Text

    part = data["gateway"]
    if "error" in part:
        return _title("Gateway", _problem(part))
    rate, p99 = part.get("rate") or {}, part.get("p99") or {}
    req = rate.get("requests_per_s")
    errors = rate.get("errors_per_s")
    share = errors / req if req and errors is not None else None
    kafka = part.get("kafka_up")
    lines = Text()
    lines.append("Gateway", style="bold")
    lines.append(f"\n  requests {_num(req, '{:.2f}')}/s", style="bold")
    lines.append(f" ({rate.get('source', '?')}),  5xx {_pct(share) if req else '–'}")
    lines.append(f"\n  p99 {_ms(p99.get('seconds'))}", style="bold")
    lines.append(f" ({'no requests answered, ' if p99.get('seconds') is None else ''}{p99.get('source', '?')})")
    lines.append("\n  Kafka ")
    lines.append(
        "up" if kafka == 1 else ("DOWN (events go to the spool)" if kafka == 0 else "?"),
        style="green" if kafka == 1 else "bold red",
    )
    lines.append(f",  spool {_bytes(part.get('spool_pending_bytes'))} pending")
    window = part.get("spool_sync_window_s")
    if window is not None:  # what a machine crash may lose of what was answered
        lines.append(f", synced {'before answering' if window <= 0 else 'within ' + _ms(window)}")
    if part.get("spool_alarm"):
        lines.append("  SPOOL OVER ITS LIMIT", style="bold red")
    if part.get("events_dropped"):
        lines.append(f",  {part['events_dropped']:.0f} events dropped", style="bold red")
    if part.get("prometheus_error"):
        lines.append(f"\n  (Prometheus not used for rate and p99: {part['prometheus_error']})", style="yellow")
    return lines


def _kafka(data: dict):
    part = data["kafka"]
    if "error" in part:
        return _title("Kafka consumer lag", _problem(part))
    t = _table(f"Kafka consumer lag ({part['bootstrap']})", "group", "role", "state", "lag", "by topic")
    for g in part["groups"]:
        topics = ", ".join(f"{k} {v}" for k, v in g["by_topic"].items())
        if g["uncommitted_partitions"]:
            topics += f"  ({g['uncommitted_partitions']} partitions never committed)"
        style = "bold red" if g["lag"] > 1000 else ("yellow" if g["lag"] else "green")
        state = g.get("state") or "?"
        if g["role"] == "agent" and state == "Empty":  # agents subscribe: Empty means none is connected
            state = _styled("Empty (no consumer)", "yellow")
        _row(t, g["group"], g["role"], state, _styled(g["lag"], style), topics)
    if part.get("trainer_group") is None:
        _row(t, _styled(part["trainer_group_id"], "yellow"), "trainer", "absent", "", "no committed offsets yet")
    if not part.get("agents"):
        _row(t, _styled("no agent groups", "yellow"), "agent", "", "", "")
    return t


def _trainer(data: dict):
    from rich.text import Text

    part = data["trainer"]
    if "error" in part:
        return _title("Trainer", _problem(part))
    now = data.get("at") or time.time()
    out = Text()
    out.append("Trainer", style="bold")
    out.append(f"\n  step {part['step']}", style="bold")
    out.append(f",  published {_num(part.get('published_version'), 'v{}')}")
    out.append(f",  KL {_num(part.get('kl_per_token'), '{:.4f}')}/token")
    out.append(f",  samples waiting {_num(part.get('samples_waiting'))}")
    if part.get("failures"):
        out.append(f",  {part['failures']:.0f} failures lived through", style="yellow")
    last, nxt, interval = part.get("last_publish_ts"), part.get("next_publish_ts"), part.get("publish_interval_s")
    out.append("\n  last publish ")
    out.append(f"{_span(now - last)} ago" if last else "none since it started" if interval else "unknown")
    out.append(",  next ")
    if nxt:
        out.append(f"in {_span(nxt - now)}" if nxt >= now else f"due {_span(now - nxt)} ago", style="bold")
    elif interval:
        out.append(f"{_span(interval)} after the trainer started")
    else:
        out.append("unknown (the trainer exports no publish timestamps)", style="dim")
    return out


def _versions(data: dict):
    part = data["versions"]
    if "error" in part:
        return _title("Versions", _problem(part))
    t = _table(
        f"Versions ({part['count']} in the store)",
        *"version served-by completions accepts rejects acceptance p99 reward canary mark".split(),
    )
    for row in reversed(part["versions"]):
        v = row["version"]
        marks = [m for m, on in (("pinned", v == part.get("pinned")), ("stable", v == part.get("stable"))) if on]
        if v == part.get("newest"):
            marks.append("newest")
        canary = row.get("canary")
        style = {"in trial": "bold yellow", "trial started": "yellow", "promoted": "green", "rolled back": "red"}.get(
            canary, ""
        )
        acc = _pct(row.get("acceptance"))
        if row.get("acceptance_source") == "trainer":
            acc += " (trainer)"
        _row(
            t,
            f"v{v}",
            ",".join(row.get("replicas", [])) or "–",
            _num(row.get("completions")),
            _num(row.get("accepts")),
            _num(row.get("rejects")),
            acc,
            _ms(row.get("p99_s")),
            _num(row.get("reward_mean"), "{:.3f}"),
            _styled(canary or "–", style),
            " ".join(marks),
        )
    return t


def _canary(data: dict):
    part = data["canary"]
    if "error" in part:
        return _title("Canary", _problem(part))
    trial = part.get("trial")
    if not trial:
        return None  # no trial running: the versions table shows past outcomes
    age = time.time() - trial.get("started", time.time())
    t = _table(
        f"Canary trial of v{trial.get('version')} on {','.join(trial.get('replicas', []))} "
        f"for {100 * trial.get('share', 0):.0f}% of users, {_span(age)} so far",
        *"arm requests errors feedback acceptance p99 malformed-tool-calls".split(),
    )
    for arm, s in (trial.get("arms") or {}).items():
        p99 = s.get("p99_ms")
        _row(
            t,
            arm,
            _num(s.get("requests")),
            _num(s.get("errors")),
            _num(s.get("feedback")),
            _pct(s.get("acceptance")),
            "–" if p99 is None else f"{p99:.0f} ms",
            _pct(s.get("malformed_rate")),
        )
    return t


def _alerts(data: dict):
    from rich.text import Text

    part = data["alerts"]
    if "error" in part:
        return _title("Alerts", _problem(part))
    if not part["firing"]:
        pending = f" ({part['pending']} pending)" if part.get("pending") else ""
        return Text.assemble(("Alerts", "bold"), ("\n  none firing", "green"), pending)
    t = _table(f"Alerts firing ({len(part['firing'])})", "alert", "severity", "for", "summary")
    now = data.get("at") or time.time()
    for a in part["firing"]:
        since = _parse_ts(a.get("since"))
        _row(
            t,
            _styled(a["name"], "bold red"),
            a.get("severity") or "–",
            _span(now - since) if since else "?",
            a.get("summary") or "",
        )
    return t


def _styled(value, style: str = ""):
    """A cell of text from a source, shown as it is (never read as rich markup: "[...]" in an error stays)."""
    from rich.text import Text

    return Text(str(value), style=style)


def _row(table, *cells) -> None:
    table.add_row(*(c if not isinstance(c, str) else _styled(c) for c in cells))


def _title(title: str, body):
    from rich.console import Group
    from rich.text import Text

    return Group(Text(title, style="bold"), body)


DRAW = {
    "replicas": _replicas,
    "gateway": _gateway,
    "kafka": _kafka,
    "trainer": _trainer,
    "versions": _versions,
    "canary": _canary,
    "alerts": _alerts,
}
