"""The gateway's HTTP surface as aiohttp sub-applications, each given the parts of the gateway's state it uses
(serving.gateway composes them; the APIs that run turns share turn.TurnParts):

    /v1     completions.py (OpenAI completions, chat, models) and feedback.py (feedback, Tabby's events),
            behind the tenant-key middleware (serving.auth)
    /admin  admin.py (replicas, weights, load, rollouts, canary) and tenants.py (privacy policies), behind
            the admin-token middleware

Both public parts live in one /v1 sub-app: aiohttp resolves a path prefix to exactly one sub-app, and the
OpenAI and Tabby paths (/v1/feedback, /v1/events) are fixed by the clients.
"""
