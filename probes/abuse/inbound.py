"""Probes on the client side of the wire: paths that try to leave the upstream (1), huge
request heads (5), slow clients (6) and malformed requests (9)."""

from __future__ import annotations

import asyncio
import collections
import re
import time
from collections.abc import Iterator
from typing import Any

from probes.abuse.lab import CLIENT_KEY, KINDS, MB, SECRET, Gateway, Lab, ProbeResult, observed
from probes.abuse.net import RawResponse, exchange, request_head

TRACEBACK = re.compile(rb"Traceback \(most recent call last\)|File \"[^\"]+\", line \d+")
AUTH = ("authorization", f"Bearer {CLIENT_KEY}")


def openai_error(response: RawResponse) -> dict[str, Any] | None:
    """The ``error`` object of an OpenAI-shaped error body, or None."""
    body = response.json()
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str) and "type" in error:
        return error
    return None


# -- 1: SSRF ------------------------------------------------------------------------------

_UNSAFE_UPSTREAM_PATH = re.compile(r"//|/\.\.?(/|$)|@|\\|%2f|%5c|%25|%2e", re.IGNORECASE)


def ssrf_requests(victim: int) -> list[tuple[str, bytes]]:
    """(what, request) pairs: each tries to make the gateway talk to the victim."""
    v = f"127.0.0.1:{victim}"
    paths = [
        f"/v1%2f@{v}/x",
        f"/v1/%2f@{v}/x",
        f"/v1%2F@{v}/x",
        f"/v1//{v}/x",
        f"/v1%2F%2F{v}/x",
        f"/v1/%2F%2F{v}/x",
        "/v1/..%2f..",
        f"/v1/..%2f..%2f{v}/x",
        "/v1/%252e%252e/x",
        "/v1/%2e%2e/%2e%2e/x",
        "/v1/../../x",
        f"/v1/@{v}/x",
        f"/v1/x@{v}",
        f"/v1/http:%2f%2f{v}/x",
        f"/v1/http://{v}/x",
        f"/v1/\\\\{v}/x",
        f"/v1/%5c%5c{v}/x",
        f"/v1\\..\\..\\{v}\\x",
        f"/v1/%5C..%5C{v}",
        f"/v1/x%0d%0aHost:%20{v}",
        "/v1/x%00y",
        "/v1/%ff%fe",
        f"//{v}/v1/x",
        f"/v1/x?next=http://{v}/",
    ]
    out = [(path, request_head("GET", path, [AUTH])) for path in paths]
    out.append(("absolute-form", request_head("GET", f"http://{v}/v1/x", [AUTH])))
    out.append(("absolute-form+userinfo", request_head("GET", f"http://u@{v}/v1/x", [AUTH])))
    out.append(("Host: victim", request_head("GET", "/v1/files", [AUTH], host=v)))
    body = b'{"model": "gpt-x", "input": "x"}'
    out.append(
        (
            f"POST /v1/%2f@{v}/x (JSON with a model)",
            request_head(
                "POST", f"/v1/%2f@{v}/x", [AUTH, ("content-type", "application/json")], body=body
            ),
        )
    )
    return out


def _relayed_paths(lab: Lab, gateway: Gateway, chaos_mark: int, raw_mark: int) -> list[str]:
    if gateway.upstream == "chaos":
        return [r["path"] for r in lab.chaos_requests()[chaos_mark:]]
    return [r.path.split("?", 1)[0] for r in lab.raw.since(raw_mark)]


