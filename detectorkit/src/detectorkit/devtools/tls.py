"""A certificate authority for a test broker's TLS listener and its clients' certificates, as PEM
files laid out the way Strimzi's operators make them: the user's `user.crt` and `user.key`, the
cluster's `ca.crt`. Made with `cryptography` (detectorkit's test extra)."""

from __future__ import annotations

import datetime
import ipaddress
import pathlib
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Authority:
    """A self-signed CA in `folder` (ca.crt); `issue` signs a certificate for a name."""

    folder: pathlib.Path
    _key: Any = field(default=None, init=False, repr=False)
    _cert: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.folder.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "detectorkit test CA")])
        self._cert = (
            self._builder(name, self._key.public_key())
            .issuer_name(name)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, _sha256())
        )
        self.ca_location.write_bytes(_pem(self._cert))

    @property
    def ca_location(self) -> pathlib.Path:
        return self.folder / "ca.crt"

    def issue(self, common_name: str, folder: pathlib.Path, host: str | None = None) -> tuple[pathlib.Path, pathlib.Path]:
        """A certificate for CN=`common_name` (and the IP `host`, for a server) signed by this CA,
        as `folder`/user.crt and user.key (PKCS#8, unencrypted, as Kafka's PEM key stores want)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        folder.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        builder = self._builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]), key.public_key()).issuer_name(self._cert.subject)
        if host is not None:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
        cert = builder.sign(self._key, _sha256())
        cert_path, key_path = folder / "user.crt", folder / "user.key"
        cert_path.write_bytes(_pem(cert))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        key_path.chmod(0o600)
        return cert_path, key_path

    @staticmethod
    def _builder(subject, public_key):
        from cryptography import x509

        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
        )


def _sha256():
    from cryptography.hazmat.primitives import hashes

    return hashes.SHA256()


def _pem(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)
