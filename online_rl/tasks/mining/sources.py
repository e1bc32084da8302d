"""Where mined code comes from: a local repository, a PyPI source distribution, or the standard library.

A Source is a folder of code with its tests, its provenance (origin and version) and, for each code file, the test
files that may judge it. Kinds:
- a local folder (`Source.local`): every `test_*.py` / `*_test.py` is a test file, every other .py file (but
  setup.py, conftest.py, docs) is code; the version is the git commit when it is a checkout, else a content hash.
- a PyPI sdist (`fetch_pypi`): the archive itself, found on the index's simple page and checked against its
  sha256 (PINNED's, or the index's for a version not pinned), into $FLYWHEEL_HOME/mining/sdists, unpacked beside
  it; then as a local folder. Not `pip download`: to read an sdist's metadata pip runs its build hooks (setup.py),
  the package's code on this host, outside the jail. PINNED lists small pure-Python packages whose sdists ship
  unittest or plain-function tests (checked: more-itertools, cachetools, simplejson, toolz, boltons).
- the standard library (`fetch_stdlib`): the interpreter's own modules (Debian's libpython3.11-stdlib) and Debian's
  libpython3.11-testsuite, fetched with `apt-get download` and unpacked into the cache (not installed: its package
  depends on the newest python3.11 and installing it would upgrade the interpreter). Each top-level pure-Python
  module `X.py` is paired with `test/test_X.py`; the pair is copied into the source folder, where the test imports
  the copy (the runner imports X afresh from the work dir), with the single-file helpers the test imports from the
  `test` package (test/audiotests.py, ...) in a `test` package of its own whose path goes on to the stdlib's
  (test.support comes from the stdlib in the jail).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from infra.paths import flywheel_home

PINNED = {  # name -> (version, sha256 of its sdist)
    "more-itertools": ("10.5.0", "5482bfef7849c25dc3c6dd53a6173ae4795da2a41a80faea6700d9f5846c5da6"),
    "cachetools": ("5.5.0", "2cc24fb4cbe39633fb7badd9db9ca6295d766d9c2995f245725a46715d050f2a"),
    "simplejson": ("3.19.3", "8e086896c36210ab6050f2f9f095a5f1e03c83fa0e7f296d6cba425411364680"),
    "toolz": ("1.0.0", "2c86e3d9a04798ac556793bced838816296a2f085017664e4995cb40a1047a02"),
    "boltons": ("24.1.0", "4a49b7d57ee055b83a458c8682a2a6f199d263a8aa517098bda9bab813554b87"),
}
INDEX = "https://pypi.org/simple"
PRIVATE_SUFFIXES = frozenset({".pem", ".key", ".p12", ".pfx", ".keystore", ".kdbx"})
# Standard-library modules not mined: the interpreter or the test runner in the jail is made of them (re-importing
# a broken copy breaks the runner, not the test), or they are C modules' Python faces.
STDLIB_SKIP = frozenset(
    "os posixpath genericpath stat codecs abc io site _collections_abc types enum functools re sre_compile sre_parse "
    "sre_constants unittest importlib warnings traceback linecache contextlib operator keyword weakref copyreg "
    "inspect dis ast typing threading signal _weakrefset resource selectors subprocess shutil tempfile socket ssl "
    "locale heapq bisect datetime decimal _pydecimal pickle copy struct token opcode this antigravity".split()
)
SHIP_LIMIT = 256 << 10  # the largest file that travels into the jail with a repository
SKIP_DIRS = {".git", ".hg", ".tox", ".nox", "__pycache__", "build", "dist", "docs", "doc", ".eggs", "site-packages"}


def mining_home() -> Path:
    path = flywheel_home() / "mining"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _is_test(rel: Path) -> bool:
    return rel.name.startswith("test_") or rel.stem.endswith("_test")


@dataclass
class Source:
    name: str  # e.g. "stdlib", "toolz", or a local folder's name
    version: str  # a release, a Debian version, or a commit
    origin: str  # how to get the same bytes again
    root: Path
    code: list[str]  # code files (relative paths) whose functions are mined
    tests: list[str]  # test files
    paths: list[str] = field(default_factory=lambda: [""])  # sys.path roots (relative)
    pairs: dict[str, list[str]] | None = None  # code file -> its test files, when known (stdlib); else by text
    ship_all: bool = True  # every small text file travels into the jail (a package); False: only the pair

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text(encoding="utf-8", errors="replace")

    def module_of(self, rel: str) -> tuple[str, str]:
        """(dotted module name, its sys.path root) of a file: packages are walked up through their __init__.py."""
        path = Path(rel)
        parts = [] if path.stem == "__init__" else [path.stem]
        folder = path.parent
        while folder != Path(".") and (self.root / folder / "__init__.py").is_file():
            parts.insert(0, folder.name)
            folder = folder.parent
        return ".".join(parts), "" if folder == Path(".") else str(folder)

    def tests_for(
        self, code_rel: str, name: str, texts: dict[str, str], limit: int = 1, callers: tuple[str, ...] = ()
    ) -> list[str]:
        """The test files that may judge `name` of `code_rel`: the pair's, else those that mention the function (and
        `callers`: a feature's) most, else those that mention its module; at most `limit`."""
        if self.pairs is not None:
            return self.pairs.get(code_rel, [])[:limit]
        words = [re.compile(rf"\b{re.escape(w)}\b") for w in {name, *callers}]
        scored = sorted(((sum(len(w.findall(texts[t])) for w in words), t) for t in self.tests), reverse=True)
        hits = [t for n, t in scored if n]
        if not hits and not name.startswith("_"):
            return []
        if not hits:
            mod = re.compile(rf"\b{re.escape(self.module_of(code_rel)[0].rsplit('.', 1)[-1])}\b")
            hits = [t for n, t in sorted(((len(mod.findall(texts[t])), t) for t in self.tests), reverse=True) if n]
        return hits[:limit]

    def shipped(self, code_rel: str, test_rel: str) -> dict[str, str]:
        """The files that travel into the jail for one code file and one test file (texts as they are)."""
        return ship(self.root, code_rel, test_rel, self.ship_all)

    @classmethod
    def local(cls, root: Path, name: str | None = None, version: str | None = None, origin: str | None = None):
        root = root.resolve()
        code, tests = [], []
        for p in sorted(root.rglob("*.py")):
            rel = p.relative_to(root)
            if set(rel.parts[:-1]) & SKIP_DIRS or p.stat().st_size > SHIP_LIMIT:
                continue
            if _is_test(rel):
                tests.append(str(rel))
            elif rel.name not in ("setup.py", "conftest.py", "noxfile.py", "__main__.py") and not any(
                part in ("tests", "test", "testing") for part in rel.parts[:-1]
            ):
                code.append(str(rel))
        paths = [""] + (["src"] if (root / "src").is_dir() else [])
        if version is None:
            version = _git_commit(root) or "sha256:" + _tree_hash(root, code + tests)
        return cls(name or root.name, version, origin or f"local:{root}", root, code, tests, paths)