def probe_ssrf(lab: Lab, kind: str, number: str) -> ProbeResult:
    base = KINDS[kind][0] or "(none)"
    result = ProbeResult(
        number,
        f"SSRF paths, base_url path {base}",
        f"{len(ssrf_requests(0))} requests whose path or target names 127.0.0.1:VICTIM "
        "(encoded / and \\, .., //, @, double encoding, absolute-form, Host)",
        "400/404, or relayed to the configured upstream only (a safe path under its base); "
        "the victim receives nothing; no 5xx",
    )
    statuses: collections.Counter[str] = collections.Counter()
    cases = []
    with lab.gateway(kind, number) as gateway, observed(lab, result, gateway):
        for what, request in ssrf_requests(lab.victim.port):
            chaos_mark, raw_mark = len(lab.chaos_requests()), lab.raw.mark()
            response = exchange(gateway.port, request, timeout=10)
            relayed = _relayed_paths(lab, gateway, chaos_mark, raw_mark)
            error = openai_error(response)
            case = {
                "request": what,
                "status": response.status,
                "code": error.get("code") if error else None,
                "relayed_as": relayed,
            }
            cases.append(case)
            label = "relayed" if relayed else "refused"
            statuses[f"{response.outcome} {label}"] += 1
            if response.status is None or response.status >= 500:
                result.failures.append(f"{what}: {response.outcome}")
            elif not relayed and response.status not in (400, 404):
                result.failures.append(f"{what}: {response.status} but nothing was relayed")
            for path in relayed:
                prefix = gateway.base_path + "/"
                if not path.startswith(prefix) or _UNSAFE_UPSTREAM_PATH.search(path[1:]):
                    result.failures.append(f"{what}: relayed as {path!r}")
            if SECRET.encode() in response.raw or b"internal metadata" in response.raw:
                result.secret_leaked = True
                result.failures.append(f"{what}: the answer holds the key or the victim's")
    result.outcome = ", ".join(f"{k}×{n}" for k, n in sorted(statuses.items()))
    result.details["cases"] = cases
    return result


# -- 5: a huge request head ---------------------------------------------------------------


def _filler(size: int) -> Iterator[bytes]:
    piece = b"a" * MB
    while size > 0:
        yield piece[: min(size, MB)]
        size -= MB


