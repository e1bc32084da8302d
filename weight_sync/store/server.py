"""The version store: a directory of published versions, and its HTTP face.

    <root>/versions/<N>/manifest.json     canonical manifest bytes
                        manifest.sig      ed25519 signature of those bytes
                        chunks/<t>.<c>    compressed chunk c of tensor t (t: index in the manifest)
                        files/<name>      side files (config.json, tokenizer files)
    <root>/.staging-<N>-*/                a version being written; renamed into versions/ when complete
    <root>/head/                          the publisher's full copy of the newest version (delta base)
    <root>/activations.jsonl              rollbacks and pins, in order (also announced on Kafka)
    <root>/announcements.jsonl            every other control record sent (new versions): its seq and version
    <root>/control_seq                    the last control-record sequence number handed out
    <root>/announced                      the newest version whose announcement the broker acknowledged

Sequence numbers never go back: the next one is above the counter and above every number either ledger
names, so a lost or stale counter cannot hand out a number the agents have passed (they would drop that
record as a replay, silently). Ledgers are written before their record is sent (weight_sync.store.ledger).

Chunk and file paths are derived from indices and validated names, never taken from a manifest, so
nothing a manifest says can reach outside the store. A version is visible only after the rename, which
happens after every chunk, file and the signed manifest are on disk. Over HTTP (Store.app) each of these
is GET /versions/N/<piece>, and GET /versions/N/changed sends every chunk an in-place apply needs
(Manifest.pack) back to back, in one response.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import time
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from infra.config import nested, option
from infra.files import fsync_path, write_durably
from weight_sync import fleet_credential
from weight_sync.manifest import Manifest
from weight_sync.store import ledger
from weight_sync.store.metrics import GateVerdicts, VersionSizes
from weight_sync.store.relay import StoreRelay
from weight_sync.store.tracker import TrackerConfig

_CHUNK = re.compile(r"^\d{1,6}\.\d{1,6}$")
_FILE = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")
_RANGE = re.compile(r"bytes=(\d{1,15})-")
ANNOUNCEMENTS = "announcements.jsonl"


@dataclass
class ServerConfig:
    """`flywheel weights serve`'s options (infra.config: one flag per option)."""

    host: str = option("127.0.0.1", help="address to listen on")
    port: int = option(8100, help="port to listen on")
    token: str | None = option(
        None, env=fleet_credential.ENV, cli=False, repr=False, help="the fleet read credential every request must show"
    )  # environment only (DESIGN: Trust)
    tracker: TrackerConfig = nested(TrackerConfig)


def chunk_name(tensor_index: int, chunk_index: int) -> str:
    return f"{tensor_index}.{chunk_index}"


def version_number(name: str) -> int | None:
    """A version's name in a URL, a directory or a bucket listing as its number; None if it is not one.
    ASCII digits only: str.isdigit also takes "²" (int() refuses it) and "٣" (an alias of 3)."""
    return int(name) if name.isascii() and name.isdigit() and len(name) <= 18 else None


