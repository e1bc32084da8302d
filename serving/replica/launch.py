"""`python -m serving.replica.launch <module> <args>`: run an SGLang launcher module with the replica's
keys (contracts.replica_keys) added to its arguments inside this process.

The keys come from the environment and are taken out of it before SGLang starts: SGLang takes them
only as flags, and flags on the command line are world-readable (`ps`, /proc/<pid>/cmdline), while
sys.argv changed here is not. Used on CPU and GPU alike (the module is `serving.replica.cpu_compat.launch` on
CPU, `sglang.launch_server` on a GPU).

The pinned SGLang (0.5.23) answers GET /server_info to any inference-key holder with its arguments,
the admin key among them (`resolved_dict()` and `launch_command`, which it redacts only for watermark
secrets): the gateway's key would read back the key that switches weights. So the keys are redacted
from every GET answer, by a middleware added where SGLang adds its own key check (measured:
tests/integration/serving/replica/test_replica_keys.py fails without it).
"""

import os
import runpy
import sys

from contracts import replica_keys

REDACTED = b"<redacted>"


class RedactKeys:
    """ASGI middleware: the given secrets never leave in a GET answer's body (info endpoints echo the
    server's arguments). POST answers (generation) are passed through untouched."""

    def __init__(self, app, secrets: list[bytes]):
        self.app, self.secrets = app, [s for s in secrets if s]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "GET" or not self.secrets:
            return await self.app(scope, receive, send)

        async def redacted(message):
            if message["type"] == "http.response.start":  # the length may change: let the server chunk it
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"content-length"]
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                for s in self.secrets:
                    body = body.replace(s, REDACTED)
                message = {**message, "body": body}
            await send(message)

        await self.app(scope, receive, redacted)


def _redact_from_answers(keys: list[str]) -> None:
    """Add RedactKeys where SGLang adds its key check (it imports add_api_key_middleware when it launches;
    sglang.srt.utils.auth imports nothing heavy, so this changes nothing else about the launch)."""
    from sglang.srt.utils import auth

    add = auth.add_api_key_middleware

    def add_with_redaction(app, *, api_key, admin_api_key):
        add(app, api_key=api_key, admin_api_key=admin_api_key)
        app.add_middleware(RedactKeys, secrets=[k.encode() for k in keys])  # outermost: sees every answer

    auth.add_api_key_middleware = add_with_redaction


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m serving.replica.launch <module> <sglang args>")
    module = sys.argv[1]
    args = sys.argv[2:]
    inference = os.environ.pop(replica_keys.INFERENCE_ENV, "")
    admin = os.environ.pop(replica_keys.ADMIN_ENV, "")
    if inference:
        args += ["--api-key", inference]
    if admin:
        args += ["--admin-api-key", admin]
    if inference or admin:
        _redact_from_answers([inference, admin])
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