def ship(root: Path, code_rel: str, test_rel: str, ship_all: bool) -> dict[str, str]:
    """The files of `root` that travel into the jail: every small text file (a package), or just the pair."""
    if not ship_all:
        rels = [code_rel, test_rel] + [
            f"test/{h}.py"
            for h in _test_helpers((root / test_rel).read_text(errors="replace"))
            if (root / "test").is_dir()
        ]
        rels += ["test/__init__.py"] if len(rels) > 2 else []
        return {
            rel: (root / rel).read_text(encoding="utf-8", errors="replace") for rel in rels if (root / rel).is_file()
        }
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if not p.is_file() or set(rel.parts) & SKIP_DIRS or p.stat().st_size > SHIP_LIMIT:
            continue
        if any(part.startswith(".") for part in rel.parts) or rel.suffix in PRIVATE_SUFFIXES:
            continue  # a checkout's dotfiles (.env, .git, .netrc) and key files stay out of the jail
        try:
            out[str(rel)] = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
    return out


_HELPER = re.compile(r"^\s*(?:from test import ([\w, ]+)|from test\.(\w+) import|import test\.(\w+))", re.M)


def _test_helpers(text: str) -> list[str]:
    """The stdlib test package's modules a test imports (`from test import audiotests`, `from test.x import y`)."""
    found = []
    for names, frm, imp in _HELPER.findall(text):
        found += [n.strip() for n in names.split(",")] if names else [frm or imp]
    return sorted({n for n in found if n and n != "support"})


def _git_commit(root: Path) -> str | None:
    if not (root / ".git").exists():
        return None
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip() or None if out.returncode == 0 else None


def _tree_hash(root: Path, files: list[str]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + (root / rel).read_bytes())
    return h.hexdigest()[:16]


def fetch_pypi(name: str, version: str | None = None) -> Source:
    """A PyPI package's source distribution (pinned by PINNED when no version is given), unpacked in the cache."""
    pinned_version, pinned_sha = PINNED.get(name, (None, None))
    version = version or pinned_version
    if version is None:
        raise ValueError(f"no version for {name}: give NAME==VERSION (pinned: {', '.join(PINNED)})")
    home = mining_home()
    unpacked = home / "src" / f"{name}-{version}"
    sdists = home / "sdists"
    if not unpacked.is_dir():
        sdists.mkdir(exist_ok=True)
        archive = _download_sdist(name, version, pinned_sha if version == pinned_version else None, sdists)
        tmp = unpacked.with_name(unpacked.name + ".part")
        shutil.rmtree(tmp, ignore_errors=True)
        _unpack(archive, tmp)
        tops = [p for p in tmp.iterdir() if p.is_dir()]
        (tops[0] if len(tops) == 1 else tmp).rename(unpacked)  # an sdist holds one folder, NAME-VERSION/
        shutil.rmtree(tmp, ignore_errors=True)
    archive = _sdist(sdists, name, version)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    return Source.local(unpacked, name, version, f"pypi:{name}=={version} sdist sha256:{digest}")


