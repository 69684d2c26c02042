"""The chaos upstream: an OpenAI- and Anthropic-compatible HTTP/1.1 server that breaks
streams on request.

One task per connection (``asyncio.start_server``); a connection's requests are
served one at a time. The shared state (recorded requests, ``times=`` counters)
is only touched from the server's event loop, so it needs no lock.

A request's spec (``spec.py``) picks its answer and its fault. Faults act on real
sockets: a RST, a FIN without the last chunk, a stall, in-band errors, error
statuses; see ``faults.py``. ``/v1/responses`` says the same answer as chat, in
the Responses API's events (``responses.py``); ``/v1/messages`` says it in the
Anthropic Messages API's events (``messages.py``), where a trailing assistant
message is a prefill to continue (no flag needed) and every error, an error status
or an in-band ``error`` event, has Anthropic's shape
(``{"type":"error","error":{"type","message"}}``). Gemini's doors (the Developer API's
``/v1beta/models/{model}:streamGenerateContent``, Vertex AI's ``publishers/google``)
say it in Gemini's chunks (``gemini.py``, ``gemini_stream.py``), errors in Google's shape.
A Responses request with ``background: true`` is kept and generated without a reader,
retrieved and cancelled by id (``background.py``).

Past 450 lines on purpose: ``ChaosUpstream`` is the one place that turns a request
into its answer and its fault, for every door; what a door says is in its dialect
module (``responses.py``, ``messages.py``, ``clouds.py``, ``gemini.py``), what the
answer is in ``answer.py``, how a fault acts in ``faults.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import socket
import time
from collections.abc import Sequence
from ssl import SSLContext
from typing import Any, NamedTuple

import orjson

from gateway.chaos import background, clouds, gemini, gemini_stream, messages, render, responses
from gateway.chaos.answer import Script, attempt_deltas, chat_plan, echo_of, legacy_plan, script_for
from gateway.chaos.asked import (
    anchor_of,
    assistant_prefix,
    ends_in_prefill,
    ends_in_tool_results,
    turns,
)
from gateway.chaos.faults import (
    Ending,
    break_messages,
    break_responses,
    break_stream,
    fault_cut,
    reset,
    stall,
)
from gateway.chaos.http11 import SSE_HEAD, BadRequest, Request, read_request
from gateway.chaos.spec import (
    GEMINI_FAULTS,
    HTTP2_FAULTS,
    HTTP_FAULTS,
    STREAM_FAULTS,
    ChaosSpec,
    SpecCounts,
    parse_spec,
)
from gateway.chaos.wire import send_events, send_json, send_json_cut

logger = logging.getLogger("gateway.chaos")

GEMINI = "gemini"  # the path _said answers a Gemini request as (its chat_view)
IDLE_TIMEOUT = 300.0  # longer than clients keep idle connections, so the client closes first
READ_TIMEOUT = 30.0


@dataclasses.dataclass
class RecordedRequest:
    """A request the server received and, for a completion it answered, what it said.

    ``attempt`` numbers the model requests carrying one spec string (0: the first),
    as ``times=`` counts them; ``rechunk=1`` and ``sample=1`` answers depend on it.
    ``prefix`` is the assistant text a completion continued ("" for a fresh one),
    ``echo`` what it repeated first, ``answered_text`` the text it said after
    that: all of it, as planned, even if a fault cut the stream. They stay None
    where there is no such answer (an error status, embeddings, ``/v1/models``).
    """

    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: Any  # the parsed JSON body, or None
    query: str = ""  # the raw query string, without "?"
    attempt: int | None = None
    prefix: str | None = None
    echo: str | None = None
    answered_text: str | None = None
    dialect: str = ""  # a cloud's door (bedrock, vertex, azure): body is then normalized
    received: Any = None  # a cloud door's body as it came (body has its URL's model)


class Said(NamedTuple):
    """What one completion says: its script, the prefix it continues, its echo, its text
    deltas after the echo (None: the script's own) and that text."""

    script: Script
    prefix: str
    echo: str
    deltas: tuple[str, ...] | None
    text: str


class ChaosUpstream:
    """The server. ``start()`` binds (port 0: a free port); ``aclose()`` drops every connection.

    With ``ssl`` it speaks HTTP/1.1 over TLS (``base_url`` is ``https://``); the faults
    act on the TCP socket under it, so ``reset`` is still a RST, ``close`` a FIN (after
    close_notify). Python's ssl reads that RST as an unexpected EOF: httpx2 says
    RemoteProtocolError where, without TLS, it says ReadError.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl: SSLContext | None = None,
        background_ttl: float = background.TTL,
    ) -> None:
        self.host = host
        self._port = port
        self._ssl = ssl
        self.requests: list[RecordedRequest] = []
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self._counts = SpecCounts()  # times= and attempts, by spec string
        self._ids = itertools.count(1)
        self.tokens = clouds.Tokens()  # the Vertex dialect's OAuth tokens
        # Background Responses (background.py), kept background_ttl s after they end.
        self.backgrounds = background.BackgroundResponses(background_ttl)

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("the chaos upstream is already started")
        self._server = await asyncio.start_server(
            self._serve_connection, self.host, self._port, ssl=self._ssl
        )
        self._port = self._server.sockets[0].getsockname()[1]

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the chaos upstream is not started")
        return self._port

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self._ssl is not None else "http"
        return f"{scheme}://{host}:{self.port}/v1"

    def requests_for(self, model: str) -> list[RecordedRequest]:
        """The requests recorded so far whose body named ``model``."""
        return [
            r for r in list(self.requests) if isinstance(r.body, dict) and r.body["model"] == model
        ]

    @property
    def open_connections(self) -> int:
        """Connections open right now, streaming or idle in keep-alive."""
        return len(self._connections)

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def aclose(self) -> None:
        server = self._server
        if server is not None:
            server.close()
        # abort(), not close(): a stalled or unread connection would never flush.
        for task, writer in list(self._connections.items()):
            writer.transport.abort()
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        sock = writer.get_extra_info("socket")
        if sock is not None:  # every write goes out as it is made: split= relies on it
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:
                    request = await read_request(reader, IDLE_TIMEOUT, READ_TIMEOUT)
                except BadRequest as exc:
                    body = render.error_body(str(exc), "invalid_request_error")
                    await send_json(writer, 400, body, close=True)
                    break
                if request is None or not await self._respond(request, reader, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the client went away, or sent half a request and stopped
        except asyncio.CancelledError:
            # Only aclose() cancels a connection, and it waits for it. Ending quietly
            # matters on 3.11, whose start_server logs a cancelled handler as an error.
            pass
        except Exception:
            logger.exception("chaos upstream: unexpected error; connection closed")
        finally:
            del self._connections[task]
            writer.close()

    async def _respond(
        self, request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; return whether the connection can serve another."""
        # Also under /v1, where a client whose base URL is ``base_url`` finds it.
        if request.path in ("/_chaos/requests", "/v1/_chaos/requests"):
            return await self._introspect(request, writer)
        if (request.method, request.path) == ("POST", "/token"):  # Vertex's OAuth endpoint
            return await _reply(writer, request, 200, self.tokens.issue())
        if (door_gemini := gemini.door_of(request)) is not None:
            return await self._gemini(request, door_gemini, reader, writer)
        try:
            payload = orjson.loads(request.body) if request.body else None
        except orjson.JSONDecodeError:
            self.requests.append(self._record(request, None))
            message = "We could not parse the JSON body of your request."
            return await _reply_error(writer, request, 400, message)
        door = clouds.door_of(request)
        if door is not None and request.method == "POST" and isinstance(payload, dict):
            return await self._cloud(request, door, payload, reader, writer)
        recorded = self._record(request, payload)
        self.requests.append(recorded)
        if background.is_background_path(request.path):  # a retrieve or a cancel
            return await self.backgrounds.serve(request, reader, writer)
        route = (request.method, request.path)
        if route == ("GET", "/v1/models"):
            return await _reply(writer, request, 200, render.MODELS)
        if route in (
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/completions"),
            ("POST", "/v1/embeddings"),
            ("POST", "/v1/responses"),
            ("POST", "/v1/messages"),
        ):
            if not isinstance(payload, dict):
                message = "The request body must be a JSON object."
                return await _reply_error(writer, request, 400, message)
            return await self._answer(request, recorded, reader, writer)
        message = f"Unknown request URL: {request.method} {request.path}."
        return await _reply_error(writer, request, 404, message, "unknown_url")

    async def _cloud(
        self,
        request: Request,
        door: clouds.Door,
        payload: dict[str, Any],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """A request by a cloud's door: its credentials and body checked as the cloud
        would, then answered as the same request by the OpenAI or Anthropic path."""
        answered = dict(payload)
        if door.model is not None:
            answered["model"] = door.model
        if door.stream is not None:
            answered["stream"] = door.stream
        recorded = self._record(request, answered)
        recorded.dialect, recorded.received = door.dialect, payload
        self.requests.append(recorded)
        try:
            if door.dialect == "bedrock":
                clouds.check_sigv4(request)
            elif door.dialect == "vertex":
                self.tokens.check(request)
            else:
                clouds.check_azure(request, door)
            if door.dialect in ("bedrock", "vertex"):
                clouds.check_claude_body(door, payload)
        except clouds.Refused as refused:
            return await _reply(writer, request, refused.status, refused.body, refused.headers)
        normalized = dataclasses.replace(request, path=door.path, dialect=door.dialect)
        return await self._answer(normalized, recorded, reader, writer)

    @staticmethod
    def _record(request: Request, payload: Any) -> RecordedRequest:
        return RecordedRequest(
            request.method, request.path, dict(request.headers), payload, request.query
        )

    async def _introspect(self, request: Request, writer: asyncio.StreamWriter) -> bool:
        if request.method == "GET":
            body = orjson.dumps([dataclasses.asdict(recorded) for recorded in self.requests])
            return await _reply(writer, request, 200, body)
        if request.method == "DELETE":
            count = len(self.requests)
            self.requests.clear()
            return await _reply(writer, request, 200, orjson.dumps({"deleted": count}))
        message = f"Unknown request URL: {request.method} {request.path}."
        return await _reply_error(writer, request, 404, message, "unknown_url")

    def _said(
        self, spec: ChaosSpec, payload: dict[str, Any], recorded: RecordedRequest, path: str
    ) -> Said:
        """What a completion answers: the prefix it continues, its echo, its text deltas
        (None: the script's own), recorded on ``recorded``. ``path``: the answer's own
        (a cloud door's request is answered as the same request on this path)."""
        script = script_for(spec)
        legacy = path == "/v1/completions"
        if legacy or ends_in_tool_results(payload):
            prefix = ""
        elif path in ("/v1/messages", GEMINI):  # a trailing assistant message is a prefill
            prefix = messages.messages_prefix(payload)
        else:
            prefix = assistant_prefix(payload)
        if not spec.sample and not script.text.startswith(prefix):
            prefix = ""  # not a prefix of this answer: answered afresh, as find_prefix does
        echo = "" if legacy else echo_of(spec, prefix, anchor_of(payload, prefix))
        attempt = recorded.attempt or 0
        deltas = attempt_deltas(spec, attempt, prefix)
        recorded.prefix, recorded.echo = prefix, echo
        recorded.answered_text = script.text[len(prefix) :] if deltas is None else "".join(deltas)
        return Said(script, prefix, echo, deltas, recorded.answered_text)

    async def _answer(
        self,
        request: Request,
        recorded: RecordedRequest,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """A POST to one of the model endpoints: what happens before any answer byte."""
        payload: dict[str, Any] = recorded.body
        model = payload.get("model")
        model = model if isinstance(model, str) else "chaos"
        try:
            spec = parse_spec(request.headers.get("x-chaos", model))
        except ValueError as exc:
            return await _reply_error(writer, request, 400, str(exc), "invalid_chaos_spec")
        if ends_in_tool_results(payload):  # it has what it asked for: it answers in text
            spec = dataclasses.replace(spec, tools=0)
        if not spec.prefill and ends_in_prefill(payload):
            # As Anthropic's Claude 4.6+ and some OpenAI-compatible servers answer.
            message = (
                "This model does not support assistant message prefill. "
                "The conversation must end with a user message."
            )
            return await _reply_error(writer, request, 400, message)
        if request.path == "/v1/messages" and (refusal := messages.prefill_error(payload)):
            return await _reply_error(writer, request, 400, refusal)
        if request.path == "/v1/responses" and (unstored := background.refusal(payload)):
            return await _reply(writer, request, 400, unstored)
        if request.path == "/v1/responses" and (refusal := responses.refused_items(payload)):
            return await _reply_error(writer, request, 400, refusal)
        if request.path == "/v1/messages" and (refusal := messages.refused_thinking(payload)):
            return await _reply_error(writer, request, 400, refusal)
        recorded.attempt = self._counts.take_attempt(spec)
        fault = self._counts.take_fault(spec)
        if fault in HTTP2_FAULTS:  # no GOAWAY or RST_STREAM in HTTP/1.1
            fault = HTTP2_FAULTS[fault]
        if fault in GEMINI_FAULTS:  # a Gemini variant: here, this dialect's own
            fault = GEMINI_FAULTS[fault]
        if fault == "reset_before":
            await reset(writer, flush=False)
            return False
        if spec.first_byte_ms:
            await asyncio.sleep(spec.first_byte_ms / 1000)
        if fault in HTTP_FAULTS:
            message, kind, code = render.HTTP_ERRORS[fault]
            headers = [("retry-after", str(spec.retry_after))] if fault == "http_429_retry" else []
            status = HTTP_FAULTS[fault]
            if request.dialect == "bedrock":
                refused = clouds.bedrock_error(status, messages.HTTP_ERRORS[fault][1])
                return await _reply(writer, request, status, refused.body, refused.headers)
            if request.path == "/v1/messages":
                body = messages.error_body(*messages.HTTP_ERRORS[fault])
            else:
                body = render.error_body(message, kind, code)
            return await _reply(writer, request, status, body, headers)
        if request.path == "/v1/responses":
            said = self._said(spec, payload, recorded, request.path)
            respond = self._respond_responses
            return await respond(request, payload, model, spec, said, fault, reader, writer)
        if request.path == "/v1/messages":
            said = self._said(spec, payload, recorded, request.path)
            anthropic = self._respond_messages
            return await anthropic(request, payload, model, spec, said, fault, reader, writer)
        if request.path != "/v1/embeddings":
            said = self._said(spec, payload, recorded, request.path)
            return await self._complete(request, payload, model, spec, said, fault, reader, writer)
        texts = _embedding_inputs(payload.get("input"))
        if texts is None:
            message = "'input' must be a string, an array of strings or of token arrays."
            return await _reply_error(writer, request, 400, message)
        body = render.embeddings(model, texts, payload.get("encoding_format") == "base64")
        return await _reply_json(writer, request, body, fault)

    async def _complete(
        self,
        request: Request,
        payload: dict[str, Any],
        model: str,
        spec: ChaosSpec,
        said: Said,
        fault: str | None,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """A chat (or legacy) completion: fresh, or continuing an assistant prefix."""
        legacy = request.path == "/v1/completions"
        script, prefix, echo = said.script, said.prefix, said.echo
        if legacy:
            plan = legacy_plan(script, said.deltas)
        else:
            plan = chat_plan(script, prefix, echo, said.deltas)
        messages = payload.get("messages")
        prompt_tokens = 10 + (len(messages) if isinstance(messages, list) else 1)
        usage = render.usage(prompt_tokens, sum(plan.counts))
        response_id = f"{'cmpl' if legacy else 'chatcmpl'}-chaos-{next(self._ids)}"
        created = int(time.time())

        if payload.get("stream") is not True:
            if legacy:
                body = render.text_completion(response_id, created, model, said.text, usage)
            else:
                content = echo + said.text
                body = render.chat_completion(response_id, created, model, script, content, usage)
            return await _reply_json(writer, request, body, fault)

        if legacy:
            envelope = render.legacy_envelope(response_id, created, model)
            finish_error = envelope.chunk(b'"text":"","finish_reason":"error"')
        else:
            envelope = render.chat_envelope(response_id, created, model)
            finish_error = envelope.chunk(b'{},"finish_reason":"error"')
        trailer = []
        options = payload.get("stream_options")
        if spec.usage and isinstance(options, dict) and options.get("include_usage") is True:
            obj = "text_completion" if legacy else "chat.completion.chunk"
            trailer.append(render.usage_chunk(response_id, obj, created, model, usage))
        payloads, ending = break_stream(
            fault if fault in STREAM_FAULTS else None,
            fault_cut(plan.counts, spec.at),
            [envelope.chunk(body) for body in plan.bodies],
            trailer,
            spec.done,
            finish_error,
        )
        events = render.EventFormat(spec.line_ending, spec.comments)
        encoded = [events.event(data, index) for index, data in enumerate(payloads)]
        return await _stream(request, reader, writer, spec, encoded, ending)

    async def _respond_responses(
        self,
        request: Request,
        payload: dict[str, Any],
        model: str,
        spec: ChaosSpec,
        said: Said,
        fault: str | None,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """A Responses API response: fresh, or continuing an assistant prefix of ``input``."""
        answer = responses.responses_script(spec)
        items = turns(payload)
        number = next(self._ids)
        created = int(time.time())
        plan = responses.responses_plan(
            answer,
            said.prefix,
            said.echo,
            said.deltas,
            number=number,
            model=model,
            created=created,
            input_tokens=10 + (len(items) if items is not None else 1),
            encrypted=responses.asks_encrypted(payload),
            usage_extra=spec.usage_extra,
        )
        if payload.get("background") is True:  # kept, and generated without a reader
            keep = self.backgrounds.create
            return await keep(request, payload, spec, plan, fault, reader, writer)
        if payload.get("stream") is not True:
            return await _reply_json(writer, request, orjson.dumps(plan.response), fault)
        sent, ending = break_responses(
            fault if fault in STREAM_FAULTS else None,
            fault_cut(plan.counts, spec.at, opening=2),
            plan.events,
            lambda kind: responses.fault_event(kind, number, created, model),
        )
        events = render.EventFormat(spec.line_ending, spec.comments)
        encoded = responses.encode_events(sent, events)
        return await _stream(request, reader, writer, spec, encoded, ending)

    async def _respond_messages(
        self,
        request: Request,
        payload: dict[str, Any],
        model: str,
        spec: ChaosSpec,
        said: Said,
        fault: str | None,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """An Anthropic Messages response: fresh, or continuing an assistant prefix (a
        prefill, or prompt mode)."""
        conversation = payload.get("messages")
        number = next(self._ids)
        plan = messages.messages_plan(
            messages.messages_script(spec),
            said.prefix,
            said.echo,
            said.deltas,
            number=number,
            model=model,
            input_tokens=10 + (len(conversation) if isinstance(conversation, list) else 1),
        )
        if payload.get("stream") is not True:
            return await _reply_json(writer, request, orjson.dumps(plan.message), fault)
        sent, ending = break_messages(
            fault if fault in STREAM_FAULTS else None,
            fault_cut(plan.counts, spec.at, opening=2),
            plan.events,
        )
        if request.dialect == "bedrock":
            frames = clouds.bedrock_frames(sent)
            head = clouds.EVENTSTREAM_HEAD
            return await _stream(request, reader, writer, spec, frames, ending, head)
        events = render.EventFormat(spec.line_ending, spec.comments)
        encoded = messages.encode_events(sent, events)
        return await _stream(request, reader, writer, spec, encoded, ending)

    async def _gemini(
        self,
        request: Request,
        door: gemini.Door,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """A request by one of Gemini's doors (``gemini.py``): checked as Google would,
        then answered in Gemini's wire format (``gemini_stream.py``)."""
        try:
            payload = orjson.loads(request.body) if request.body else None
        except orjson.JSONDecodeError:
            payload = None
        recorded = self._record(request, payload)
        if isinstance(payload, dict):  # the model is in the URL: requests_for finds it
            recorded.body = payload | {"model": door.model}
        recorded.dialect, recorded.received = door.door, payload
        self.requests.append(recorded)

        async def refuse(refused: gemini.Refused) -> bool:
            return await _reply(writer, request, refused.code, refused.body)

        try:
            if door.door == gemini.VERTEX:
                self.tokens.check(request)
            else:
                gemini.check_auth(request, door)
            if door.method == gemini.LIST:
                return await _reply(writer, request, 200, gemini.models(door))
            contents = gemini.check_body(door, payload)
            spec = parse_spec(request.headers.get("x-chaos", door.model))
        except clouds.Refused as refused:
            return await _reply(writer, request, refused.status, refused.body)
        except gemini.Refused as refused:
            return await refuse(refused)
        except ValueError as exc:
            return await refuse(gemini.Refused(400, "INVALID_ARGUMENT", str(exc)))
        assert isinstance(payload, dict)
        prompt_tokens = 10 + len(contents)
        if door.method == gemini.COUNT:
            return await _reply(writer, request, 200, gemini_stream.count_tokens(prompt_tokens))
        if gemini.ends_in_model_turn(contents) and gemini.refuses_prefill(door, spec.prefill):
            return await refuse(gemini.Refused(400, "INVALID_ARGUMENT", gemini.PREFILL_REFUSED))
        if refusal := gemini.refused_signatures(door.door, contents):
            return await refuse(gemini.Refused(400, "INVALID_ARGUMENT", refusal))
        view = gemini.chat_view(contents)
        if ends_in_tool_results(view):  # it has what it asked for: it answers in text
            spec = dataclasses.replace(spec, tools=0)
        recorded.attempt = self._counts.take_attempt(spec)
        fault = self._counts.take_fault(spec)
        fault = HTTP2_FAULTS.get(fault, fault) if fault is not None else None
        if fault == "reset_before":
            await reset(writer, flush=False)
            return False
        if spec.first_byte_ms:
            await asyncio.sleep(spec.first_byte_ms / 1000)
        if fault in HTTP_FAULTS:
            code, body = gemini.http_error(fault, spec.retry_after)
            headers = [("retry-after", str(spec.retry_after))] if fault == "http_429_retry" else []
            return await _reply(writer, request, code, body, headers)
        said = self._said(spec, view, recorded, GEMINI)
        plan = gemini_stream.gemini_plan(
            gemini_stream.gemini_script(spec),
            said.prefix,
            said.echo,
            said.deltas,
            door=door.door,
            thoughts=gemini.asks_thoughts(payload),
            model_version=gemini.model_version(door),
            prompt_tokens=prompt_tokens,
        )
        if door.method == gemini.GENERATE:
            if (failed := gemini_stream.non_streaming(plan, fault)) is not None:
                return await _reply(writer, request, *failed)
            return await _reply_json(writer, request, orjson.dumps(plan.response), fault)
        pieces, ending = gemini_stream.break_gemini(
            fault if fault in STREAM_FAULTS or fault in GEMINI_FAULTS else None,
            fault_cut(plan.counts, spec.at, opening=0),
            plan,
        )
        encoded = gemini_stream.encode(pieces, spec)
        return await _stream(request, reader, writer, spec, encoded, ending)


async def _stream(
    request: Request,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    spec: ChaosSpec,
    events: list[bytes],
    ending: Ending,
    head: bytes = SSE_HEAD,
) -> bool:
    """Send a stream's events, then end its body as ``ending`` says; return whether the
    connection can serve another request."""
    pace_s = spec.pace_ms / 1000
    await send_events(
        writer, events, pace_s=pace_s, split=spec.split, end=ending == "end", head=head
    )
    if ending == "end":
        return request.keep_alive
    if ending == "reset":
        await reset(writer)
    elif ending == "stall":
        await stall(reader, spec.stall_s)
    return False  # the connection closes (FIN) on the way out: that is the "close" fault


def _embedding_inputs(value: Any) -> list[str] | None:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        return None
    if all(isinstance(item, int) for item in value):  # one token array
        return [orjson.dumps(value).decode()]
    if all(isinstance(item, str | list) for item in value):
        return [item if isinstance(item, str) else orjson.dumps(item).decode() for item in value]
    return None


async def _reply(
    writer: asyncio.StreamWriter,
    request: Request,
    status: int,
    body: bytes,
    headers: Sequence[tuple[str, str]] = (),
) -> bool:
    await send_json(writer, status, body, headers, close=not request.keep_alive)
    return request.keep_alive


async def _reply_error(
    writer: asyncio.StreamWriter,
    request: Request,
    status: int,
    message: str,
    code: str | None = None,
) -> bool:
    """An error the server answers on its own; in Anthropic's shape on ``/v1/messages``."""
    if request.dialect == "bedrock":
        refused = clouds.bedrock_error(status, message)
        return await _reply(writer, request, status, refused.body, refused.headers)
    if request.path == "/v1/messages":
        body = messages.error_body(messages.status_error_type(status), message)
    else:
        body = render.error_body(message, "invalid_request_error", code)
    return await _reply(writer, request, status, body)


async def _reply_json(
    writer: asyncio.StreamWriter, request: Request, body: bytes, fault: str | None
) -> bool:
    """A JSON answer: ``reset`` and ``close`` cut it half-way; other stream faults do not apply."""
    if fault in ("reset", "close"):
        await send_json_cut(writer, body, fault)
        return False
    return await _reply(writer, request, 200, body)
