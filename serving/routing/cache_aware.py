"""Cache-aware routing: send a prompt where its prefix is already cached, unless that replica is busy.

IDE completions from one user share long prefixes (the file above the cursor). Scattered over replicas,
each replica's radix cache misses what another one holds and prefill is paid again. Per replica this keeps
an approximate prefix tree of the prompts routed there (serving.routing.prefix_index), bounded by the
replica's KV capacity (SGLang's `sglang:max_total_num_tokens`, read by the health check):

    longest cached prefix >= min_match_tokens  -> that replica (ties: the tenant's last replica, then
                                                  the least loaded), unless its outstanding requests
                                                  exceed the least loaded replica's by balance_threshold
    otherwise (nothing worth keeping, or imbalance) -> least outstanding

Prefixes are named within the request's cache scope (one per tenant: serving.tenants.cache_scope), so another
tenant's prompts never make a replica look warm, as they never are in its cache (SGLang's `cache_salt`).

The index of a replica is dropped when its cache is: it failed (a restarted SGLang starts empty) or its
weights changed (a switch flushes the cache: KV of the old weights is wrong for the new).
"""

from __future__ import annotations

import itertools
from collections import Counter, OrderedDict
from typing import TYPE_CHECKING

from serving.routing.least_outstanding import LeastOutstanding, least_loaded, outstanding
from serving.routing.prefix_index import PrefixIndex, block_names

if TYPE_CHECKING:
    from serving.config import RoutingConfig
    from serving.routing.policy import RouteRequest
    from serving.routing.replica import ReplicaHandle

MAX_TENANTS = 100_000  # tenant -> last replica, least recently seen out


class CacheAware:
    name = "cache_aware"

    def __init__(self, cfg: RoutingConfig):
        self.cfg = cfg
        self.indexes: dict[str, PrefixIndex] = {}
        self._versions: dict[str, int | None] = {}  # replica id -> the weight version its index was built on
        self._affinity: OrderedDict[str, str] = OrderedDict()
        self._fallback = LeastOutstanding()
        self._turn = itertools.count()  # equal matches at equal load rotate
        self.decisions: Counter = Counter()  # why each pick went where it did: match | balance | no_match
        self.mispredicted = 0  # completions whose replica held less than the index said (it evicted first)

    def _index(self, r: ReplicaHandle) -> PrefixIndex:
        idx = self.indexes.get(r.id)
        if idx is None:
            idx = self.indexes[r.id] = PrefixIndex(self._capacity(r))
            self._versions[r.id] = r.weight_version
        return idx

    def _capacity(self, r: ReplicaHandle) -> int:
        tokens = r.kv_capacity_tokens or self.cfg.default_capacity_tokens
        return max(1, tokens // self.cfg.block_tokens)

    def pick(self, candidates: list[ReplicaHandle], req: RouteRequest) -> ReplicaHandle:
        if not req.tokens:  # nothing to match (a rollout on the users' replicas): no decision to count
            return self._fallback.pick(candidates)
        names = req.memo.get("blocks")
        if names is None:
            names = req.memo["blocks"] = block_names(req.tokens, self.cfg.block_tokens, req.scope)
        held = {r.id: self._index(r).match(names) for r in candidates}
        best = max(held.values())
        if best * self.cfg.block_tokens < max(self.cfg.min_match_tokens, 1):
            choice, why = self._fallback.pick(candidates), "no_match"
        else:
            top = [r for r in candidates if held[r.id] == best]
            mine = self._affinity.get(req.tenant) if req.tenant is not None else None
            choice = next((r for r in top if r.id == mine), None) or least_loaded(top, outstanding, next(self._turn))
            why = "match"
            if choice.outstanding - min(r.outstanding for r in candidates) > self.cfg.balance_threshold:
                choice, why = self._fallback.pick(candidates), "balance"
        self.decisions[why] += 1
        req.memo["predicted_tokens"] = held[choice.id] * self.cfg.block_tokens
        self._index(choice).insert(names)
        if req.tenant is not None:
            self._affinity[req.tenant] = choice.id
            self._affinity.move_to_end(req.tenant)
            while len(self._affinity) > MAX_TENANTS:
                self._affinity.popitem(last=False)
        return choice

    def on_complete(self, replica: ReplicaHandle, req: RouteRequest, cached_tokens: int | None) -> None:
        predicted = req.memo.get("predicted_tokens")
        # A block of slack: SGLang never counts a whole prompt as cached (the last token is always computed).
        # Requests of one prefix racing each other (n > 1) also land here: their first prefill had not run.
        if cached_tokens is not None and predicted is not None and cached_tokens < predicted - self.cfg.block_tokens:
            self.mispredicted += 1

    def on_load_update(self, replica: ReplicaHandle) -> None:
        idx = self.indexes.get(replica.id)
        if idx is None:
            return
        if not replica.healthy or self._versions.get(replica.id, replica.weight_version) != replica.weight_version:
            idx.clear()
        self._versions[replica.id] = replica.weight_version
        idx.resize(self._capacity(replica))

    def view(self) -> dict:
        return {
            "policy": self.name,
            "decisions": dict(self.decisions),
            "mispredicted": self.mispredicted,
            "indexed_tokens": {rid: len(i) * self.cfg.block_tokens for rid, i in sorted(self.indexes.items())},
        }
