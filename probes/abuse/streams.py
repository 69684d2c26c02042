"""Probes on the upstream side of the wire: a line without an end (2), clients that never
read (3), invalid UTF-8 (4), a client that leaves a non-streaming answer (7), and an
upstream that echoes its key (8)."""

from __future__ import annotations

import socket
import time
from typing import Any

import httpx2
import orjson

from probes.abuse.inbound import AUTH, openai_error
from probes.abuse.lab import MB, SECRET, Lab, ProbeResult, observed
from probes.abuse.net import Meter, RawResponse, exchange, request_head, socket_inodes, sse_payloads
from probes.abuse.upstream import UTF8_DELTAS

JSON = ("content-type", "application/json")
MESSAGES = [{"role": "user", "content": "Say hello."}]


def chat_request(model: str, *, stream: bool = True) -> bytes:
    body = orjson.dumps({"model": model, "messages": MESSAGES, "stream": stream})
    return request_head("POST", "/v1/chat/completions", [AUTH, JSON], body=body)


def stream_end(response: RawResponse) -> tuple[str, str, list[dict[str, Any]]]:
    """How a client stream ended (``done``, ``error``, or ``cut``), its text, its chunks."""
    chunks, text, end = [], "", "cut"
    for payload in sse_payloads(response.body):
        if payload == b"[DONE]":
            end = "done"
            continue
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "error" in obj:
            end = "error"
        if isinstance(obj, dict):
            chunks.append(obj)
            for choice in obj.get("choices") or []:
                text += (choice.get("delta") or {}).get("content") or ""
    return end, text, chunks


def finish_reasons(chunks: list[dict[str, Any]]) -> list[str]:
    return [
        c["finish_reason"]
        for chunk in chunks
        for c in chunk.get("choices") or []
        if c.get("finish_reason")
    ]


# -- 2: an SSE line without an end ---------------------------------------------------------


def probe_huge_line(lab: Lab) -> ProbeResult:
    size, runs = lab.sizes.huge_line, lab.sizes.huge_line_runs
    bound = 50
    result = ProbeResult(
        "2",
        "huge SSE line",
        f"{runs} chat streams, each: Hello, then a {size // MB} MB line without a line end",
        f"RSS peak < +{bound} MB (max_event_bytes is {lab.limits.max_event_bytes // MB} MiB), "
        "a recovered answer or an in-band error, RSS after near the start",
    )
    ends, written = [], []
    mark = lab.raw.mark()
    with lab.gateway("main", "2") as gateway, observed(lab, result, gateway, settle=2.0):
        for run in range(runs):
            response = exchange(gateway.port, chat_request(f"raw-hugeline-{run}"), timeout=120)
            end, text, chunks = stream_end(response)
            ends.append({"status": response.status, "end": end, "text": text})
            ok = response.status == 200 and (
                (end == "done" and finish_reasons(chunks) == ["stop"]) or end == "error"
            )
            result.check(ok, f"run {run}: {response.outcome} ended {end!r} with {text!r}")
    for request in lab.raw.since(mark):
        if b'"role":"assistant"' not in request.body:  # the faulted first request of a run
            written.append(request.sent)
    result.upstream_bytes = max(written, default=0)
    growth = result.rss_peak_mb - result.rss_before_mb
    left = result.rss_after_mb - result.rss_before_mb
    result.check(growth < bound, f"RSS grew {growth:.1f} MB")
    result.check(left < 16, f"RSS {left:.1f} MB above the start afterwards")
    texts = sorted({f"{e['end']}: {e['text']!r}" for e in ends})
    result.outcome = (
        f"{sum(e['status'] == 200 for e in ends)}/{runs} × 200, {'; '.join(texts)}; the upstream "
        f"wrote at most {max(written, default=0) / MB:.1f} MB of each {size // MB} MB line"
    )
    result.details["runs"] = ends
    result.details["upstream_wrote_bytes"] = written
    return result


# -- 3: clients that never read ------------------------------------------------------------

CLIENT_RCVBUF = 64 * 1024


