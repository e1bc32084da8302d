"""The admin API has one home (admin_api): its routes are declared once (admin_api.routes), the gateway serves exactly
those, and every client reaches them through admin_api.client. Before, `/admin/...` paths were spelled in ~15 files
with three separate clients (urllib by hand, aiohttp by hand, admin_call).

The scan covers production code, load tests, benchmarks and the tests' shared helpers (tests/*.py, tests/clients);
the tests themselves (tests/unit, tests/integration) are exempt: they speak the wire as a stranger would, on purpose.
"""

from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from admin_api import routes
from admin_api.client import AdminClient, AsyncAdminClient
from admin_api.tokens import needed
from tests.fake_engine import gateway_over_fakes

REPO_ROOT = Path(__file__).resolve().parents[3]
SCANNED = (
    "contracts",
    "kernels",
    "infra",
    "weight_patch",
    "weight_sync",
    "serving",
    "online_rl",
    "flywheel",
    "loadtests",
    "benchmarks",
    "scripts",
)
ADMIN = "admin-secret"  # gateway_over_fakes's operator token


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def admin_literals(path: Path, root: Path = REPO_ROOT) -> list[str]:
    """`file:line: text` of each string literal (f-string parts included) that spells /admin; docstrings and
    comments may."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    return [
        f"{path.relative_to(root)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and "/admin" in node.value
        and id(node) not in docs
    ]


def scanned_files() -> list[Path]:
    files = [p for top in SCANNED for p in sorted((REPO_ROOT / top).rglob("*.py"))]
    files += sorted((REPO_ROOT / "tests").glob("*.py")) + sorted((REPO_ROOT / "tests" / "clients").rglob("*.py"))
    return files


def test_no_admin_path_is_spelled_outside_admin_api():
    assert len(scanned_files()) > 100  # the scan sees the code
    found = [hit for path in scanned_files() for hit in admin_literals(path)]
    assert not found, "admin paths belong in admin_api.routes (build them from there):\n" + "\n".join(found)


def test_the_scan_sees_literals_and_f_string_parts_but_not_docstrings_or_comments(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        '"""GET /admin/replicas is fine here."""\n'
        "def f(url):\n"
        '    """and /admin/load here"""\n'
        '    return f"{url}/admin/weights", "/admin/canary"  # /admin/x in a comment\n'
    )
    assert sorted(admin_literals(src, tmp_path)) == ["m.py:4: '/admin/canary'", "m.py:4: '/admin/weights'"]


def test_routes_build_paths_and_declare_their_capability():
    assert routes.replica_action("r0", "drain") == "/admin/replicas/r0/drain"
    assert routes.tenant("a/b c") == "/admin/tenants/a%2Fb%20c"  # one segment, whatever the name
    assert routes.forget("acme") == "/admin/tenants/acme/forget"
    assert routes.declared("HEAD", "/admin/replicas") is routes.LIST_REPLICAS
    assert routes.declared("PUT", "/admin/tenants/acme") is routes.SET_POLICY
    assert routes.declared("GET", "/admin/tenantsx") is None
    for r in routes.ROUTES:  # the middleware asks the routes; each agrees with the rule they all follow
        sample = r.url(**{p: "x" for p in ("replica", "action", "name") if "{" + p + "}" in r.path})
        assert needed(r.method, sample) == r.capability
        rule = "tenants" if "/tenants" in r.path else ("status" if r.method == "GET" else "weights")
        assert r.capability == rule, r


def served_admin_routes(app: aiohttp.web.Application) -> set[tuple[str, str]]:
    """(method, path template) of each route the gateway serves under the admin prefix (HEAD: a GET's twin)."""
    out = set()
    for resource in app.router.resources():
        sub = getattr(resource, "_app", None)
        if sub is None:
            continue
        for route in sub.router.routes():
            path = route.resource.canonical
            if path.startswith(routes.PREFIX + "/") and route.method != "HEAD":
                out.add((route.method, path))
    return out


def test_the_gateway_serves_exactly_the_declared_routes_and_the_client_reaches_them(test_model, tmp_path):
    async def scenario():
        async with gateway_over_fakes(test_model, tmp_path / "gw", [1, 1], tenants=2) as (client, _):
            served = served_admin_routes(client.gateway.app)
            url = str(client.make_url("")).rstrip("/")
            admin = AdminClient(url, ADMIN)
            loop = asyncio.get_running_loop()

            def sync_calls():
                out = {
                    "replicas": sorted(r["id"] for r in admin.replicas()["replicas"]),
                    "weights": admin.weights()["replicas"],
                    "load": admin.load()["fleet"]["replicas"],
                    "canary": admin.canary()["canary"],
                    "drained": admin.replica_action("r1", "drain")["state"],
                    "activated": admin.replica_action("r1", "activate")["state"],
                    "trial": admin.start_canary({"version": 2, "replicas": ["r1"], "share": 0.5})["canary"]["version"],
                    "ended": admin.end_canary()["canary"]["version"],
                    "tenants": len(admin.tenants()["tenants"]),
                    "u1": admin.tenant("u1")["name"],
                }
                for what, call in {
                    "unknown": lambda: admin.replica_action("r9", "drain"),
                    "policy": lambda: admin.set_policy("u1", {"train": "deny"}),  # no keys file to write it to
                    "forget": lambda: admin.forget("u1"),
                }.items():
                    try:
                        call()
                    except OSError as e:  # urllib.error.HTTPError
                        out[what] = (e.code, json.loads(e.read())["error"]["code"])
                return out

            got = await loop.run_in_executor(None, sync_calls)
            async with aiohttp.ClientSession() as session:
                a = AsyncAdminClient(session, url, ADMIN)
                drain = await a.replica_action("r0", "drain", {"lease_s": 5})
                status, reps = await a.replicas()
                lease = next(r for r in reps["replicas"] if r["id"] == "r0")["drain_lease_s"]
                undrain = await a.replica_action("r0", "undrain")
                refused = await a.replica_action("r0", "bogus")
            return served, got, (drain[0], status, lease is not None, undrain[0], refused[1]["error"]["code"])

    served, got, async_got = asyncio.run(scenario())
    declared = {(r.method, r.path) for r in routes.ROUTES}
    assert served == declared, {"served, not declared": served - declared, "declared, not served": declared - served}
    assert got == {
        "replicas": ["r0", "r1"],
        "weights": {"r0": 1, "r1": 1},
        "load": 2,
        "canary": None,
        "drained": "draining",
        "activated": "active",
        "trial": 2,
        "ended": 2,
        "tenants": 2,
        "u1": "u1",
        "unknown": (404, "replica_not_found"),
        "policy": (409, "no_keys_file"),
        "forget": (409, "no_keys_file"),
    }
    assert async_got == (200, 200, True, 200, "not_found")


@pytest.mark.parametrize("method", ["POST", "PUT"])
def test_a_post_or_put_without_a_body_sends_an_empty_object(method):
    from admin_api.client import _body

    assert _body(method, None) == {} and _body("GET", None) is None and _body("DELETE", None) is None
