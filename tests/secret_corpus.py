"""A labelled corpus for the secret scanner (serving.event_log.secret_scrub): secrets it should find and text it
should pass. The test that its first pass loses nothing (tests/unit/serving/event_log/test_secret_prefilter.py)
and the benchmark's `scrub_recall` and `scrub_false_positive_share` (benchmarks._scrub) both read it.

Its parts (`Case.part`):
- "upstream": detect-secrets' own public plugin tests (Yelp/detect-secrets at 5e14193, tests/plugins/*_test.py,
  Apache-2.0): every payload of their parametrized plugin cases with the verdict they expect, the keyword plugin's
  cases of every file type (a value flagged for one type is counted a secret: a prompt's file type is unknown),
  the entropy tests' strings quoted and bare, the private-key files. Left out: the IP-address plugin's (off here
  on purpose) and cases that are not lines (verification, settings). Their labels are kept as written, so the
  few placeholders they expect flagged (`AKC` then x's) count as misses of a scanner that passes placeholders.
  Kept in secret_corpus_upstream.jsonl, each text cut in pieces of 6 characters, so that no line of that file is
  anything a scanner flags.
- "shapes": tests.secret_shapes, labelled by what each is (its arguable ones: the test and default passwords are
  secrets, the digest and the variable's name are not).
- "providers": keys of the common providers, random (seeded) but shaped right, each in six contexts (assignment,
  shell export, JSON, YAML, header, comment); and as negatives their placeholders, references to where a key is
  kept, UUIDs, digests, versions. Built here from pieces: no key is written out in this file.
- "lockfile": every line of a real npm lockfile (flywheel/clients_npm/package-lock.json): negatives.
- "code": the distinct lines of this repository's production code (negatives), but for the scanner's own
  modules (serving/event_log/secret_*.py), whose docstrings quote secret shapes.
"""

from __future__ import annotations

import base64
import json
import random
import string
import uuid
from pathlib import Path
from typing import NamedTuple

from tests.secret_shapes import FLAGGED_ARGUABLY_RIGHT, LOOK_ALIKES, SECRETS

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
UPSTREAM = HERE / "secret_corpus_upstream.jsonl"
LOCKFILE = REPO_ROOT / "flywheel" / "clients_npm" / "package-lock.json"
CODE_PACKAGES = ("serving", "online_rl", "weight_sync", "kernels", "infra", "contracts", "admin_api", "flywheel")
ARGUABLE_SECRETS = {"test login", "default password"}  # of FLAGGED_ARGUABLY_RIGHT: the rest are not secrets


class Case(NamedTuple):
    part: str
    source: str
    text: str
    positive: bool


def labelled_corpus(code_packages: tuple[str, ...] = CODE_PACKAGES, seed: int = 0) -> list[Case]:
    return [*upstream(), *shapes(), *providers(seed), *lockfile(), *code(code_packages)]


def upstream() -> list[Case]:
    rows = [json.loads(line) for line in UPSTREAM.read_text().splitlines() if line]
    return [Case("upstream", r["source"], "".join(r["pieces"]), r["positive"]) for r in rows]


def shapes() -> list[Case]:
    return [
        *(Case("shapes", name, text, True) for name, text in SECRETS),
        *(Case("shapes", name, text, False) for name, text in LOOK_ALIKES),
        *(Case("shapes", name, text, name in ARGUABLE_SECRETS) for name, text in FLAGGED_ARGUABLY_RIGHT),
    ]


def lockfile() -> list[Case]:
    lines = dict.fromkeys(line.strip() for line in LOCKFILE.read_text().splitlines())
    return [Case("lockfile", LOCKFILE.name, line, False) for line in lines if line]


def code(packages: tuple[str, ...] = CODE_PACKAGES) -> list[Case]:
    lines: dict[str, str] = {}
    for pkg in packages:
        for path in sorted((REPO_ROOT / pkg).rglob("*.py")):
            if path.name.startswith("secret_") and path.parent.name == "event_log":
                continue
            for line in path.read_text().splitlines():
                if line.strip():
                    lines.setdefault(line, str(path.relative_to(REPO_ROOT)))
    return [Case("code", source, line, False) for line, source in lines.items()]


_UPPER, _LOWER, _DIGITS = string.ascii_uppercase, string.ascii_lowercase, string.digits
_ALNUM = _UPPER + _LOWER + _DIGITS
_URLSAFE = _ALNUM + "-_"
_B64 = _ALNUM + "+/"
_HEX = "0123456789abcdef"