def valid_piece(piece: str) -> bool:
    """What a store or a relay serves of a version: manifest.json, manifest.sig, chunks/T.C, files/NAME."""
    if piece in ("manifest.json", "manifest.sig"):
        return True
    kind, _, name = piece.partition("/")
    if kind == "chunks":
        return bool(_CHUNK.fullmatch(name))
    return kind == "files" and bool(_FILE.fullmatch(name)) and name not in (".", "..")


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)
        (self.root / "versions").mkdir(parents=True, exist_ok=True)

    def version_dir(self, version: int) -> Path:
        return self.root / "versions" / str(int(version))

    def versions(self) -> list[int]:
        return sorted(v for p in (self.root / "versions").iterdir() if (v := version_number(p.name)) is not None)

    def latest(self) -> int | None:
        v = self.versions()
        return v[-1] if v else None

    def manifest(self, version: int) -> Manifest:
        return Manifest.parse((self.version_dir(version) / "manifest.json").read_bytes())

    def staging(self, version: int) -> Path:
        import tempfile

        if self.version_dir(version).exists():
            raise FileExistsError(f"version {version} is already published")
        d = Path(tempfile.mkdtemp(prefix=f".staging-{version}-", dir=self.root))
        (d / "chunks").mkdir()
        (d / "files").mkdir()
        return d

    def commit(self, staging: Path, version: int) -> Path:
        """Make a staged version visible (atomic rename), everything in it durable first: every file (chunks,
        side files, manifest and signature) and each directory's entries, so a machine crash after the rename
        can never show a version whose manifest is empty (retention's chain() would then refuse every later
        publish, and agents would reject the version for good)."""
        for d in (staging / "chunks", staging / "files", staging):
            for f in d.iterdir():
                if f.is_file():
                    fsync_path(f)
            fsync_path(d)
        if not self.versions() and self.announced() is None:
            # This store's first version: its announcements are recorded from here on (-1: none yet), so a
            # first version the broker never got is announced later, not taken for an old store's newest.
            self.mark_announced(-1)
        target = self.version_dir(version)
        os.replace(staging, target)
        fsync_path(target.parent)
        return target

    def chain(self, version: int) -> list[int]:
        """The versions needed to rebuild `version`: back to its full snapshot, oldest first."""
        out = []
        v: int | None = version
        while v is not None:
            out.append(v)
            m = self.manifest(v)
            v = m.base_version if m.kind == "delta" else None
        return out[::-1]

    def retain(self, keep: int, protect: AbstractSet[int] = frozenset()) -> list[int]:
        """Delete old versions: keep the newest `keep`, the protected ones, and everything their chains need."""
        versions = self.versions()
        wanted = set(versions[-keep:]) | (set(protect) & set(versions))
        needed = set()
        for v in wanted:
            needed.update(self.chain(v))
        removed = [v for v in versions if v not in needed]
        for v in removed:
            shutil.rmtree(self.version_dir(v), ignore_errors=True)
        for stale in self.root.glob(".staging-*"):  # publishes that died half-way
            if time.time() - stale.stat().st_mtime > 3600:
                shutil.rmtree(stale, ignore_errors=True)
        return removed

    @contextlib.contextmanager
    def sequence(self, floor=None):
        """The next control-record sequence number, held under a lock until the caller has sent its record,
        so that the weights topic's order is the sequence's order. A number is never handed out twice,
        even when its send fails (it may have gone through), nor one at or below any number a ledger names:
        the counter lost, damaged or restored from an older copy, the floor is still every record sent.
        `floor()`: what the weights topic says was used (weight_sync.topic_floor), asked when the counter is
        gone (a store rebuilt beside a topic that remembers); what it raises propagates, no number handed out."""
        import fcntl

        with open(self.root / "control_seq.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.root / "control_seq"
            try:
                last = int(path.read_text())
            except (OSError, ValueError):  # lost or damaged: the ledgers, and the topic, say what was used
                last = floor() if floor is not None else 0
            last = max(last, self.used_seq())
            write_durably(path, str(last + 1).encode())  # the file and its directory, before the number is used
            yield last + 1

    def used_seq(self) -> int:
        """The highest sequence number the ledgers name (0: none)."""
        return max(ledger.max_seq(self.root / "activations.jsonl"), ledger.max_seq(self.root / ANNOUNCEMENTS))

    def announced(self) -> int | None:
        """The newest version known to be on the weights topic (None: none yet, or a store from before)."""
        try:
            return int((self.root / "announced").read_text())
        except (OSError, ValueError):
            return None

    def mark_announced(self, version: int) -> None:
        """Record that `version` is on the weights topic (under the sequence lock: never moves backwards).
        -1: a new store, which records its announcements from its first version on."""
        import fcntl

        with open(self.root / "control_seq.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            done = self.announced()
            if done is not None and done >= version:
                return
            write_durably(self.root / "announced", str(int(version)).encode())

    def unannounced(self) -> list[int]:
        """Versions committed here whose announcement never reached the broker (the publisher died, or the
        broker was away, between the commit and the send): without one, no agent ever switches to them.
        Not those a later decision (an SRE's rollback, activate or pin) has passed over: announcing them
        now would undo it; nor those the eval gate blocked (weight_sync.gate), until an SRE overrides it.
        A store from before the record (versions, no `announced` file; a new store writes
        -1 with its first version): nothing (its newest is taken as announced)."""
        versions, done = self.versions(), self.announced()
        if done is None:
            if versions:
                self.mark_announced(versions[-1])
            return []
        decided = max(
            (a.get("ts", 0.0) for a in self.activations() if a.get("type") in ("activate", "rollback", "pin", "unpin")),
            default=0.0,
        )
        held = self.gate_blocked()
        return [v for v in versions if v > done and v not in held and self.version_dir(v).stat().st_mtime > decided]

    def record_activation(self, record: dict) -> None:
        """A decision (rollback, activate, pin, canary...), before it is sent; under the sequence lock."""
        ledger.append(self.root / "activations.jsonl", record)

    def record_announcement(self, record: dict) -> None:
        """Any other control record (a new version's announcement), before it is sent; under the sequence lock.
        Only what numbering needs: the full record is on the weights topic."""
        keep = ("seq", "type", "version", "ts")
        ledger.append(self.root / ANNOUNCEMENTS, {k: record[k] for k in keep if k in record})

    def decided(self) -> set[int]:
        """Versions the fleet's standing decisions name (folded like an agent folds the weights topic): the
        pinned version while a pin holds, the version last activated or promoted, the stable version a
        rollback returned to; and the newest version announced (where agents went when no decision named
        another since: with the eval gate blocking version after version, it is no longer among the newest in the
        store). Retention never deletes these, however old they are."""
        pinned, stable = None, set()
        for r in sorted(self.activations(), key=lambda a: seq if isinstance(seq := a.get("seq"), int) else 0):
            kind, v = r.get("type"), r.get("version")
            if kind == "pin" and isinstance(v, int):
                pinned = v
            elif kind == "unpin":
                pinned = None
            elif kind in ("activate", "promote") and isinstance(v, int):
                stable = {v}
            elif kind == "rollback" and isinstance(r.get("stable"), int):
                stable = {r["stable"]}
        announced = self.announced()
        sent = {announced} if announced is not None and announced >= 0 else set()
        return stable | sent | ({pinned} if pinned is not None else set())

    def gate_verdicts(self) -> dict[int, dict]:
        """Each version's last eval-gate record (verdict pass, block or override: weight_sync.gate)."""
        return {
            a["version"]: a for a in self.activations() if a.get("type") == "gate" and isinstance(a.get("version"), int)
        }

    def gate_blocked(self) -> set[int]:
        """Versions the eval gate blocked and no SRE has overridden."""
        return {v for v, a in self.gate_verdicts().items() if a.get("verdict") == "block"}

    def activations(self) -> list[dict]:
        """The decisions recorded, in order; a line that cannot be read (a torn append) is skipped, never fatal."""
        return ledger.read(self.root / "activations.jsonl")

    # ------------------------------------------------------------------ HTTP
    def app(self, tracker: TrackerConfig | None = None, token: str | None = None) -> web.Application:
        """GET /versions, /versions/N/manifest.json|manifest.sig, /versions/N/chunks/T.C, /versions/N/files/NAME,
        /versions/N/changed (the chunks an in-place apply needs, in one response);
        /metrics and /stats (bytes sent, relay redirects). File responses honour Range requests, so an
        interrupted download resumes. An agent with a relay may be sent to a peer instead
        (weight_sync.store.relay). Every request but /metrics needs the fleet read credential `token`
        (weight_sync.fleet_credential; ValueError without one)."""
        relay = StoreRelay(self.versions, tracker)
        guard = fleet_credential.middleware(token, "the weight store", relay.refuse)
        relay.registry.register(VersionSizes(self))  # flywheel_store_version_bytes{version,form,kind}
        relay.registry.register(GateVerdicts(self))  # flywheel_gate_blocked{version}, _verdicts_total, _seconds

        def version_of(request) -> tuple[int, Path]:
            v = version_number(request.match_info["version"])
            if v is None:
                raise web.HTTPNotFound(reason="bad version")
            d = self.version_dir(v)
            if not d.is_dir():
                raise web.HTTPNotFound(reason=f"no version {v}")
            return v, d

        async def versions(request):
            relay.count_as(request, "index")
            return web.json_response({"versions": self.versions(), "activations": self.activations()})

        async def manifest(request):
            name = request.match_info["name"]
            if name not in ("manifest.json", "manifest.sig"):
                raise web.HTTPNotFound()
            v, d = version_of(request)
            return relay.answer(request, "manifest", v, name, d / name)

        async def chunk(request):
            name = request.match_info["name"]
            if not _CHUNK.match(name):
                raise web.HTTPNotFound(reason="bad chunk name")
            v, d = version_of(request)
            return relay.answer(request, "chunk", v, f"chunks/{name}", d / "chunks" / name)

        def pack_of(d: Path, v: int) -> tuple[list[Path], list[int]]:
            manifest = self.manifest(v)
            if manifest.kind != "delta":  # a full snapshot's "changes" are the whole model: chunk by chunk
                raise web.HTTPNotFound(reason=f"v{v} is not a delta")
            pieces = [d / "chunks" / chunk_name(t, c) for t, c, _ in manifest.pack()]
            return pieces, [p.stat().st_size for p in pieces]

        async def changed(request):
            """Every chunk an in-place apply needs (Manifest.pack), back to back in one response: one request
            instead of one per chunk. `Range: bytes=N-` resumes it. Never redirected to a peer."""
            v, d = version_of(request)
            loop = asyncio.get_running_loop()
            pieces, sizes = await loop.run_in_executor(None, pack_of, d, v)  # parse and stat off the loop
            total, start = sum(sizes), 0
            if "Range" in request.headers:
                m = _RANGE.fullmatch(request.headers["Range"].strip())
                if m is None or int(m[1]) >= total:
                    raise web.HTTPRequestRangeNotSatisfiable(headers={"Content-Range": f"bytes */{total}"})
                start = int(m[1])
            response = web.StreamResponse(status=206 if start else 200)
            response.content_length = total - start
            response.content_type = "application/octet-stream"
            if start:
                response.headers["Content-Range"] = f"bytes {start}-{total - 1}/{total}"
            if request.method == "HEAD":
                return response
            relay.count_as(request, "chunk")
            await response.prepare(request)
            at = 0
            for path, size in zip(pieces, sizes):
                if at + size > start:
                    data = await loop.run_in_executor(None, path.read_bytes) if size > 1 << 20 else path.read_bytes()
                    if len(data) != size:  # changed under us: cut the response short, the client retries
                        raise ConnectionResetError(f"{path} changed while sent")
                    await response.write(memoryview(data)[max(0, start - at) :])
                at += size
            await response.write_eof()
            return response

        async def side_file(request):
            name = request.match_info["name"]
            if not _FILE.match(name) or name in (".", ".."):
                raise web.HTTPNotFound(reason="bad file name")
            v, d = version_of(request)
            return relay.answer(request, "file", v, f"files/{name}", d / "files" / name)

        app = web.Application(middlewares=[guard])
        app.add_routes(
            [
                web.get("/versions", versions),
                web.get("/versions/{version}/changed", changed),
                web.get("/versions/{version}/{name}", manifest),
                web.get("/versions/{version}/chunks/{name}", chunk),
                web.get("/versions/{version}/files/{name}", side_file),
            ]
        )
        relay.install(app)
        return app
