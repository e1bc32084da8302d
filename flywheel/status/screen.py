"""`flywheel status`: the SRE's one screen (flywheel.status.gather gathers it, flywheel.status.panels draws each
part with rich, this module puts them on one screen and is the command).

    flywheel status                    read everything once and draw it
    flywheel status --json             the same data as one JSON object (for scripts)
    flywheel status --watch 5          redraw every 5 s (with --json: one JSON object per line)

Sources come from the environment a fleet hands out (flywheel.local_fleet LocalFleet.env()) and the
flags override them; the admin token is read from FLYWHEEL_ADMIN_TOKEN only. A part that cannot be read
is one line saying why, in its place; the exit code is 1 when a part that was given could not be read.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

from flywheel.status.gather import PARTS, StatusConfig, failed, gather
from flywheel.status.panels import DRAW
from infra.config import add_flags, build, option


@dataclass
class ScreenArgs:
    json: bool = option(False, help="print the gathered data as JSON instead of the screen")
    watch: float | None = option(None, help="redraw every WATCH seconds until Ctrl-C")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="the SRE's one screen: replicas, traffic, lag, trainer, versions, alerts")
    add_flags(p, StatusConfig)
    add_flags(p, ScreenArgs)
    p.set_defaults(func=_run)


def render(data: dict):
    """The screen: a rich renderable. Never raises: a part it cannot draw is one line saying so."""
    from rich.console import Group, RenderableType
    from rich.rule import Rule
    from rich.text import Text

    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(data.get("at") or time.time()))
    items: list[RenderableType] = [Rule(f"flywheel status · {when}", align="left")]
    where = sources if isinstance(sources := data.get("sources"), dict) else {}
    if any(where.values()):
        items.append(Text("  ".join(f"{k} {v}" for k, v in where.items() if v), style="dim"))
    for name in ("replicas", "gateway", "kafka", "trainer", "versions", "canary", "alerts"):
        if not isinstance(data.get(name), dict):
            items.append(Text(f"{name}: nothing gathered", style="bold red"))
            continue
        try:
            drawn = DRAW[name](data)
        except Exception as e:  # a shape we did not expect: say so in its place, draw the rest
            drawn = Text(f"{name}: cannot draw it ({type(e).__name__}: {str(e)[:120]})", style="bold red")
        if drawn is not None:
            items.append(drawn)
            items.append(Text(""))
    bad = failed(data)
    items.append(
        Text(f"unreadable: {', '.join(bad)}" if bad else "every source given answered", style="red" if bad else "dim")
    )
    return Group(*items)


# ----------------------------------------------------------------------------- the command


def _exit_code(data: dict) -> int:
    nothing = all(data.get(p, {}).get("not_given") for p in PARTS)
    return 1 if failed(data) or nothing else 0


def run(cfg: StatusConfig, as_json: bool = False, watch: float | None = None, console=None) -> int:
    """Gather and show once (exit code: 1 when a source given could not be read), or every `watch` seconds
    until Ctrl-C (then 0)."""
    from rich.console import Console

    console = console or Console()
    if watch is None:
        data = gather(cfg)
        if as_json:
            print(json.dumps(data, indent=2, default=str), flush=True)
        else:
            console.print(render(data))
        return _exit_code(data)
    if watch <= 0:
        raise ValueError("--watch takes a positive number of seconds")
    try:
        if as_json:
            while True:
                t0 = time.monotonic()
                print(json.dumps(gather(cfg), default=str), flush=True)
                time.sleep(max(0.0, watch - (time.monotonic() - t0)))
        from rich.live import Live

        with Live(render(gather(cfg)), console=console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(watch)
                live.update(render(gather(cfg)), refresh=True)
    except KeyboardInterrupt:
        return 0


def _run(args) -> int:
    screen = build(ScreenArgs, args)
    return run(build(StatusConfig, args), as_json=screen.json, watch=screen.watch)
