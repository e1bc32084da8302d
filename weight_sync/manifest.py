"""The weights contract: a version's manifest, its ed25519 signature, and the checks a server applies.

A manifest names its version and base, whether it is a delta or a full snapshot, a digest of the model
config it belongs to, and every tensor: name, dtype, shape, its chunks (element span, encoding, size,
xxh3-128 of the compressed bytes) and the xxh3-128 of the rebuilt bytes. The trainer signs the canonical
JSON (sorted keys, no whitespace); servers hold only the public key. The Kafka announcement of a version
(`weights` topic) and of an activation (rollback) are defined here too.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from contracts import control
from weight_sync.codec import BIT_VIEWS, ChunkMeta

MANIFEST_SCHEMA = "flywheel.manifest.v1"
KINDS = ("delta", "full")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")  # tensor names: no path separators, no "..", no spaces


class ManifestError(ValueError):
    """A manifest that is malformed, unsigned, wrongly signed, or inconsistent with the model."""


@dataclass
class TensorEntry:
    name: str
    dtype: str
    shape: list[int]
    chunks: list[ChunkMeta]
    digest: str  # xxh3-128 of the rebuilt tensor bytes

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": self.shape,
            "digest": self.digest,
            "chunks": [c.to_json() for c in self.chunks],
        }

    @classmethod
    def from_json(cls, d: dict) -> "TensorEntry":
        return cls(
            name=d["name"],
            dtype=d["dtype"],
            shape=list(d["shape"]),
            digest=d["digest"],
            chunks=[ChunkMeta.from_json(c) for c in d["chunks"]],
        )


@dataclass
class Manifest:
    version: int
    base_version: int | None  # None for a full snapshot
    kind: str  # delta | full
    config_digest: str  # xxh3-128 of the model's canonical config.json
    tensors: list[TensorEntry]
    files: dict[str, str] = field(default_factory=dict)  # small side files (config, tokenizer): name -> digest
    created: float = field(default_factory=time.time)
    signer: str = ""  # key id of the signing key
    schema: str = MANIFEST_SCHEMA

    def to_json(self) -> dict:
        return {
            "schema": self.schema,
            "version": self.version,
            "base_version": self.base_version,
            "kind": self.kind,
            "config_digest": self.config_digest,
            "created": self.created,
            "signer": self.signer,
            "files": self.files,
            "tensors": [t.to_json() for t in self.tensors],
        }

    @property
    def base(self) -> int:
        """A delta's base version (a delta without one is refused when read)."""
        if self.base_version is None:
            raise ManifestError(f"v{self.version} is a full snapshot: it has no base")
        return self.base_version

    def changed_tensors(self) -> list[int]:
        """Indices of the tensors this version changes (a delta chunk with a changed element)."""
        return [i for i, t in enumerate(self.tensors) if any(c.changed for c in t.chunks)]

    def pack(self) -> list[tuple[int, int, ChunkMeta]]:
        """What the store's /versions/N/changed sends, in this order: every chunk (tensor index, chunk index,
        meta) of every changed tensor, its unchanged chunks included (an in-place apply reads whole tensors'
        chunk lists). The pack is these chunks' bytes back to back; each is checked by its digest."""
        return [(t, c, meta) for t in self.changed_tensors() for c, meta in enumerate(self.tensors[t].chunks)]

    def canonical(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, raw: bytes) -> "Manifest":
        try:
            d = json.loads(raw)
            if d.get("schema") != MANIFEST_SCHEMA:
                raise ManifestError(f"unknown manifest schema {d.get('schema')!r}")
            m = cls(
                version=d["version"],
                base_version=d["base_version"],
                kind=d["kind"],
                config_digest=d["config_digest"],
                created=d["created"],
                signer=d["signer"],
                files=dict(d.get("files", {})),
                tensors=[TensorEntry.from_json(t) for t in d["tensors"]],
            )
        except ManifestError:
            raise
        except (ValueError, KeyError, TypeError) as e:
            raise ManifestError(f"malformed manifest: {type(e).__name__}: {e}") from None
        m.check_shape()
        return m

    def check_shape(self) -> None:
        """Structural checks that need no model: names, dtypes, chunk spans, kinds, versions."""
        if not isinstance(self.version, int) or self.version < 0:
            raise ManifestError(f"bad version {self.version!r}")
        if self.kind not in KINDS:
            raise ManifestError(f"bad kind {self.kind!r}")
        if self.kind == "delta" and not (isinstance(self.base_version, int) and 0 <= self.base_version < self.version):
            raise ManifestError(f"delta {self.version} has a bad base {self.base_version!r}")
        if self.kind == "full" and self.base_version is not None:
            raise ManifestError("a full snapshot has no base")
        seen = set()
        for name in self.files:
            if not _NAME.match(name) or name in (".", ".."):
                raise ManifestError(f"bad file name {name!r}")
        for t in self.tensors:
            if not _NAME.match(t.name) or ".." in t.name:
                raise ManifestError(f"bad tensor name {t.name!r}")
            if t.name in seen:
                raise ManifestError(f"tensor {t.name} listed twice")
            seen.add(t.name)
            if t.dtype not in BIT_VIEWS:
                raise ManifestError(f"tensor {t.name}: unknown dtype {t.dtype!r}")
            if not all(isinstance(s, int) and s >= 0 for s in t.shape):
                raise ManifestError(f"tensor {t.name}: bad shape {t.shape}")
            pos = 0
            for c in t.chunks:
                if c.offset != pos or c.elems < 0 or c.encoding not in ("planes", "sparse") or c.size < 0:
                    raise ManifestError(f"tensor {t.name}: chunks do not tile it (at element {pos})")
                if not 0 <= c.changed <= c.elems:
                    raise ManifestError(f"tensor {t.name}: a chunk at element {pos} changes {c.changed} of {c.elems}")
                if c.encoding == "sparse" and self.kind == "full":
                    raise ManifestError(f"tensor {t.name}: a full snapshot cannot hold sparse chunks")
                pos += c.elems
            if pos != t.numel:
                raise ManifestError(f"tensor {t.name}: chunks cover {pos} of {t.numel} elements")

    def check_model(self, expected: dict[str, tuple[str, list[int]]], config_digest: str) -> None:
        """The manifest describes exactly the served model: same config, tensor names, dtypes and shapes."""
        if self.config_digest != config_digest:
            raise ManifestError(
                f"version {self.version} is for another model config "
                f"({self.config_digest[:12]} != {config_digest[:12]})"
            )
        names = {t.name for t in self.tensors}
        if names != set(expected):
            missing, extra = sorted(set(expected) - names), sorted(names - set(expected))
            raise ManifestError(
                f"version {self.version} tensors differ from the model: missing {missing[:3]}, unexpected {extra[:3]}"
            )
        for t in self.tensors:
            dtype, shape = expected[t.name]
            if t.dtype != dtype or list(t.shape) != list(shape):
                raise ManifestError(f"tensor {t.name}: {t.dtype}{t.shape} disagrees with the model's {dtype}{shape}")

    @property
    def nbytes_compressed(self) -> int:
        return sum(c.size for t in self.tensors for c in t.chunks)

    @property
    def nbytes_raw(self) -> int:
        import numpy as np

        return sum(t.numel * np.dtype(BIT_VIEWS[t.dtype]).itemsize for t in self.tensors)


