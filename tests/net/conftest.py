"""Real network fixtures on loopback: a private CA, the chaos upstream over TLS and mutual
TLS, a forward proxy (plain and with Basic credentials), an HTTP/2 upstream.

The PKI is made once a session; every server is fresh for each test (its own port,
recorded requests and ``times=`` counters). Point a gateway at them with:

- ``tls_chaos.base_url`` / ``mtls_chaos.base_url`` / ``h2_upstream.base_url``
  (``https://127.0.0.1:PORT/v1``), trusting ``ca_cert_path`` (``tls.ca_file``);
  for ``mtls_chaos`` also ``client_cert_path`` and ``client_key_path``
  (``tls.client_cert``, ``tls.client_key``), or ``pki.client_pem`` (both in one file);
- ``proxy.url`` (``http://127.0.0.1:PORT``), ``auth_proxy.url_with_credentials``
  (``http://gateway:s3cr%2Ft%40proxy@127.0.0.1:PORT``), ``tls_proxy.url``
  (``https://``, its certificate from the same CA).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.chaos import ChaosUpstream, running_chaos_upstream
from gateway.chaos.runner import serving_in_thread
from tests.net.h2_upstream import H2Upstream
from tests.net.pki import Pki, make_pki
from tests.net.proxy import ForwardProxy

PROXY_USER = "gateway"
PROXY_PASSWORD = "s3cr/t@proxy"  # needs percent-encoding in a URL, as real ones do


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def ca_cert_path(pki: Pki) -> str:
    """The private CA's certificate (PEM): what verifies every server here."""
    return str(pki.ca_cert)


@pytest.fixture(scope="session")
def client_cert_path(pki: Pki) -> str:
    """The client certificate chain (PEM) ``mtls_chaos`` accepts."""
    return str(pki.client_cert)


@pytest.fixture(scope="session")
def client_key_path(pki: Pki) -> str:
    return str(pki.client_key)


@pytest.fixture
def tls_chaos(pki: Pki) -> Iterator[ChaosUpstream]:
    """The chaos upstream over TLS, its certificate (127.0.0.1, localhost) from the CA."""
    with running_chaos_upstream(ssl=pki.server_context()) as upstream:
        yield upstream


@pytest.fixture
def mtls_chaos(pki: Pki) -> Iterator[ChaosUpstream]:
    """The chaos upstream over TLS, refusing clients without a certificate from the CA."""
    with running_chaos_upstream(ssl=pki.server_context(require_client_cert=True)) as upstream:
        yield upstream


@pytest.fixture
def proxy() -> Iterator[ForwardProxy]:
    """A forward proxy without authentication; set ``proxy.mode`` to make it misbehave."""
    with serving_in_thread(ForwardProxy(), "forward-proxy") as running:
        yield running


@pytest.fixture
def auth_proxy() -> Iterator[ForwardProxy]:
    """A forward proxy wanting Basic ``PROXY_USER``:``PROXY_PASSWORD``."""
    server = ForwardProxy(credentials=(PROXY_USER, PROXY_PASSWORD))
    with serving_in_thread(server, "auth-proxy") as running:
        yield running


@pytest.fixture
def tls_proxy(pki: Pki) -> Iterator[ForwardProxy]:
    """An ``https://`` forward proxy (TLS to the proxy itself), its certificate from the CA."""
    with serving_in_thread(ForwardProxy(ssl=pki.server_context()), "tls-proxy") as running:
        yield running


@pytest.fixture
def h2_upstream(pki: Pki) -> Iterator[H2Upstream]:
    """The chaos answers over HTTP/2 (TLS, ALPN h2 only), its certificate from the CA."""
    server = H2Upstream(ssl=pki.server_context(alpn=["h2"]))
    with serving_in_thread(server, "h2-upstream") as running:
        yield running