def _download_sdist(name: str, version: str, sha256: str | None, into: Path) -> Path:
    """The sdist's archive from the index's simple page (PEP 503), its sha256 checked (the pinned one if given,
    else the index's), written whole or not at all."""
    import urllib.request

    page_url = f"{INDEX}/{re.sub(r'[-_.]+', '-', name).lower()}/"
    with urllib.request.urlopen(page_url, timeout=60) as r:
        page = r.read().decode()
    stem = "[-_.]+".join(re.escape(part) for part in re.split(r"[-_.]+", name))
    archive = rf"{stem}-{re.escape(version)}\.(?:tar\.gz|zip)"
    links = re.findall(rf'href="([^"]*/({archive})#sha256=([0-9a-f]{{64}}))"', page, re.I)
    if not links:
        raise RuntimeError(f"no sdist of {name}=={version} on {page_url}")
    url, filename, listed = links[0]
    want = sha256 or listed
    with urllib.request.urlopen(url.split("#", 1)[0], timeout=300) as r:
        data = r.read()
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        raise RuntimeError(f"{filename}: sha256 {got}, expected {want} ({'pinned' if sha256 else 'the index'})")
    part = into / (filename + ".part")
    part.write_bytes(data)
    return part.rename(into / filename)


def _sdist(folder: Path, name: str, version: str) -> Path:
    stem = "[-_.]+".join(re.escape(part) for part in re.split(r"[-_.]+", name))
    for p in sorted(folder.iterdir()):
        if re.match(rf"(?i){stem}-{re.escape(version)}\.(tar\.gz|zip|tar\.bz2)$", p.name):
            return p
    raise FileNotFoundError(f"no sdist of {name}=={version} in {folder}")


def _unpack(archive: Path, into: Path) -> None:
    into.mkdir(parents=True)
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            z.extractall(into)
    else:
        with tarfile.open(archive) as t:
            t.extractall(into, filter="data")


def _deb_version(package: str) -> str:
    out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def fetch_stdlib(stdlib: Path | None = None) -> Source:
    """The standard library's top-level pure-Python modules paired with their tests from Debian's test suite."""
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = stdlib or Path(f"/usr/lib/python{ver}")
    package = f"libpython{ver}-testsuite"
    home = mining_home() / "debian"
    home.mkdir(exist_ok=True)
    debs = sorted(home.glob(f"{package}_*.deb"))
    if not debs:
        got = subprocess.run(["apt-get", "download", package], cwd=home, capture_output=True, text=True)
        debs = sorted(home.glob(f"{package}_*.deb"))
        if not debs:
            raise RuntimeError(f"apt-get download {package} failed: {got.stderr.strip()[-500:]}")
    deb = debs[-1]
    test_version = deb.name.split("_")[1]
    unpacked = home / deb.stem
    if not unpacked.is_dir():
        subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked) + ".part"], check=True)
        Path(str(unpacked) + ".part").rename(unpacked)
    test_dir = unpacked / "usr" / "lib" / f"python{ver}" / "test"
    stdlib_version = _deb_version(f"libpython{ver}-stdlib")
    root = mining_home() / "src" / f"stdlib-{stdlib_version}-tests-{test_version}"
    pairs: dict[str, list[str]] = {}
    for mod in sorted(stdlib.glob("*.py")):
        test = test_dir / f"test_{mod.stem}.py"
        if mod.stem in STDLIB_SKIP or mod.stem.startswith("_") or not test.is_file():
            continue
        root.mkdir(parents=True, exist_ok=True)
        helpers = [(test_dir / f"{h}.py", root / "test" / f"{h}.py") for h in _test_helpers(test.read_text())]
        for src, dst in [(mod, root / mod.name), (test, root / test.name), *helpers]:
            if src.is_file() and not dst.exists():
                dst.parent.mkdir(exist_ok=True)
                shutil.copyfile(src, dst)
        pairs[mod.name] = [test.name]
    # The work dir's `test` package: the helpers a test imports from it, then the stdlib's own (test.support).
    (root / "test").mkdir(parents=True, exist_ok=True)
    (root / "test" / "__init__.py").write_text(f"__path__.append({str(stdlib / 'test')!r})\n")
    origin = f"debian:libpython{ver}-stdlib={stdlib_version} + {package}={test_version} ({deb.name})"
    return Source(
        "stdlib",
        f"{stdlib_version} (tests {test_version})",
        origin,
        root,
        code=sorted(pairs),
        tests=sorted(t for ts in pairs.values() for t in ts),
        pairs=pairs,
        ship_all=False,
    )


def resolve(spec: str) -> Source:
    """A source from what the command line names: `stdlib`, `pypi:NAME[==VERSION]`, a PINNED name, or a folder."""
    if spec == "stdlib":
        return fetch_stdlib()
    if spec.startswith("pypi:") or spec in PINNED:
        name, _, version = spec.removeprefix("pypi:").partition("==")
        return fetch_pypi(name, version or None)
    path = Path(spec)
    if not path.is_dir():
        raise FileNotFoundError(f"{spec}: not a folder, `stdlib`, `pypi:NAME==VERSION` or one of {', '.join(PINNED)}")
    return Source.local(path)
