"""Off-peak rollouts: what a trough is worth to the trainer and what handing a replica back costs users.

Two replicas of the demo model (one thread each on the 2 cores) behind the gateway; simulated users:
busy (4 concurrent) for 10 s, a trough (1 user, pauses) for 30 s, busy again for 15 s. The off-peak
scheduler borrows and returns; a rollout worker asks for rollouts on borrowed replicas all along.
Reported: rollout tokens generated per hour of trough, time from the rise to the return, and user p99
in the 3 s after the rise against the busy phase before the trough. Prints one JSON object last.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

KEY, ADMIN = "bench-key", "bench-admin"
BUSY_S, TROUGH_S, RISE_S = 10.0, 30.0, 15.0


def _post(url: str, body: dict, token: str) -> tuple[int, dict]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {}


def main() -> dict:
    from admin_api.client import AdminClient
    from admin_api.types import RolloutRequest
    from online_rl.model.bootstrap import bootstrap
    from online_rl.offpeak import OffPeakConfig, OffPeakScheduler
    from online_rl.tasks import synthetic as tasks
    from serving import gateway_process
    from serving.replica.process import ReplicaConfig, start as start_replica

    model = bootstrap("demo", 0, progress=False)
    prompts = [t.prompt for t in tasks.tasks("heldout")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-offpeak-"))
    started = []
    try:
        reps = [start_replica(ReplicaConfig(model_path=model, log_dir=tmp / "logs", threads=1)) for _ in range(2)]
        started += reps
        gw = gateway_process.start([r.url for r in reps], model, tmp / "gw", keys={"b": KEY}, admin_token=ADMIN)
        started.append(gw)
        sched = OffPeakScheduler(
            OffPeakConfig(
                gateway_url=gw.url,
                admin_token=ADMIN,
                low_water=0.5,
                high_water=1.5,
                hold_s=5.0,
                cooldown_s=3.0,
                smoothing_s=2.0,
                interval_s=0.25,
            )
        )
        users, stop = {"n": 4}, threading.Event()
        lat, errors, rollouts = [], [], []

        def user(i: int):
            rng = random.Random(i)
            while not stop.is_set():
                if i >= users["n"]:
                    time.sleep(0.05)
                    continue
                t = time.monotonic()
                status, _ = _post(
                    f"{gw.url}/v1/completions",
                    {"model": "m", "prompt": rng.choice(prompts), "max_tokens": 24, "temperature": 1.0},
                    KEY,
                )
                (lat if status == 200 else errors).append((t, time.monotonic()))
                if users["n"] <= 1:
                    time.sleep(rng.uniform(0.2, 1.2))

        def roll():
            rng = random.Random(99)
            admin = AdminClient(gw.url, ADMIN, timeout=120)
            while not stop.is_set():
                try:
                    body = admin.rollouts(
                        RolloutRequest(prompt=rng.choice(prompts), n=4, max_tokens=40, replicas="borrowed")
                    )
                except urllib.error.HTTPError:
                    time.sleep(0.2)
                    continue
                now = time.monotonic()
                rollouts.extend((now, len(c["output_ids"]), c["finish_reason"]) for c in body["choices"])

        threads = [threading.Thread(target=user, args=(i,)) for i in range(4)] + [threading.Thread(target=roll)]
        for t in threads:
            t.start()
        sched.start()
        time.sleep(BUSY_S)
        users["n"] = 1
        t_trough = time.monotonic()
        time.sleep(TROUGH_S)
        users["n"] = 4
        t_rise = time.monotonic()
        time.sleep(RISE_S)
        stop.set()
        sched.stop()
        for t in threads:
            t.join(timeout=120)
        decisions = [(d.action, d.replica, d.at) for d in sched.decisions]
        returns = [at for a, _, at in decisions if a == "return"]
        steady = [e - s for s, e in lat if s < t_trough - 1]
        rise = [e - s for s, e in lat if t_rise <= s < t_rise + 3]
        trough_tokens = sum(n for at, n, f in rollouts if t_trough <= at < t_rise and f != "abort")
        return {
            "rollout_tokens_per_trough_hour": round(trough_tokens / TROUGH_S * 3600),
            "rollout_tokens_in_trough": trough_tokens,
            "rollouts_aborted_at_return": sum(f == "abort" for _, _, f in rollouts),
            "decisions": [a for a, _, _ in decisions],
            "seconds_to_borrow_after_trough": round(
                next((at for a, _, at in decisions if a == "borrow"), np.nan) - t_trough, 2
            ),
            "seconds_to_return_after_rise": round(returns[0] - t_rise, 2) if returns else None,
            "user_p99_steady_ms": round(1000 * float(np.percentile(steady, 99)), 1),
            "user_p99_after_rise_ms": round(1000 * float(np.percentile(rise, 99)), 1),
            "user_p99_return_ratio": round(float(np.percentile(rise, 99) / np.percentile(steady, 99)), 2),
            "user_failed": len(errors),
            "user_requests": len(lat),
        }
    finally:
        for thing in reversed(started):
            thing.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(main()))