def open_unread(port: int, request: bytes) -> socket.socket:
    """A chat stream whose headers were read, and nothing after (a small receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RCVBUF)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    sock.sendall(request)
    head = b""
    while b"\r\n\r\n" not in head:
        part = sock.recv(1024)
        if not part:
            break
        head += part
    return sock


def read_counting(port: int, request: bytes, timeout: float = 120) -> tuple[int, bytes]:
    """Read a whole answer as fast as possible, keeping only its size and its end."""
    total, tail = 0, b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        while part := sock.recv(1 << 20):
            total += len(part)
            tail = (tail + part)[-256:]
            if tail.endswith(b"0\r\n\r\n"):
                break
    return total, tail


def probe_never_read(lab: Lab) -> ProbeResult:
    clients, size, pause = lab.sizes.flood_clients, lab.sizes.flood_bytes, lab.sizes.flood_pause_s
    # Back-pressure (limits.max_client_lag_bytes, 1 MiB) stops the run's upstream read
    # once the client is that far behind; what the kernel buffers on the way (the
    # gateway's receive and send buffers on loopback, up to ~10 MB) still arrives, and
    # the run's log keeps what was read, for resumes. So per client: well under the
    # stream, and under 16 MB whatever the stream's size.
    bound = 16 * clients
    per_stream = min(16 * MB, size // 2)
    result = ProbeResult(
        "3",
        "clients that never read",
        f"{clients} chat streams of {size // MB} MB (32 KB deltas, as fast as the socket "
        f"takes them), headers read, then nothing for {pause:g} s",
        f"the upstream writes < {per_stream // MB} MB of each stream and RSS grows "
        f"< {bound} MB (bounded by the lag limit and socket buffers, not the stream)",
    )
    mark = lab.raw.mark()
    models = [f"raw-flood-{i}" for i in range(clients)]
    with lab.gateway("main", "3") as gateway, observed(lab, result, gateway) as meter:
        sockets = [open_unread(gateway.port, chat_request(m)) for m in models]
        time.sleep(pause)
        unread_peak = meter.rss_peak
        requests = [r for r in lab.raw.since(mark) if b"raw-flood" in r.body]
        wrote = [r.sent for r in requests]
        finished = sum(r.ended is not None and not r.hung_up for r in requests)
        for sock in sockets:
            sock.close()  # unread data in its buffer: a RST
        meter.settle(lab.limits.detach_grace + 2)
    result.upstream_bytes = sum(wrote)
    growth = (unread_peak - meter.rss_before) / 1024
    # Control, on a gateway of its own: one such stream read as fast as it comes.
    with lab.gateway("main", "3-control") as gateway, Meter(gateway.pid) as control:
        got, tail = read_counting(gateway.port, chat_request("raw-flood-control"))
        control.settle(lab.limits.detach_grace + 1)
    result.details.update(
        {
            "upstream_wrote_per_stream_mb": [round(w / MB, 1) for w in wrote],
            "upstream_streams_finished_while_unread": finished,
            "rss_growth_while_unread_mb": round(growth, 1),
            "rss_left_after_clients_left_mb": round(meter.left_mb, 1),
            "control_fast_reader": {
                "received_mb": round(got / MB, 1),
                "ended_with_done": b"[DONE]" in tail,
                "rss_growth_mb": round(control.growth_mb, 1),
                "rss_left_mb": round(control.left_mb, 1),
            },
            "bound_mb": bound,
        }
    )
    result.outcome = (
        f"the upstream wrote {', '.join(f'{w / MB:.1f}' for w in wrote)} MB "
        f"({finished}/{clients} whole streams) while nothing was read; RSS +{growth:.0f} MB; "
        f"a fast reader of one {size // MB} MB stream: RSS +{control.growth_mb:.0f} MB"
    )
    result.check(
        max(wrote, default=0) < per_stream,
        f"the upstream wrote up to {max(wrote, default=0) / MB:.1f} MB of a {size // MB} MB "
        "stream nobody read: no back-pressure on the upstream",
    )
    result.check(
        growth < bound,
        f"RSS grew {growth:.0f} MB for {clients} unread streams of {size // MB} MB: the relay "
        "buffers what the client does not read",
    )
    return result


# -- 4: invalid UTF-8 ----------------------------------------------------------------------


def probe_invalid_utf8(lab: Lab) -> ProbeResult:
    expected = [raw.decode("utf-8", "replace") for raw in UTF8_DELTAS]
    result = ProbeResult(
        "4",
        "invalid UTF-8 in content",
        f"{len(UTF8_DELTAS)} content deltas with a lone 0xFF, a cut sequence, a surrogate, "
        "an overlong form, a cut 4-byte tail (streaming, then non-streaming)",
        "every delta arrives, invalid bytes as U+FFFD; finish_reason stop and [DONE]",
    )
    with lab.gateway("main", "4") as gateway, observed(lab, result, gateway):
        response = exchange(gateway.port, chat_request("raw-utf8"), timeout=30)
        end, _, chunks = stream_end(response)
        deltas = [
            c["delta"]["content"]
            for chunk in chunks
            for c in chunk.get("choices") or []
            if (c.get("delta") or {}).get("content")
        ]
        result.check(deltas == expected, f"deltas {deltas!r}, expected {expected!r}")
        result.check(finish_reasons(chunks) == ["stop"], f"finish {finish_reasons(chunks)}")
        result.check(end == "done", f"the stream ended {end!r}, not with [DONE]")
        whole = exchange(gateway.port, chat_request("raw-utf8", stream=False), timeout=30)
        body = whole.json()
        message = ""
        if isinstance(body, dict) and body.get("choices"):
            message = body["choices"][0].get("message", {}).get("content") or ""
        result.check(
            message == "".join(expected),
            f"non-streaming: {whole.outcome} {message!r}",
        )
    replaced = sum(d.count("\ufffd") for d in deltas)
    result.outcome = (
        f"stream: {response.status}, {len(deltas)}/{len(expected)} deltas, {replaced} U+FFFD, "
        f"ended {end}; non-streaming: {whole.status}, content "
        f"{'equal' if message == ''.join(expected) else 'differs'}"
    )
    result.details.update({"deltas": deltas, "expected": expected, "completion": message})
    return result


# -- 7: a non-streaming client that leaves -------------------------------------------------

PACED = "chaos:text=2000,pace_ms=20"  # a 40 s answer


def probe_disconnect(lab: Lab) -> ProbeResult:
    leave_after = 1.5
    result = ProbeResult(
        "7",
        "non-streaming client leaves",
        f"a non-streaming chat request ({PACED}: 40 s of answer); the client closes after "
        f"{leave_after:g} s",
        "the gateway closes its upstream connection within 2 s of the client leaving; "
        "its log line says 499 / outcome cancelled",
    )
    # Connections of earlier probes' gateways must be gone from the chaos upstream first:
    # then a socket that appears there is this request's.
    deadline = time.monotonic() + 8
    while socket_inodes(lab.chaos_pid) - lab.chaos_idle_sockets and time.monotonic() < deadline:
        time.sleep(0.1)
    closed_after = None
    with lab.gateway("main", "7") as gateway, observed(lab, result, gateway):
        before = socket_inodes(lab.chaos_pid)
        offset = gateway.log_size()
        sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
        sock.sendall(chat_request(PACED, stream=False))
        time.sleep(leave_after)
        ours = socket_inodes(lab.chaos_pid) - before
        sock.close()
        left = time.monotonic()
        while ours and time.monotonic() - left < 10:
            if not ours & socket_inodes(lab.chaos_pid):
                closed_after = time.monotonic() - left
                break
            time.sleep(0.02)
        line: dict[str, Any] = {}
        deadline = time.monotonic() + 5
        while not line and time.monotonic() < deadline:
            lines = [
                entry
                for entry in gateway.log_lines(offset)
                if entry.get("path") == "/v1/chat/completions"
            ]
            line = lines[-1] if lines else {}
            time.sleep(0.1)
    result.check(bool(ours), "no upstream connection was seen at the chaos upstream")
    result.check(
        closed_after is not None and closed_after < 2,
        f"the upstream connection closed {closed_after} s after the client left",
    )
    result.check(
        line.get("status") == 499 and line.get("outcome") == "cancelled",
        f"log line: status {line.get('status')}, outcome {line.get('outcome')}",
    )
    seconds = "never" if closed_after is None else f"{closed_after:.2f} s"
    result.outcome = (
        f"upstream connection closed {seconds} after the client left; log: status "
        f"{line.get('status')}, outcome {line.get('outcome')}, {line.get('duration_ms')} ms"
    )
    result.details.update({"log_line": line, "closed_after_s": closed_after})
    return result


# -- 8: an upstream that echoes its key ----------------------------------------------------


def probe_key_echo(lab: Lab) -> ProbeResult:
    result = ProbeResult(
        "8",
        "upstream echoes its key",
        "an upstream 401 whose body and www-authenticate quote the key (streaming, "
        "non-streaming, pass-through); an in-band error event that quotes it; then "
        "/metrics and the gateways' logs are searched for it",
        "the client gets the error without the key; no key in logs or metrics",
    )
    secret = SECRET.encode()
    embeddings = request_head(
        "POST", "/v1/embeddings", [AUTH, JSON], body=b'{"model": "raw-401", "input": "x"}'
    )
    cases = [
        ("401, streaming", chat_request("raw-401"), 401),
        ("401, non-streaming", chat_request("raw-401", stream=False), 401),
        ("401, pass-through", embeddings, 401),
        ("in-band error, streaming", chat_request("raw-inband-key"), 200),
        ("in-band error, non-streaming", chat_request("raw-inband-key", stream=False), None),
    ]
    seen = []
    with lab.gateway("main", "8") as gateway, observed(lab, result, gateway):
        for what, request, status in cases:
            response = exchange(gateway.port, request, timeout=30)
            leaked = secret in response.raw
            error = openai_error(response)
            if error is None:
                end, _, chunks = stream_end(response)
                error = next((c["error"] for c in chunks if "error" in c), None)
            seen.append(
                {
                    "case": what,
                    "status": response.status,
                    "key_in_answer": leaked,
                    "error": (error or {}).get("message", "")[:160],
                }
            )
            result.check(not leaked, f"{what}: the key is in the client's answer")
            result.check(error is not None, f"{what}: no error reached the client")
            if status is not None:
                result.check(response.status == status, f"{what}: {response.outcome}")
        metrics = httpx2.get(f"http://127.0.0.1:{gateway.port}/metrics", timeout=10).content
        # Every gateway this run started, each probe's included (8 runs last).
        in_logs = [gw.name for gw in lab.started if secret in gw.log.read_bytes()]
    result.check(secret not in metrics, "the key is in /metrics")
    result.check(not in_logs, f"the key is in the log of {in_logs}")
    result.secret_leaked = any(c["key_in_answer"] for c in seen) or bool(in_logs)
    result.outcome = (
        "; ".join(
            f"{c['case']}: {c['status']}, key {'LEAKED' if c['key_in_answer'] else 'absent'}"
            for c in seen
        )
        + f"; logs: {'key in ' + ', '.join(in_logs) if in_logs else 'clean'}"
    )
    result.details["cases"] = seen
    return result
