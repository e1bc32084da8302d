"""The gateway's HTTP surface as aiohttp sub-applications, each given the parts of the gateway's state it uses
(serving.gateway composes them; the APIs that run turns share turn.TurnParts):

    /v1     completions.py (OpenAI completions, chat, models) and feedback.py (feedback, Tabby's events),
            behind the tenant-key middleware (serving.auth)
    /admin  admin.py (replicas, weights, load, rollouts, canary) and tenants.py (privacy policies), behind
            the admin-token middleware

Both public parts live in one /v1 sub-app: aiohttp resolves a path prefix to exactly one sub-app, and the
OpenAI and Tabby paths (/v1/feedback, /v1/events) are fixed by the clients.

- `admin`: The admin sub-app (`/admin`, admin token): replica states, weights, user load, rollouts, canary trials,
  and tenants' policies (serving.api.tenants).
- `completions`: The OpenAI API: `/v1/completions`, `/v1/chat/completions` (plain, or streamed as server-sent
  events) and `/v1/models`.
- `feedback`: Feedback in: `/v1/feedback` (on one completion's choice, or on a whole agent session) and Tabby's
  `/v1/events` (view | select | dismiss, and our comment | persisted).
- `messages`: Anthropic's Messages API: `POST /v1/messages` (plain, or streamed as its events) and `POST
  /v1/messages/count_tokens`, keyed by `x-api-key` (or a bearer token) with an `anthropic-version` header, and every
  error in that API's shape (`{"type": "error", "error": {"type", "message"}}`).
- `respond`: JSON responses in the gateway's one shape (orjson; errors as OpenAI error bodies).
- `responses`: OpenAI's Responses API: `POST /v1/responses` (plain, or streamed as its typed events), and what
  `store` keeps: `GET /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`, `DELETE /v1/responses/{id}`.
- `stream`: A completion streamed as server-sent events, OpenAI's chunk shapes, n choices interleaved.
- `tenants`: Tenants' privacy policies on the admin API (`/admin/tenants`, admin token).
- `turn`: One turn of a conversation on the fleet, whichever API asked for it (chat, Responses, Messages).
"""
