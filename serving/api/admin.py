"""The admin sub-app (`/admin`, admin token): replica states, weights, user load, rollouts, canary trials,
and tenants' policies (serving.api.tenants).

The weight-sync agent drains and re-activates a replica around a switch; the off-peak scheduler borrows
and returns replicas and reads the load; the trainer asks for rollouts; weight_sync.canary.controller starts and ends
trials. State changes themselves belong to the replica pool (serving.routing.pool).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from typing import TYPE_CHECKING

from aiohttp import web

from admin_api import routes
from admin_api.tokens import AdminTokens
from contracts import events as ev
from serving.api.respond import json_response
from serving.api.tenants import Handler, TenantsApi
from serving.auth import Tenant, admin_middleware
from serving.canary_split import CanarySplit
from serving.protocol.openai import finish_reason, parse_completion
from serving.protocol.schema import ApiError, Field, Schema, number, one_of, parse_json_body, string_list, value
from serving.replica import engine
from serving.routing.pool import HeldByOperator, LastActive, ReplicaState

if TYPE_CHECKING:
    from serving.monitors import VersionMonitors
    from serving.protocol.limits import Limits
    from serving.protocol.prompts import Prompter
    from serving.routing.dispatcher import Dispatcher
    from serving.routing.pool import ReplicaPool

log = logging.getLogger(__name__)

# undrain: what an agent ends its drain with (a no-op when an operator has drained or borrowed it since).
ACTIONS = routes.REPLICA_ACTIONS
NO_BODY = Schema({})  # undrain, activate, borrow, return: an empty object (or nothing)
DRAIN_BODY = Schema(
    {"lease_s": Field(number(0, 3600, "'lease_s' must be a number of seconds in (0, 3600]", open_lo=True))}
)


def _version(v, name: str) -> int:
    version = ev.parse_version(v)
    if version is None:
        raise ApiError(400, f"'{name}' must be the canary's weight version (an integer)", param=name)
    return version


CANARY_BODY = Schema(
    {
        "version": Field(_version, required=True),
        "replicas": Field(string_list(), required=True),
        "share": Field(
            number(0, 1, "'share' must be a number between 0 and 1", open_lo=True, open_hi=True), required=True
        ),
    }
)


def route_def(route: routes.Route, handler: Handler) -> web.RouteDef:
    """A declared route (admin_api.routes) as the admin sub-app registers it (a GET answers HEAD too)."""
    if route.method == "GET":
        return web.get(route.local, handler)
    return web.route(route.method, route.local, handler)


class AdminApi:
    def __init__(
        self,
        admin_token: str | None,
        pool: ReplicaPool,
        dispatcher: Dispatcher,
        prompter: Prompter,
        limits: Limits,
        monitors: VersionMonitors,
        tenants: TenantsApi,
    ):
        self.admin_token, self.pool, self.dispatcher, self.prompter = admin_token, pool, dispatcher, prompter
        self.limits, self.monitors, self.tenants = limits, monitors, tenants

    def app(self) -> web.Application:
        app = web.Application(middlewares=[admin_middleware(AdminTokens.from_env(self.admin_token or ""))])
        handlers = {
            routes.LIST_REPLICAS: self.replicas,
            routes.REPLICA_ACTION: self.replica_action,
            routes.GET_WEIGHTS: self.weights,
            routes.ROLLOUTS: self.rollouts,
            routes.GET_LOAD: self.load,
            routes.GET_CANARY: self.canary,
            routes.START_CANARY: self.canary_start,
            routes.END_CANARY: self.canary_end,
            **self.tenants.handlers(),
        }
        app.add_routes([route_def(route, handler) for route, handler in handlers.items()])
        return app

    async def replicas(self, request: web.Request) -> web.Response:
        pool = self.pool
        return json_response({"replicas": [r.view() for r in pool.replicas.values()], "routing": pool.policy.view()})

    async def replica_action(self, request: web.Request) -> web.Response:
        pool = self.pool
        rid, action = request.match_info["replica"], request.match_info["action"]
        if rid not in pool.replicas:
            raise ApiError(404, f"no replica {rid!r}", code="replica_not_found")
        if action not in ACTIONS:
            raise ApiError(404, f"unknown action {action!r} ({', '.join(ACTIONS)})", code="not_found")
        body = (DRAIN_BODY if action == "drain" else NO_BODY).parse(await request.read())
        try:
            if action == "drain":
                replica = pool.drain(rid, body["lease_s"])
            elif action == "borrow":
                replica = pool.borrow(rid)
            elif action == "undrain":
                replica = pool.end_lease(rid)
            else:  # activate / return: users come back at once; rollouts in flight stop for the trainer to redo
                replica = pool.activate(rid)
                await self.dispatcher.abort_rollouts(replica)
        except LastActive as e:
            raise ApiError(409, str(e), code="last_active") from None
        except HeldByOperator as e:
            raise ApiError(409, str(e), code="held_by_operator") from None
        log.info(
            "replica %s -> %s%s (admin)",
            rid,
            replica.state.value,
            " (borrow pending)" if replica.borrow_pending else "",
        )
        return json_response(replica.view())

    async def load(self, request: web.Request) -> web.Response:
        """User load per replica and for the fleet: what the off-peak scheduler decides on."""
        reps = list(self.pool.replicas.values())
        active = [r for r in reps if r.state == ReplicaState.ACTIVE and r.healthy]
        in_flight = sum(r.outstanding for r in reps)
        queue = sum(r.queue_depth for r in active)
        return json_response(
            {
                "replicas": [r.view() for r in reps],
                "fleet": {
                    "replicas": len(reps),
                    "active": len(active),
                    "borrowed": sum(r.state == ReplicaState.BORROWED for r in reps),
                    "borrow_pending": sum(r.borrow_pending for r in reps),
                    "in_flight": in_flight,
                    "queue_depth": queue,
                    "request_rate": round(sum(r.rate for r in reps), 3),
                    "load_per_active": round((in_flight + queue) / max(1, len(active)), 3),
                },
            }
        )

    async def rollouts(self, request: web.Request) -> web.Response:
        """Trainer-side generation: n samples of one prompt, with token ids, behaviour logprobs, routed
        experts and version, on replicas lent to rollouts. Logged as source=rollout, never as user traffic.
        The body is a completions body (its schema) plus `replicas`: any | borrowed."""
        body = parse_json_body(await request.read())
        where = value(body, "replicas", Field(one_of("any", "borrowed"), "any"))
        body.pop("replicas", None)
        spec = parse_completion({"model": "rollout", **{k: v for k, v in body.items() if k != "model"}}, self.limits)
        if spec.stream:
            raise ApiError(400, "rollouts do not stream", param="stream")
        prompt_ids = await self.prompter.prompt_ids(spec)
        sampling = self.prompter.sampling(spec)
        rid = f"rollout-{time.time_ns():x}"
        bodies = [engine.payload(prompt_ids, sampling, 0, False, f"{rid}-{i}") for i in range(spec.n)]
        results = await asyncio.gather(
            *(self.dispatcher.run_choice(b, False, rollout=True, borrowed_only=where == "borrowed") for b in bodies)
        )
        trainer = Tenant(id="trainer", name="trainer")
        choices = []
        for i, (res, replica_id, timing) in enumerate(results):
            self.dispatcher.log_completion(trainer, spec, rid, i, prompt_ids, res, replica_id, timing, source="rollout")
            experts = self.dispatcher.experts(res)
            choices.append(
                {
                    "index": i,
                    "text": res.text,
                    "output_ids": res.output_ids,
                    "logprobs": res.logprobs,
                    "routed_experts": base64.b64encode(experts.tobytes()).decode(),
                    "routed_experts_shape": list(experts.shape),
                    "weight_version": res.weight_version,
                    "finish_reason": "abort"
                    if (res.finish or {}).get("type") == "abort"
                    else finish_reason(res.finish),
                    "replica": replica_id,
                }
            )
        return json_response({"id": rid, "prompt_ids": prompt_ids, "choices": choices})

    async def canary(self, request: web.Request) -> web.Response:
        c = self.dispatcher.canary
        return json_response({"canary": None if c is None else c.view()})

    async def canary_start(self, request: web.Request) -> web.Response:
        """Start a trial: {"version", "replicas": [ids], "share"}: that share of users goes to those replicas."""
        b = CANARY_BODY.parse(await request.read())
        reps, pool = b["replicas"], self.pool
        unknown = [r for r in reps if r not in pool.replicas]
        if unknown:
            raise ApiError(400, f"unknown replicas {unknown}", param="replicas")
        if len(set(reps)) >= len(pool.replicas):
            raise ApiError(400, "a canary must leave at least one stable replica", param="replicas")
        c = CanarySplit(version=b["version"], replicas=frozenset(reps), share=b["share"])
        self.dispatcher.canary = c
        log.info("canary trial of v%s on %s for %.0f%% of users", c.version, ",".join(reps), 100 * c.share)
        return json_response({"canary": c.view()})

    async def canary_end(self, request: web.Request) -> web.Response:
        ended, self.dispatcher.canary = self.dispatcher.canary, None
        return json_response({"canary": None if ended is None else ended.view()})

    async def weights(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "replicas": {r.id: r.weight_version for r in self.pool.replicas.values()},
                "tool_calls": self.monitors.view(),
            }
        )
