"""Hand-written secret shapes and look-alikes: one line each, as it would appear in a prompt, an output or a comment
(tests.unit.serving.event_log.test_secret_scrub checks the scanner on each; tests.secret_corpus counts them in
the labelled corpus).

The secrets are fakes, put together at run time from pieces (`_j`), so that this file holds no string that a
secret scanner (GitHub's push protection, detect-secrets itself) would take for a live credential.
"""

from __future__ import annotations

import base64
import json


def _j(*parts: str) -> str:
    return "".join(parts)


def _b64url(obj) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


AWS_ID = _j("AKIA", "Q3EGRDFJ7XM2KZ4P")
AWS_SECRET = _j("wJalrXUtnFEMI/K7MDENG/", "bPxRfiCYzq8Lx3Nd2vQ")
JWT = _j(
    _b64url({"alg": "HS256", "typ": "JWT"}), ".", _b64url({"sub": "42", "name": "Jane"}), ".", "Sfl-KxwRJSMeKKF2QT4fwpM"
)
RANDOM62 = "q8Zr3LmT0vXkP2sYwB7nHc5JdG9fA1eUiO4tRyQ6"  # 40 characters, no pattern

# (name, text): each must be found. One shape per line, as it would appear in a prompt, an output or a comment.
SECRETS = [
    ("aws access key id", f'aws_access_key_id = "{AWS_ID}"'),
    ("aws key inside a call", f's3 = boto3.client("s3", aws_access_key_id="{AWS_ID}", region_name="eu-west-1")'),
    ("aws secret access key", f'aws_secret_access_key = "{AWS_SECRET}"'),
    ("aws temporary key in a shell export", _j("export AWS_ACCESS_KEY_ID=", "ASIA", "Y7KX2MZQ4WRT8NPL")),
    ("github classic token", _j('GH_TOKEN = "', "ghp", "_", "Xk92LmQ7vRt3NbW8sYp1ZcH6dJf4Ga0eKu5i", '"')),
    (
        "github oauth token",
        _j("curl -H 'Authorization: token ", "gho", "_", "a8Kd2Lq9Zx7Wm3Np5Rt1Vb6Yc4Hj0Gf2Se8u", "'"),
    ),
    ("github app token", _j("token: ", "ghs", "_", "P3kR8mZ2qW7vN5xL1cT9bY4hJ6gF0dS2aE8o")),
    (
        "github fine-grained token",
        _j('pat = "', "github_pat_", "11ABCDEFG0", "x9Kq2Lm7Zr4Wt8Vn3Bp5Yc1Hd6Jf0Ga2Se8uQ", '"'),
    ),
    (
        "gitlab personal token",
        _j("git remote set-url origin https://oauth2:", "glpat", "-", "Zr4Wt8Vn3Bp5Yc1Hd6Jf", "@gitlab.com/g/p.git"),
    ),
    ("gitlab runner token", _j("  token = ", "glrt", "-", "Kq2Lm7Zr4Wt8Vn3Bp5Yc1Hd6")),
    ("slack bot token", _j("SLACK_BOT_TOKEN=", "xoxb", "-", "2048193847-", "4917365028-", "q8zr3lmt0vxkp2sywb7nhc5j")),
    ("slack webhook", _j("https://hooks.slack.com/services/", "T0A1B2C3D", "/B4E5F6G7H/", "q8Zr3LmT0vXkP2sYwB7nHc5J")),
    ("stripe live secret key", _j('stripe.api_key = "', "sk", "_live_", "4eC39HqLyjWDarjtT1zdp7dc", '"')),
    ("stripe restricted key", _j("STRIPE=", "rk", "_live_", "51HqLyjWDarjtT1zdp7dc4eC", " ./deploy.sh")),
    (
        "openai key",
        _j(
            'client = OpenAI(api_key="', "sk-", "proj", "Ab3dE5gH7jK9mN1pQ3sT", "T3BlbkFJ", "Uv5wX7yZ9aB1cD3eF5gH", '")'
        ),
    ),
    ("rsa private key", "-----BEGIN RSA PRIVATE KEY-----"),
    ("openssh private key", 'key = """-----BEGIN OPENSSH PRIVATE KEY-----'),
    ("ec private key", "    -----BEGIN EC PRIVATE KEY-----"),
    ("pkcs8 private key", '"-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC"'),
    ("pgp private key", "-----BEGIN PGP PRIVATE KEY BLOCK-----"),
    ("jwt", f"headers = {{'Authorization': 'Bearer {JWT}'}}"),
    ("postgres url with password", 'engine = create_engine("postgresql://app:Tr0ub4dor-and-3@db.internal:5432/app")'),
    ("https url with credentials", "git clone https://deploy:q8Zr3LmT0vXkP2sY@git.example.org/team/repo.git"),
    ("amqp url with credentials", "BROKER_URL = amqp://worker:Xk9vL2mQ8zR4@rabbit:5672/vhost"),
    ("password keyword", 'password = "correct-horse-battery-staple"'),
    ("db password in yaml", '  db_password: "S3cure!Passw0rd"'),
    ("api key in json", '{"api_key": "5d41402abc4b2a76b9719d911017c592", "region": "us"}'),
    ("django secret key", _j("SECRET_KEY = '", "django-insecure-", "k2#9x!m@q7zr$3lv^b8w'")),
    ("javascript api key", 'const apiKey = "AIzaSy-q8Zr3LmT0vXkP2sYwB7nHc5JdG9fA1";'),
    (
        "sendgrid key",
        _j(
            'SENDGRID = "', "SG", ".", "q8Zr3LmT0vXkP2sYwB7nHc", ".", "5JdG9fA1eUiO4tRyQ6q8Zr3LmT0vXkP2sYwB7nHc5Jd", '"'
        ),
    ),
    ("twilio api key", _j("TWILIO_KEY=", "SK", "2f1e0d9c8b7a69584736251403f2e1d0")),
    ("npm token", _j("//registry.npmjs.org/:_authToken=", "npm_", "q8Zr3LmT0vXkP2sYwB7nHc5JdG9fA1eUiO4t")),
    (
        "pypi token",
        _j(
            "password = ",
            "pypi-AgEIcHlwaS5vcmc",
            "CJDk4ZjQ1YTgtNjRkYi00YjQwLWE1MDgtZjY3ZGE3NzE4YjNhAAIqWzMsIjFhYzE1ZWE3In0AAAYg",
        ),
    ),
    ("mailchimp key", _j("mc = MailChimp(mc_api='", "0f1e2d3c4b5a69788796a5b4c3d2e1f0", "-us6')")),
    (
        "discord bot token",
        _j("bot.run('", "MTk4NjIyNDgzNDcxOTI1MjQ4", ".", "Cl2FMQ", ".", "ZnCjm1XVW7vRze4b7Cq4se7kKWs", "')"),
    ),
    ("telegram bot token", _j("TELEGRAM_TOKEN=", "110201543", ":", "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw9")),
    ("square oauth secret", _j("SQUARE_SECRET=", "sq0csp", "-", "q8Zr3LmT0vXkP2sYwB7nHc5JdG9fA1eUiO4tRyQ6Xk9")),
    (
        "azure storage key",
        _j("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=", "q8Zr3LmT0vXkP2sY" * 5, "wB7nHc=="),
    ),
    ("high-entropy base64 string", f'FERNET_KEY = b"{RANDOM62}="'),
    ("high-entropy hex string", 'SIGNING = "8f3a9c1e7b2d6f40a5c8e1b39d7f2a6c"'),
    ("artifactory token", _j('ARTIFACTORY = "', "AKC", "p8q8Zr3LmT0vXkP2sYwB7nHc5JdG9fA1eUiO4tRyQ6", '"')),
    ("a secret in a user's comment", f"this broke when I used my key {AWS_ID} in the config"),
]