def probe_big_header(lab: Lab) -> ProbeResult:
    size = lab.sizes.big_header
    result = ProbeResult(
        "5",
        "huge request head",
        f"a {size // MB} MB header value; a {size // MB} MB request target; 500 header fields",
        "431 each, RSS growth < 16 MB, the gateway stays up",
    )
    seen = []
    with (
        lab.gateway("main", "5") as gateway,
        observed(lab, result, gateway, settle=lab.limits.linger + 1) as meter,
    ):
        cases = [
            ("header value", b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: ", size),
            ("request target", b"GET /v1/", size),
            (
                "500 fields",
                b"GET /healthz HTTP/1.1\r\nhost: x\r\n"
                + b"".join(b"x-f%d: 1\r\n" % i for i in range(500))
                + b"\r\n",
                0,
            ),
        ]
        for what, head, filler in cases:
            # The client goes on sending after the 431, until the gateway cuts it off.
            response = exchange(gateway.port, head, _filler(filler), timeout=30, keep_sending=True)
            error = openai_error(response)
            seen.append(
                {
                    "case": what,
                    "status": response.status,
                    "code": error.get("code") if error else None,
                    "client_sent_mb": round(response.sent / MB, 1),
                    "client_seconds": round(response.seconds, 2),
                    "send_error": response.send_error,
                }
            )
            result.check(response.status == 431, f"{what}: {response.outcome}, not 431")
            result.check(error is not None, f"{what}: the body is not an OpenAI error")
        meter.settle(lab.limits.linger + 2, fds_at_most=meter.fds_before)
    result.outcome = "; ".join(
        f"{c['case']}: {c['status']}, the client sent {c['client_sent_mb']} MB in "
        f"{c['client_seconds']} s" + (f" ({c['send_error']})" if c["send_error"] else "")
        for c in seen
    )
    result.details["cases"] = seen
    result.check(
        result.rss_peak_mb - result.rss_before_mb < 16,
        f"RSS grew {result.rss_peak_mb - result.rss_before_mb:.1f} MB",
    )
    return result


# -- 6: slow clients ----------------------------------------------------------------------

TRICKLE_S = 0.5
CONNECTS_IN_FLIGHT = 64


async def _slow_client(port: int, kind: str, gate: asyncio.Semaphore) -> dict[str, Any]:
    """One slow connection; how long until the gateway closed it (EOF), and its status."""
    async with gate:
        started = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as exc:
            return {"kind": kind, "error": f"connect: {type(exc).__name__}"}
    clock = time.monotonic()  # when the gateway's timer starts (connect, or the whole head)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    trickle = b""
    if kind == "half head":
        writer.write(head[: len(head) // 2])
    elif kind == "trickled head":
        writer.write(head)
        trickle = b"x-slow: " + b"a" * 1000
    elif kind == "trickled body":
        writer.write(head + b"content-length: 100000\r\n\r\n{")
        clock = time.monotonic()
        trickle = b" " * 1000
    raw = b""

    async def drip() -> None:
        for byte in trickle:
            await asyncio.sleep(TRICKLE_S)
            writer.write(bytes([byte]))
            await writer.drain()

    dripping = asyncio.ensure_future(drip())
    error = None
    try:
        async with asyncio.timeout(60):
            while part := await reader.read(65536):
                raw += part
    except (TimeoutError, OSError) as exc:
        error = type(exc).__name__
    closed = time.monotonic()
    dripping.cancel()
    writer.transport.abort()
    status = raw.split(b" ", 2)[1].decode() if raw.startswith(b"HTTP/1.1 ") else None
    return {
        "kind": kind,
        "closed_after_s": round(closed - clock, 2),
        "connect_s": round(clock - started, 2),
        "status": status,
        "error": error,
    }


async def _slowloris(port: int, kinds: list[str]) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(CONNECTS_IN_FLIGHT)
    return await asyncio.gather(*(_slow_client(port, kind, gate) for kind in kinds))


def probe_slowloris(lab: Lab) -> ProbeResult:
    sizes, limits = lab.sizes, lab.limits
    heads, bodies, silent = sizes.slow_heads, sizes.slow_bodies, sizes.silent
    slack = 3.0 if lab.quick else 5.0
    result = ProbeResult(
        "6",
        "slowloris",
        f"{heads} half-sent request heads (half stop, half trickle a byte every "
        f"{TRICKLE_S:g} s), {bodies} trickled bodies, {silent} connections that send nothing",
        f"each closed by the gateway within header_timeout={limits.header_timeout:g} s / "
        f"body_timeout={limits.body_timeout:g} s (+{slack:g} s slack); fds back to the start",
    )
    kinds = (
        ["half head"] * (heads - heads // 2)
        + ["trickled head"] * (heads // 2)
        + ["trickled body"] * bodies
        + ["silent"] * silent
    )
    with lab.gateway("main", "6") as gateway, observed(lab, result, gateway) as meter:
        started = time.monotonic()
        clients = asyncio.run(_slowloris(gateway.port, kinds))
        result.details["all_closed_after_s"] = round(time.monotonic() - started, 2)
        meter.settle(limits.linger + 10, fds_at_most=meter.fds_before)
    by_kind: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for client in clients:
        by_kind[client["kind"]].append(client)
    summary = []
    for kind, group in by_kind.items():
        limit = limits.body_timeout if kind == "trickled body" else limits.header_timeout
        times = sorted(c.get("closed_after_s", float("inf")) for c in group)
        late = [c for c in group if c.get("error") or c.get("closed_after_s", 99) > limit + slack]
        statuses = collections.Counter(str(c.get("status") or c.get("error")) for c in group)
        summary.append(
            f"{kind}: {len(group)} closed in {times[0]}-{times[-1]} s "
            f"({', '.join(f'{s}×{n}' for s, n in sorted(statuses.items()))})"
        )
        result.details[kind] = {
            "connections": len(group),
            "closed_after_s_min": times[0],
            "closed_after_s_median": times[len(times) // 2],
            "closed_after_s_max": times[-1],
            "statuses": dict(statuses),
            "late_or_failed": late[:10],
        }
        result.check(not late, f"{kind}: {len(late)} not closed within {limit + slack:g} s")
    result.outcome = "; ".join(summary)
    result.check(
        result.fds_after <= result.fds_before,
        f"fds {result.fds_before} before, {result.fds_after} after",
    )
    return result


# -- 9: malformed requests ----------------------------------------------------------------


def malformed_requests(big: int) -> list[tuple[str, bytes, Iterator[bytes] | None]]:
    json_type = ("content-type", "application/json")

    def chat(body: bytes) -> bytes:
        return request_head("POST", "/v1/chat/completions", [AUTH, json_type], body=body)

    def chunked_big() -> Iterator[bytes]:
        for part in _filler(big):
            yield b"%x\r\n%s\r\n" % (len(part), part)
        yield b"0\r\n\r\n"

    return [
        ("invalid JSON", chat(b'{"model": "chaos", "messages": ['), None),
        ("JSON array", chat(b"[1, 2, 3]"), None),
        ("JSON string", chat(b'"hello"'), None),
        ("JSON null", chat(b"null"), None),
        ("model is a number", chat(b'{"model": 42, "messages": []}'), None),
        (
            f"{big // MB} MB body (content-length)",
            request_head("POST", "/v1/chat/completions", [AUTH, json_type])[:-2]
            + b"content-length: %d\r\n\r\n" % big,
            _filler(big),
        ),
        (
            f"{big // MB} MB body (chunked)",
            request_head(
                "POST",
                "/v1/chat/completions",
                [AUTH, json_type, ("transfer-encoding", "chunked")],
            ),
            chunked_big(),
        ),
        (
            "invalid JSON, pass-through",
            request_head("POST", "/v1/embeddings", [AUTH, json_type], body=b'{"model": '),
            None,
        ),
        ("request line GARBAGE", b"GARBAGE\r\n\r\n", None),
        ("HTTP/9.9", b"GET /v1/models HTTP/9.9\r\nhost: x\r\n\r\n", None),
        ("TLS ClientHello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64, None),
        ("space in target", b"GET /v1/a b c HTTP/1.1\r\nhost: x\r\n\r\n", None),
        ("header without colon", b"GET /healthz HTTP/1.1\r\nhost: x\r\nbroken\r\n\r\n", None),
        (
            "negative content-length",
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: -5\r\n\r\n",
            None,
        ),
        (
            "bad chunk size",
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n"
            b"\r\nzz\r\n{}\r\n0\r\n\r\n",
            None,
        ),
        (
            "content-length + chunked",
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n"
            b"transfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            None,
        ),
    ]


def probe_malformed(lab: Lab) -> ProbeResult:
    result = ProbeResult(
        "9",
        "malformed requests",
        "invalid / non-object JSON, a 20 MB body over the 16 MiB limit (with and without "
        "content-length), unparseable request lines and framing",
        "an OpenAI-shaped 4xx JSON error, no traceback text, the gateway stays up",
    )
    cases = []
    with lab.gateway("main", "9") as gateway, observed(lab, result, gateway):
        for what, head, body in malformed_requests(lab.sizes.big_body):
            response = exchange(gateway.port, head, body or (), timeout=20)
            error = openai_error(response)
            cases.append(
                {
                    "case": what,
                    "status": response.status,
                    "code": error.get("code") if error else None,
                    "body": response.body[:200].decode("utf-8", "replace"),
                }
            )
            ok_status = response.status is not None and 400 <= response.status < 500
            result.check(ok_status, f"{what}: {response.outcome}")
            result.check(error is not None, f"{what}: not an OpenAI error body")
            result.check(not TRACEBACK.search(response.raw), f"{what}: traceback in the body")
            result.check(gateway.alive(), f"{what}: the gateway is down afterwards")
    result.outcome = ", ".join(f"{c['case']}: {c['status']} {c['code']}" for c in cases)
    result.details["cases"] = cases
    return result