CONTEXTS = (
    '{name} = "{key}"',
    "export {NAME}={key}",
    '  "{name}": "{key}",',
    "{name}: {key}",
    'curl -H "Authorization: Bearer {key}" https://api.example.com/v1/items',
    "# the {name} that finally worked: {key}",
)


def _r(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _b64url(obj: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


def _provider_keys(rng: random.Random) -> list[tuple[str, str, str]]:
    """(provider, a variable name for it, a key of its shape); prefixes cut in two so no key is written here."""
    r = lambda alphabet, n: _r(rng, alphabet, n)  # noqa: E731
    jwt_claims = {"sub": r(_DIGITS, 6), "name": r(_LOWER, 7), "iat": 1700000000 + rng.randrange(10**7)}
    return [
        ("aws access key id", "aws_id", "AK" + "IA" + r(_UPPER + "234567", 16)),
        ("aws temporary key id", "aws_tmp", "AS" + "IA" + r(_UPPER + "234567", 16)),
        ("aws secret access key", "aws_secret_access_key", r(_B64, 40)),
        ("github classic token", "gh", "gh" + "p_" + r(_ALNUM, 36)),
        ("github app token", "gh_app", "gh" + "s_" + r(_ALNUM, 36)),
        ("github fine-grained token", "gh_pat", "github" + "_pat_" + r(_ALNUM, 22) + "_" + r(_ALNUM, 59)),
        ("gitlab token", "gl", "glp" + "at-" + r(_URLSAFE, 20)),
        (
            "slack bot token",
            "slack",
            "xo" + "xb-" + r(_DIGITS, 11) + "-" + r(_DIGITS, 13) + "-" + r(_LOWER + _DIGITS, 24),
        ),
        (
            "slack webhook",
            "hook",
            "https://hooks.slack" + ".com/services/T" + r(_UPPER, 8) + "/B" + r(_UPPER, 8) + "/" + r(_ALNUM, 24),
        ),
        ("stripe secret key", "stripe", "sk" + "_live_" + r(_ALNUM, 24)),
        ("stripe restricted key", "stripe_rk", "rk" + "_live_" + r(_ALNUM, 24)),
        ("openai key", "openai", "sk-" + "proj-" + r(_URLSAFE, 40) + r(_ALNUM, 20) + "T3Blbk" + "FJ" + r(_ALNUM, 20)),
        ("anthropic key", "anthropic", "sk-" + "ant-api03-" + r(_URLSAFE, 93) + "AA"),
        ("npm token", "npm", "np" + "m_" + r(_ALNUM, 36)),
        ("pypi token", "pypi", "pypi-" + "AgEIcHlwaS5vcmc" + r(_URLSAFE, 120)),
        ("twilio api key", "twilio", "S" + "K" + r(_HEX, 32)),
        ("twilio account sid", "twilio_sid", "A" + "C" + r(_HEX, 32)),
        ("sendgrid key", "sendgrid", "S" + "G." + r(_URLSAFE, 22) + "." + r(_URLSAFE, 43)),
        ("azure storage key", "azure", "AccountKey" + "=" + r(_B64, 86) + "=="),
        ("google api key", "google", "AI" + "za" + r(_URLSAFE, 35)),
        ("mailchimp key", "mailchimp", r(_HEX, 32) + "-u" + f"s{rng.randrange(1, 20)}"),
        (
            "discord bot token",
            "discord",
            rng.choice("MNO") + r(_URLSAFE, 23) + "." + r(_URLSAFE, 6) + "." + r(_URLSAFE, 27),
        ),
        ("telegram bot token", "telegram", r(_DIGITS, 9) + ":" + r(_URLSAFE, 35)),
        ("square oauth secret", "square", "sq0" + "csp-" + r(_URLSAFE, 43)),
        ("jwt", "jwt", _b64url({"alg": "HS256", "typ": "JWT"}) + "." + _b64url(jwt_claims) + "." + r(_URLSAFE, 43)),
        ("hex signing key", "signing_hex", r(_HEX, 64)),
        ("base64 signing key", "signing_b64", r(_B64, 43) + "="),
    ]


def providers(seed: int = 0, keys_per_provider: int = 2) -> list[Case]:
    rng = random.Random(seed)
    out = []
    for _ in range(keys_per_provider):
        for provider, name, key in _provider_keys(rng):
            for context in CONTEXTS:
                out.append(Case("providers", provider, context.format(name=name, NAME=name.upper(), key=key), True))
        password = rng.choice(("Tr0ub4dor", "hunter", "S3cure", "Wint3r")) + r_sym(rng) + _r(rng, _ALNUM, 8)
        user, host = _r(rng, _LOWER, 6), f"{_r(rng, _LOWER, 5)}.internal"
        out += [
            Case("providers", "basic-auth url", f'DATABASE_URL = "postgres://{user}:{password}@{host}:5432/app"', True),
            Case("providers", "basic-auth url", f"git clone https://{user}:{password}@{host}/team/repo.git", True),
            Case("providers", "basic-auth url", f"BROKER=amqp://{user}:{password}@{host}:5672/", True),
            Case("providers", "password keyword", f'password = "{password}"', True),
            Case("providers", "password keyword", f'  db_password: "{password}"', True),
            Case("providers", "password keyword", f'{{"secret": "{password}", "user": "{user}"}}', True),
            Case("providers", "password keyword", f'const PASSWD = "{password}";', True),
        ]
        for kind in ("RSA ", "EC ", "OPENSSH ", "DSA ", "", "PGP "):
            header = f"-----BEGIN {kind}PRIVATE " + ("KEY BLOCK-----" if kind == "PGP " else "KEY-----")
            out.append(Case("providers", "private key", rng.choice(('key = """', "", '  "')) + header, True))
    return out + provider_negatives(rng)


def r_sym(rng: random.Random) -> str:
    return rng.choice("!#%&*+-.")


def provider_negatives(rng: random.Random) -> list[Case]:
    """Text about keys that holds none: placeholders, references to where a key is kept, ids, digests."""
    neg = []
    for name in ("stripe", "github_token", "openai", "aws_id", "npm", "slack"):
        neg += [
            f'{name} = os.environ["{name.upper()}"]',
            f"{name} = process.env.{name.upper()}",
            f"{name.upper()}: ${{{{ secrets.{name.upper()} }}}}",
            f'{name} = "<your-{name.replace("_", "-")}-here>"',
            f'{name} = "${{{name.upper()}}}"',
            f"export {name.upper()}=$(vault kv get -field=value secret/{name})",
        ]
    x = "x"
    neg += [
        '"AK' + "IA" + "X" * 16 + '"',
        "sk" + "_live_" + x * 24,
        "gh" + "p_" + x * 36,
        "xo" + "xb-" + "your-token-here",
        'api_key = "your-api-key-here"',
        'OPENAI_API_KEY = "sk-..."',
    ]
    for _ in range(6):
        u = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        sha = _r(rng, _HEX, 40)
        neg += [
            f'request_id = "{u}"',
            f"Fixed in {sha}, see the changelog.",
            f"image: registry.example.com/app@sha256:{_r(rng, _HEX, 64)}",
            f"--hash=sha256:{_r(rng, _HEX, 64)}",
            f'__version__ = "{rng.randrange(10)}.{rng.randrange(30)}.{rng.randrange(100)}"',
            f'color = "#{_r(rng, _HEX, 6)}"',
            f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{_r(rng, _B64, 43)} {_r(rng, _LOWER, 5)}@laptop",
            f'greeting = base64.b64decode("{base64.b64encode(_r(rng, _LOWER, 9).encode()).decode()}")',
        ]
    return [Case("providers", "look-alike", text, False) for text in dict.fromkeys(neg)]


def score(scrubber, cases: list[Case]) -> dict:
    """Recall (share of the positives flagged) and false-positive share (of the negatives flagged), overall and
    by part, of a scanner that flags a case when `find([text])` names any type."""
    flagged = [bool(scrubber.find([c.text])) for c in cases]

    def shares(idx: list[int]) -> dict:
        pos = [i for i in idx if cases[i].positive]
        neg = [i for i in idx if not cases[i].positive]
        return {
            "recall": round(sum(flagged[i] for i in pos) / max(1, len(pos)), 4),
            "false_positive_share": round(sum(flagged[i] for i in neg) / max(1, len(neg)), 4),
            "positives": len(pos),
            "negatives": len(neg),
        }

    parts = dict.fromkeys(c.part for c in cases)
    return {
        **shares(list(range(len(cases)))),
        "by_part": {p: shares([i for i, c in enumerate(cases) if c.part == p]) for p in parts},
    }
