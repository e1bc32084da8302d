"""Which replica serves a user's request: routing policies behind one small interface.

The pool (serving.routing.pool) filters the candidates (healthy, active, not tried yet, the canary arm's);
a policy chooses among them and hears back about what happened:

    pick(candidates, request)                 -> the replica to try
    on_complete(replica, request, cached)      after it served (cached: the prompt tokens its prefix
                                              cache already held, as SGLang reports them; None: unknown)
    on_load_update(replica)                    after each health check of it, or its failure
    view()                                     what it decided and holds (GET /admin/replicas, /metrics)

A policy is one module here with one class, named in pool.make_policy and in RoutingConfig.policy's choices.

- `policy`: the interface above.
- `replica`: one replica as routing sees it (ReplicaHandle, ReplicaState); imports nothing of routing.
- `least_outstanding`, `cache_aware`: the policies (`prefix_index`: the cache-aware policy's view of one replica's
  prefix cache).
- `pool`: the replica pool (ReplicaPool, make_policy): states, health, and the candidates a policy chooses among.
- `dispatcher`: one choice of a request run on the fleet: pick, lease, retry on another replica.
"""
