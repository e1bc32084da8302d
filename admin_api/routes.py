"""Every route of the gateway's admin API, with the capability it needs (admin_api.tokens): the gateway registers
its handlers from these (serving.api.admin, serving.api.tenants), its middleware asks `needed()` of them, and every
client builds its URLs with them (admin_api.client). No other module spells an admin path.

    GET    /admin/replicas                    status   each replica's state, health, version, load; the routing
    POST   /admin/replicas/{replica}/{action} weights  drain (an agent's lease) | undrain | activate | borrow | return
    GET    /admin/weights                     status   the version each replica serves; tool-call figures by version
    GET    /admin/load                        status   user load per replica and for the fleet (the off-peak scheduler)
    POST   /admin/rollouts                    weights  the trainer's samples on replicas lent to rollouts
    GET    /admin/canary                      status   the canary trial in progress and what each arm saw
    PUT    /admin/canary                      weights  start a trial
    DELETE /admin/canary                      weights  end it
    GET    /admin/tenants                     tenants  every tenant: key ids, policy, requests refused by its limits
    GET    /admin/tenants/{name}              tenants
    PUT    /admin/tenants/{name}              tenants  change its policy
    POST   /admin/tenants/{name}/forget       tenants  forget what it sent so far
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

PREFIX = "/admin"  # where the gateway mounts the admin app
STATUS, WEIGHTS, TENANTS = "status", "weights", "tenants"  # the capabilities (admin_api.tokens.CAPABILITIES)
REPLICA_ACTIONS = ("drain", "undrain", "activate", "borrow", "return")


@dataclass(frozen=True)
class Route:
    """One route: its method, its path template as clients see it (/admin/...; `{param}` one path segment)
    and the capability a token must grant to call it."""

    method: str
    path: str
    capability: str

    @property
    def local(self) -> str:
        """The template as the admin sub-app registers it (under PREFIX)."""
        return self.path.removeprefix(PREFIX)

    def url(self, **params: str) -> str:
        """The path of one call: each parameter quoted as one segment (a name with '/' stays one)."""
        return self.path.format(**{k: quote(str(v), safe="") for k, v in params.items()})

    def matches(self, method: str, path: str) -> bool:
        """Whether a request (path as the admin app sees it, /admin/...) is this route; HEAD is a GET."""
        m = "GET" if method == "HEAD" else method
        return m == self.method and _pattern(self.path).fullmatch(path) is not None


def _pattern(template: str) -> re.Pattern:
    return re.compile("/".join(r"[^/]+" if p.startswith("{") else re.escape(p) for p in template.split("/")))


LIST_REPLICAS = Route("GET", PREFIX + "/replicas", STATUS)
REPLICA_ACTION = Route("POST", PREFIX + "/replicas/{replica}/{action}", WEIGHTS)
GET_WEIGHTS = Route("GET", PREFIX + "/weights", STATUS)
GET_LOAD = Route("GET", PREFIX + "/load", STATUS)
ROLLOUTS = Route("POST", PREFIX + "/rollouts", WEIGHTS)
GET_CANARY = Route("GET", PREFIX + "/canary", STATUS)
START_CANARY = Route("PUT", PREFIX + "/canary", WEIGHTS)
END_CANARY = Route("DELETE", PREFIX + "/canary", WEIGHTS)
LIST_TENANTS = Route("GET", PREFIX + "/tenants", TENANTS)
GET_TENANT = Route("GET", PREFIX + "/tenants/{name}", TENANTS)
SET_POLICY = Route("PUT", PREFIX + "/tenants/{name}", TENANTS)
FORGET = Route("POST", PREFIX + "/tenants/{name}/forget", TENANTS)

ROUTES = (
    LIST_REPLICAS,
    REPLICA_ACTION,
    GET_WEIGHTS,
    GET_LOAD,
    ROLLOUTS,
    GET_CANARY,
    START_CANARY,
    END_CANARY,
    LIST_TENANTS,
    GET_TENANT,
    SET_POLICY,
    FORGET,
)


def replica_action(replica: str, action: str) -> str:
    """POST path of one replica's action (REPLICA_ACTIONS)."""
    return REPLICA_ACTION.url(replica=replica, action=action)


def tenant(name: str) -> str:
    return GET_TENANT.url(name=name)


def forget(name: str) -> str:
    return FORGET.url(name=name)


def declared(method: str, path: str) -> Route | None:
    """The declared route a request is (None: no such route; the gateway answers 404)."""
    return next((r for r in ROUTES if r.matches(method, path)), None)
