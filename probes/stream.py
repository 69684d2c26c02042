"""One probe stream read over as many connections as it takes: the client the soak and
the nemesis share.

The first connection starts a run; each later one resumes it, as docs/durable-runs.md,
"Resuming a stream", says: the same call through the openai SDK (``AsyncOpenAI``,
``stream=True``, ``include_usage``) with ``x-run-id`` (from the first response) and
``x-resume-from`` (the chunks received so far), and what arrives is fed to the same
``Received``. ``ResumingStream.connect`` makes one connection and says how it ended
(an ``End``); which replica to try next, how long to wait and when to give up are the
probe's own, in its loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from probes.soak.check import Received

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a story."}]


def gateway_client(port: int, api_key: str, timeout: float) -> AsyncOpenAI:
    """An SDK client of the gateway on ``port`` that retries nothing on its own: where and
    whether to try again is the probe's loop's to say."""
    return AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key=api_key, max_retries=0, timeout=timeout
    )


def describe(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    inner = f" ({type(cause).__name__}: {str(cause)[:120]})" if cause is not None else ""
    return f"{type(exc).__name__}{inner}"


def status_error(exc: openai.APIStatusError) -> str:
    body = exc.body if isinstance(exc.body, dict) else {}
    error = body.get("error", body)
    code = error.get("code") if isinstance(error, dict) else None
    return f"HTTP {exc.status_code} {code or ''}".strip()


@dataclass(frozen=True)
class End:
    """How one connection ended; ``text`` is what a report says of it."""

    kind: Literal["done", "dropped", "connection", "status", "error_event", "client"]
    text: str
    status: int = 0  # the HTTP status of a ``status`` end
    code: str | None = None  # the in-band error's code of an ``error_event`` end


@dataclass
class ResumingStream:
    """One chat completion stream of ``spec`` (the chaos spec is the model's name)."""

    spec: str
    received: Received = field(default_factory=Received)
    run_id: str | None = None  # from the first response's ``x-run-id``

    @property
    def resuming(self) -> bool:
        """Whether the next connection resumes (a run id is known) rather than starts."""
        return self.run_id is not None

    async def connect(self, client: AsyncOpenAI, drops: list[int] | None = None) -> End:
        """One connection, read to its end; dropped by the client once ``received.chunks``
        reaches ``drops[0]`` (which is then popped)."""
        headers = {}
        if self.run_id is not None:
            headers = {"x-run-id": self.run_id, "x-resume-from": str(self.received.chunks)}
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model=self.spec,
                messages=MESSAGES,
                stream=True,
                stream_options={"include_usage": True},
                extra_headers=headers,
            )
            self.run_id = self.run_id or raw.headers.get("x-run-id")
            dropped = False
            async with raw.parse() as chunks:
                async for chunk in chunks:
                    self.received.feed(chunk)
                    if drops and self.received.chunks >= drops[0]:
                        drops.pop(0)
                        dropped = True
                        break
            return End("dropped", "client dropped") if dropped else End("done", "done")
        except openai.APIConnectionError as exc:  # also a read timeout
            return End("connection", "connection: " + describe(exc))
        except openai.APIStatusError as exc:
            return End("status", status_error(exc), status=exc.status_code)
        except openai.APIError as exc:  # an in-band error event
            text = f"error event: {exc.code or ''} {exc.message}".replace("  ", " ")
            return End("error_event", text, code=exc.code)
        except Exception as exc:  # noqa: BLE001 - the client's own failure, reported
            return End("client", f"client exception: {type(exc).__name__}: {str(exc)[:200]}")
