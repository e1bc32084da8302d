"""The public APIs' request validation and response shapes: OpenAI's completions and chat, the Responses and Messages
APIs, their function tools and client schemas, and the prompt a replica runs.

- `limits`: What one request may ask of the gateway (Limits): each bound a clear 400 naming it.
- `messages`: Anthropic's Messages API (`POST /v1/messages`, what Claude Code speaks): the request read into the
  gateway's conversation (serving.protocol.openai's checked messages), and the message and its stream events written
  back, with errors in that API's own shape.
- `openai`: OpenAI-compatible request validation and response shapes (completions, chat, errors).
- `prompts`: From a checked request to what a replica runs: prompt token ids (with their limits) and SGLang's
  sampling parameters.
- `responses`: OpenAI's Responses API (`POST /v1/responses`, what Codex CLI speaks): the request read into the
  gateway's conversation (serving.protocol.openai's checked messages), and the response and its stream events
  written back.
- `schema`: Request-body validation: the OpenAI error shape and one mechanism that checks every body.
- `tool_calls`: Function tools in the OpenAI chat API: request validation, the prompt format, and reading calls back
  out of the model's text (whole or streamed).
- `tool_schema`: A client's tool schema, accepted only if checking a call against it is bounded work, and that
  check.
- `typed_bodies`: Request parts checked against the official SDKs' own request types (openai and anthropic,
  TypedDicts), through pydantic, strictly: a wrong type is an error, never coerced ("1" is not 1).
"""
