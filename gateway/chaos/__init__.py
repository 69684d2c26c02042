"""The chaos upstream: a real OpenAI- and Anthropic-compatible server that breaks streams
on request.

The gateway's tests, benchmarks and demo point at it. A request's model name (or
its ``x-chaos`` header) is a spec, ``chaos:text=40,fault=reset,at=12,times=1``,
that picks a deterministic answer and a transport fault (``spec.py``); a request
that carries an assistant prefix of that answer is answered from where the
prefix ends, as a model continuing a broken stream would be (``answer.py``).
``rechunk=1`` splits that text anew on every request, ``sample=1`` says other text
on every request (``sampled_answer``); each request records its ``attempt``, the
prefix it continued and the text it answered (``RecordedRequest``).

Modules: ``spec`` (grammar), ``answer`` (content and deltas), ``render`` (bytes),
``http11`` (the minimal HTTP/1.1), ``wire`` (writing bodies: batched, paced, split),
``faults`` (what each fault sends, and how the socket breaks), ``responses`` (the
same answers as Responses API events, ``POST /v1/responses``), ``background`` (OpenAI's
background mode there: a generation kept and generated without a reader, retrieved
``starting_after`` an event, cancelled, forgotten after a while), ``messages`` (the
same answers as Anthropic Messages API events, ``POST /v1/messages``), ``gemini`` and
``gemini_stream`` (the same answers in the native Gemini API, by the Developer API's door
and Vertex AI's), ``server``
(``ChaosUpstream``), ``runner`` (in a thread, or as the process's server).

``POST /v1/messages`` speaks Anthropic's dialect: the reasoning is a ``thinking``
block signed per response (``thinking_signature``), the text a ``text`` block, the
tool calls ``tool_use`` blocks; a trailing assistant message is a prefill to
continue, without any flag (refused with a 400 if it ends in whitespace, as
Anthropic does); errors, statuses and in-band ``error`` events alike, have
Anthropic's shape. In-band faults there: ``error`` an ``overloaded_error`` event,
``error_fatal`` an ``invalid_request_error`` one, ``error_done`` an ``api_error``
then ``message_stop``, ``finish_error`` an ``api_error``; ``no_finish`` ends without
``message_delta``/``message_stop``; ``malformed`` inserts a non-JSON delta event.

``POST /{v1,v1beta,v1alpha}/models/{model}:streamGenerateContent?alt=sse`` (and
``:generateContent``, ``:countTokens``; a key in ``x-goog-api-key`` or ``?key=``) and
Vertex AI's ``POST /v1/projects/{p}/locations/{r}/publishers/google/models/{model}:…``
(a bearer token, as for Claude there) speak Gemini's dialect: thought parts when asked
(``includeThoughts``), text parts, whole ``functionCall`` parts, one chunk per delta,
``finishReason`` and the whole ``usageMetadata`` on the last; a ``thoughtSignature`` per
response that only its door accepts (``gemini.thought_signature``,
``gemini.signature_valid``); a trailing ``model`` turn is a prefill, refused as Gemini 3
refuses it by a ``gemini-3…`` model or ``prefill=0``. In-band faults there: ``error``
Google's raw 503 object after the events, ``error_data`` the same as a ``data:`` event
(elsewhere: ``error``), ``error_fatal`` a raw 400, ``finish_error`` a raw 500.

What an agent sends back on its next turn is checked as the providers check it: a
``thinking`` block must carry the signature its response gave for its text
(``messages.refused_thinking``); with ``store: false``, a Responses ``reasoning`` item
must carry the ``encrypted_content`` its response gave (asked for with ``include:
["reasoning.encrypted_content"]``), and a ``function_call_output`` must answer a call
of the same input (``responses.refused_items``). A conversation that ends with tool
results is a new turn, answered in text (``asked.ends_in_tool_results``): an agent's
tool loop ends.
"""

from __future__ import annotations

from gateway.chaos.answer import Answer, ToolCall, expected_answer, sampled_answer
from gateway.chaos.messages import thinking_signature
from gateway.chaos.runner import run, running_chaos_upstream, serve
from gateway.chaos.server import ChaosUpstream, RecordedRequest
from gateway.chaos.spec import ChaosSpec, parse_spec

__all__ = [
    "Answer",
    "ChaosSpec",
    "ChaosUpstream",
    "RecordedRequest",
    "ToolCall",
    "expected_answer",
    "parse_spec",
    "run",
    "running_chaos_upstream",
    "sampled_answer",
    "serve",
    "thinking_signature",
]