# Each must pass clean: text that looks like a secret to a careless eye, and is not one.
LOOK_ALIKES = [
    ("git sha in prose", "Fixed in 3f2c9a1b7e4d6f8a0c2e4b6d8f0a1c3e5b7d9f1a, see the changelog."),
    ("short sha", "git checkout 3f2c9a1 && git log --oneline -5"),
    ("uuid", 'request_id = "123e4567-e89b-42d3-a456-426614174000"'),
    ("base64 of a short word", 'greeting = base64.b64decode("aGVsbG8gd29ybGQ=")'),
    ("aws placeholder", 'aws_access_key_id = "AKIAXXXXXXXXXXXXXXXX"'),
    ("stripe placeholder", 'stripe.api_key = "sk_live_xxxxxxxxxxxxxxxxxxxxxxxx"'),
    ("api key placeholder", 'api_key = "your-api-key-here"'),
    ("token placeholder in caps", 'GITHUB_TOKEN = "YOUR_GITHUB_TOKEN"'),
    ("templated secret", 'password = "${DB_PASSWORD}"'),
    ("templated in braces", 'secret = "{secret}"'),
    ("angle placeholder", 'token = "<token>"'),
    ("masked password", 'password = "********"'),
    ("password from the environment", 'password = os.environ["PW"]'),
    ("password from a call", 'password = getpass.getpass("Password: ")'),
    ("password passed along", "client.login(username=user, password=password)"),
    ("password comparison", "if password != confirm_password:"),
    ("empty password in a test", 'assert form.errors["password"] == []'),
    ("url without credentials", 'requests.get("https://api.github.com/repos/octo/cat", timeout=5)'),
    ("ssh remote", "git@github.com:octo/cat.git"),
    ("url with a port and an at in the path", "https://registry.example.com:8443/pkg@2.1.0"),
    ("hex colours", 'style = {"color": "#1a2b3c", "background": "#ff00aa"}'),
    ("regex", 'AWS_KEY_RE = re.compile(r"(A3T[A-Z0-9]|AKIA|ASIA)[A-Z0-9]{16}")'),
    ("version string", '__version__ = "1.14.2rc1"'),
    ("the base64 alphabet", 'ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"'),
    ("large integer", "MAX_I64 = 9223372036854775807"),
    ("digits string", 'phone = "4155552671"'),
    ("id-like hex", 'user_id = "a8f5f167f44f4964e6c998dee827110c"'),
    ("public key", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop"),
    ("certificate header", "-----BEGIN CERTIFICATE-----"),
    ("generating a key", "key = rsa.generate_private_key(public_exponent=65537, key_size=2048)"),
    ("private key path", 'open(os.path.expanduser("~/.ssh/id_rsa"))'),
    ("prose about passwords", "The password must be at least 12 characters and is never logged."),
    ("email address", 'ADMINS = [("Alice", "alice@example.com")]'),
    ("ip addresses", 'DNS = ["8.8.8.8", "10.0.0.12"]'),
    ("content type header", "Content-Type: application/json; charset=utf-8"),
    ("jwt prefix in prose", "a JWT starts with eyJ because that is base64 for '{\"'"),
    ("numpy code", "x = np.random.default_rng(0).standard_normal((4096, 1024)).astype(np.float32)"),
    ("test fixture with a fake hash name", 'HASH_ALGORITHM = "sha256"'),
]

# Flagged by the library's judgement, and arguably right, so not configured away: a credential used in a test is
# still a credential, a default password is one, a quoted 64-hex digest is indistinguishable from a hex key, and
# the keyword plugin cannot tell the name of an environment variable from its value.
FLAGGED_ARGUABLY_RIGHT = [
    ("test login", 'client.login(username="test", password="test")'),
    ("default password", 'DEFAULT_PASSWORD = "changeme"'),
    ("sha256 digest", 'assert digest == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"'),
    ("env var name", 'API_KEY_ENV = "OPENAI_API_KEY"'),
]
