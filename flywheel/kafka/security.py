"""A broker's security material and settings (infra.kafka_auth says who may do what):

    <dir>/credentials.json   one SCRAM password per principal (the roles, `admin`, and the nodes' own `broker`)
    <dir>/ca.pem, ca.key     the CA clients check the brokers against, and its key (it issues the node certificates)
    <dir>/node-<host>.pem    a node's key and certificate for its address, issued when a broker first listens there

Made once, before the first `kafka-storage format`, which writes the SCRAM credentials into the KRaft metadata
(`--add-scram`). Brokers started with one directory share its principals: a cluster's nodes, or every broker an
operator launches with $FLYWHEEL_KAFKA_SECURITY_DIR set (the test session's). The directory is 0700, its files 0600.

Listeners: CLIENT (clients and inter-broker replication) takes SCRAM-SHA-512; CONTROLLER takes PLAIN for the
principal `broker` only, from a static list in the broker's JAAS settings, because KRaft controllers cannot check
SCRAM (its credentials live in the metadata the controllers serve). Both run over TLS unless `tls` is off, and
StandardAuthorizer denies whatever no ACL allows; the ACLs are applied once the broker answers (apply_acls).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from infra import kafka_auth

CREDENTIALS = "credentials.json"


@dataclass
class Security:
    dir: Path
    passwords: dict[str, str]  # principal -> SCRAM (and, for `broker`, PLAIN) password
    tls: bool

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    def node_pem(self, host: str) -> Path:
        """The key and certificate of a node listening on `host` (issued by the CA on first use)."""
        path = self.dir / f"node-{host}.pem"
        if not path.exists():
            _write(path, _issue(self.dir, host))
        return path

    def client_config(self, role: str) -> dict:
        """kafka-python's keyword arguments for `role` (as infra.kafka_auth.client_config builds them)."""
        cfg: dict[str, object] = {
            "security_protocol": "SASL_SSL" if self.tls else "SASL_PLAINTEXT",
            "sasl_mechanism": kafka_auth.MECHANISM,
            "sasl_plain_username": role,
            "sasl_plain_password": self.passwords[role],
        }
        if self.tls:
            cfg.update(ssl_cafile=str(self.ca), ssl_check_hostname=True)
        return cfg

    def client_env(self, role: str) -> dict[str, str]:
        """What a process acting as `role` gets in its environment."""
        if role not in self.passwords:
            raise ValueError(f"no Kafka principal {role!r}; the roles are {', '.join(kafka_auth.ROLES)}")
        return kafka_auth.env(role, self.passwords[role], str(self.ca) if self.tls else None)


def create_security(directory: Path, tls: bool = True) -> Security:
    """New passwords for every principal and, with tls, a CA."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    passwords = {p: secrets.token_hex(16) for p in (kafka_auth.BROKER, *kafka_auth.ROLES)}
    if tls:
        ca_pem, key_pem = _new_ca()
        _write(directory / "ca.key", key_pem)
        _write(directory / "ca.pem", ca_pem)
    _write(directory / CREDENTIALS, json.dumps({"passwords": passwords, "tls": tls}, indent=1).encode())
    return Security(directory, passwords, tls)


def load_security(directory: Path) -> Security | None:
    f = Path(directory) / CREDENTIALS
    if not f.exists():
        return None
    data = json.loads(f.read_text())
    return Security(Path(directory), data["passwords"], data["tls"])


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


_TEN_YEARS = dt.timedelta(days=3650)


def _new_ca() -> tuple[bytes, bytes]:
    """(certificate, PKCS#8 key) of a new CA in PEM: EC P-256, ten years."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flywheel kafka CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + _TEN_YEARS)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(  # keyCertSign and cRLSign only
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return ca.public_bytes(pem), key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _issue(directory: Path, host: str) -> bytes:
    """A node's PKCS#8 key and certificate chain for `host` (an address or a name), signed by the directory's CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey), "the CA's key is the EC key _new_ca made"
    name: x509.GeneralName
    try:
        name = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        name = x509.DNSName(host)
    now = dt.datetime.now(dt.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    node = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"flywheel kafka node {host}")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + _TEN_YEARS)
        .add_extension(x509.SubjectAlternativeName([name]), critical=False)
        # A node is a server to clients and a client of the other nodes (replication, the controller quorum).
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return key_pem + node.public_bytes(pem) + ca.public_bytes(pem)


def format_args(sec: Security) -> list[str]:
    """`kafka-storage format` arguments that write every principal's SCRAM credential into the metadata."""
    out = []
    for name, password in sec.passwords.items():
        out += ["--add-scram", f"{kafka_auth.MECHANISM}=[name={name},password={password}]"]
    return out


def server_properties(sec: Security, host: str, port: int, cport: int) -> str:
    """The listener, authentication and authorizer lines of server.properties."""
    proto = "SASL_SSL" if sec.tls else "SASL_PLAINTEXT"
    pw = sec.passwords[kafka_auth.BROKER]
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
    plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
    lines = [
        f"listeners=CLIENT://{host}:{port},CONTROLLER://{host}:{cport}",
        f"advertised.listeners=CLIENT://{host}:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=CLIENT",
        f"listener.security.protocol.map=CLIENT:{proto},CONTROLLER:{proto}",
        f"sasl.enabled.mechanisms={kafka_auth.MECHANISM}",
        f"sasl.mechanism.inter.broker.protocol={kafka_auth.MECHANISM}",
        "sasl.mechanism.controller.protocol=PLAIN",
        f"listener.name.client.sasl.enabled.mechanisms={kafka_auth.MECHANISM}",
        f'listener.name.client.scram-sha-512.sasl.jaas.config={scram} required username="broker" password="{pw}";',
        "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
        f"listener.name.controller.plain.sasl.jaas.config={plain} required "
        f'username="broker" password="{pw}" user_broker="{pw}";',
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users=" + ";".join(f"User:{u}" for u in kafka_auth.SUPER_USERS),
        "allow.everyone.if.no.acl.found=false",
    ]
    if sec.tls:
        lines += [
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={sec.node_pem(host)}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={sec.ca}",
            "ssl.endpoint.identification.algorithm=https",
            "ssl.enabled.protocols=TLSv1.3",
            "ssl.protocol=TLSv1.3",
        ]
    return "\n".join(lines) + "\n"


def apply_acls(bootstrap: str, sec: Security) -> int:
    """Create every role's ACLs (creating one that exists changes nothing); returns how many were asked."""
    from kafka.admin import (
        ACL,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePattern,
        ResourceType,
    )

    kinds = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP, "cluster": ResourceType.CLUSTER}
    ops = {"read": ACLOperation.READ, "write": ACLOperation.WRITE, "describe": ACLOperation.DESCRIBE}
    acls = []
    for role, grants in kafka_auth.GRANTS.items():
        for g in grants:
            name = "kafka-cluster" if g.resource == "cluster" else g.name
            how = ACLResourcePatternType.PREFIXED if g.prefix else ACLResourcePatternType.LITERAL
            for op in g.ops:
                acls.append(
                    ACL(
                        f"User:{role}",
                        "*",
                        ops[op],
                        ACLPermissionType.ALLOW,
                        ResourcePattern(kinds[g.resource], name, how),
                    )
                )
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="flywheel-acls", **sec.client_config("admin"))
    try:
        result = admin.create_acls(acls)
    finally:
        admin.close()
    if result.get("failed"):
        raise RuntimeError(f"Kafka refused ACLs: {result['failed']}")
    return len(acls)
