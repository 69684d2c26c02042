"""A private PKI for the network tests: a CA, a server certificate, a client certificate.

``trustme`` makes them in memory; ``make_pki`` writes each to a PEM file too, as a
gateway config names them (``tls.ca_file``, ``tls.client_cert``, ``tls.client_key``).
A second CA, ``stranger``, signed nothing the servers trust: its client certificate
is what an mTLS server must refuse, its CA file what cannot verify the servers.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import trustme

SERVER_IDENTITIES = ("127.0.0.1", "localhost", "::1")
CLIENT_IDENTITY = "gateway@client.test"


@dataclass(frozen=True)
class Pki:
    ca: trustme.CA
    server: trustme.LeafCert  # 127.0.0.1, localhost, ::1
    client: trustme.LeafCert  # for mutual TLS
    ca_cert: Path  # the CA certificate (PEM): what a client trusts
    server_cert: Path  # the server's chain (PEM)
    server_key: Path
    client_cert: Path  # the client's chain (PEM)
    client_key: Path
    client_pem: Path  # the client's chain and key in one file
    stranger_ca_cert: Path  # another CA's certificate: verifies none of the servers
    stranger_client_pem: Path  # a client chain and key signed by that other CA

    def server_context(
        self, *, require_client_cert: bool = False, alpn: Sequence[str] = ()
    ) -> ssl.SSLContext:
        """A server context presenting ``server``; with ``require_client_cert``, mutual TLS:
        only clients with a certificate signed by ``ca`` get through the handshake."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.server.configure_cert(context)
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=str(self.ca_cert))
        if alpn:
            context.set_alpn_protocols(list(alpn))
        return context

    def client_context(self, *, client_cert: bool = False, http2: bool = False) -> ssl.SSLContext:
        """A client context trusting ``ca`` (and nothing else); with ``client_cert``, one that
        presents the client certificate."""
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        if client_cert:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        if http2:
            context.set_alpn_protocols(["h2", "http/1.1"])
        return context


def _write(path: Path, *blobs: bytes) -> Path:
    path.write_bytes(b"".join(blobs))
    return path


def make_pki(directory: Path) -> Pki:
    """A fresh CA and its certificates, the PEM files written under ``directory``."""
    ca = trustme.CA(organization_name="resumable-gateway tests")
    server = ca.issue_cert(*SERVER_IDENTITIES)
    client = ca.issue_cert(CLIENT_IDENTITY, common_name="gateway test client")
    stranger = trustme.CA(organization_name="a stranger")
    intruder = stranger.issue_cert(CLIENT_IDENTITY, common_name="not our client")
    client_chain = b"".join(blob.bytes() for blob in client.cert_chain_pems)
    return Pki(
        ca=ca,
        server=server,
        client=client,
        ca_cert=_write(directory / "ca.pem", ca.cert_pem.bytes()),
        server_cert=_write(
            directory / "server.pem", *(blob.bytes() for blob in server.cert_chain_pems)
        ),
        server_key=_write(directory / "server.key", server.private_key_pem.bytes()),
        client_cert=_write(directory / "client.pem", client_chain),
        client_key=_write(directory / "client.key", client.private_key_pem.bytes()),
        client_pem=_write(
            directory / "client-with-key.pem", client_chain, client.private_key_pem.bytes()
        ),
        stranger_ca_cert=_write(directory / "stranger-ca.pem", stranger.cert_pem.bytes()),
        stranger_client_pem=_write(
            directory / "stranger-client.pem",
            *(blob.bytes() for blob in intruder.cert_chain_pems),
            intruder.private_key_pem.bytes(),
        ),
    )