# ------------------------------------------------------------------------------------------- signatures


def generate_key(private_path: Path, public_path: Path) -> str:
    """A new ed25519 key pair (PEM); the private key file is 0600. Returns the key id."""
    key = Ed25519PrivateKey.generate()
    private_path = Path(private_path)
    private_path.parent.mkdir(parents=True, exist_ok=True)
    private_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    private_path.chmod(0o600)
    Path(public_path).write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return key_id(key.public_key())


def key_id(public: Ed25519PublicKey) -> str:
    import hashlib

    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def load_private(path: Path) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ManifestError(f"{path} is not an ed25519 private key")
    return key


def load_public(path: Path) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key(Path(path).read_bytes())
    if not isinstance(key, Ed25519PublicKey):
        raise ManifestError(f"{path} is not an ed25519 public key")
    return key


def sign(manifest: Manifest, key: Ed25519PrivateKey) -> tuple[bytes, bytes]:
    """The canonical manifest bytes and their signature."""
    manifest.signer = key_id(key.public_key())
    body = manifest.canonical()
    return body, key.sign(body)


def verify(body: bytes, signature: bytes | None, public: Ed25519PublicKey) -> Manifest:
    """Parse a manifest only after its signature checks out."""
    if not signature:
        raise ManifestError("manifest is not signed")
    try:
        public.verify(signature, body)
    except InvalidSignature:
        raise ManifestError("manifest signature does not verify against the trainer's public key") from None
    return Manifest.parse(body)


# ------------------------------------------------------------------------------------------- announcements


def announcement(manifest: Manifest, manifest_url: str, manifest_digest: str) -> dict:
    """A new version on the `weights` topic (DESIGN.md: version, base_version, kind, location, digest, signer)."""
    return {
        "schema": control.SCHEMA,
        "type": "version",
        "version": manifest.version,
        "base_version": manifest.base_version,
        "kind": manifest.kind,
        "manifest": manifest_url,
        "manifest_digest": manifest_digest,
        "signer": manifest.signer,
        "ts": time.time(),
    }
