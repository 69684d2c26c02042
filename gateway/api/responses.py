"""The Responses API: ``POST /v1/responses`` and ``GET /v1/responses/{id}`` (section 2a).

``POST`` is a run like a chat completion (streamed or assembled, recovered the same
way) on the legs of its route whose upstream serves the Responses API.

``GET /v1/responses/{id}?stream=true&starting_after=N`` is OpenAI's own way to
re-attach to a stream: here it works for every upstream, for the answer's owner,
on any replica — the id is the one the client saw in ``response.created``, and N
the last ``sequence_number`` it has. Ids the gateway never streamed go to the
upstream (OpenAI's background responses), as does a plain ``GET``, except for an
answer the gateway recovered, whose upstream copy ends where its stream broke.

``previous_response_id``: an upstream stored the first leg of a recovered answer
cut short, so naming it would give the model half an answer as context. A request
naming a recovered response gets the whole one instead: its original ``input``
and the whole spliced output are sent as ``input``, chained to what that request
itself continued. Once the gateway's copy has expired (``state.completed_ttl``),
such a request gets a clear 409, for 30 days (the Responses API's retention).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.answer import answer, asked
from gateway.api.passthrough import passthrough
from gateway.api.runs import RunStream, no_events, parse_offset, resume_run
from gateway.context import Gateway, gateway_of
from gateway.errors import GatewayError, ServiceUnavailable
from gateway.inbound import credential
from gateway.protocols import RESPONSES
from gateway.protocols.responses import input_items

logger = logging.getLogger("gateway.responses")


class ResponseCutShort(GatewayError):
    status_code = 409
    error_type = "invalid_request_error"
    code = "response_recovered"


async def create_response(request: Request) -> Response:
    new = await asked(request, RESPONSES)
    if isinstance(new, Response):
        return new  # a resume
    previous = new.body.get("previous_response_id")
    if isinstance(previous, str) and previous:
        owner = credential(request)
        new.body = await whole_context(new.gateway, new.body, previous, owner)
    return await answer(request, new)


async def retrieve_response(request: Request) -> Response:
    """``GET /v1/responses/{id}``: a stream re-attached, or the answer the gateway served."""
    gateway = gateway_of(request)
    response_id = request.path_params["response_id"]
    gateway.auth.authorize(request)
    found = await gateway.runs.aliases.lookup(response_id)
    if found is None:
        return await passthrough(request)  # not one the gateway streamed: the upstream's
    run_id, recovered = found
    owner = credential(request)
    if request.query_params.get("stream") in ("true", "1"):
        value = request.query_params.get("starting_after")
        # The client has the events numbered 0..N: N + 1 of them.
        after = parse_offset(value, "starting_after") + 1 if value else 0
        body = await resume_run(request, gateway, run_id, after, ids=False)
        return RunStream(body if body is not None else no_events(), {"x-run-id": run_id})
    found_answer = await gateway.resumes.answer_of(run_id, owner)
    if found_answer is None:
        if recovered:
            raise _cut_short(response_id)
        return await passthrough(request)
    return Response(
        orjson.dumps(_final_response(found_answer[1])),
        media_type="application/json",
        headers={"x-run-id": run_id},
    )


async def whole_context(
    gateway: Gateway, body: dict[str, Any], previous: str, credential: str | None
) -> dict[str, Any]:
    """``body`` with a recovered ``previous_response_id`` replaced by its whole context."""
    try:
        found = await gateway.runs.aliases.lookup(previous)
    except ServiceUnavailable:
        # The store is down: requests go on (section 5); whether that answer was
        # recovered is unknown for now, so the upstream's copy is used.
        logger.warning("previous_response_id not checked: the checkpoint store is unavailable")
        return body
    if found is None or not found[1]:
        return body  # the upstream's stored copy is whole
    run_id, _ = found
    found_answer = await gateway.resumes.answer_of(run_id, credential)
    if found_answer is None:
        raise _cut_short(previous)
    earlier_body, events = found_answer
    context = input_items(earlier_body)
    for item in _final_response(events).get("output") or []:
        context.extend(_as_input(item))
    expanded = body | {"input": context + input_items(body)}
    earlier = earlier_body.get("previous_response_id")
    if earlier:
        expanded["previous_response_id"] = earlier
    else:
        expanded.pop("previous_response_id", None)
    return expanded


def _as_input(item: dict[str, Any]) -> list[dict[str, Any]]:
    """An output item of an earlier answer, as an input item of the next request."""
    kind = item.get("type")
    if kind == "message":
        text = "".join(
            part.get("text") or ""
            for part in item.get("content") or []
            if part.get("type") == "output_text"
        )
        return [{"role": "assistant", "content": text}]
    if kind == "function_call":
        keys = ("type", "call_id", "name", "arguments")
        return [{k: item[k] for k in keys if k in item}]
    return []  # reasoning: optional as input, and tied to the leg that produced it


def _final_response(answer: list[bytes] | dict[str, Any]) -> dict[str, Any]:
    """The response object of a finished answer: assembled, or its stream's terminal event."""
    if isinstance(answer, dict):
        return answer
    data = answer[-1].partition(b"\ndata: ")[2]
    response = orjson.loads(data).get("response") if data else None
    return response if isinstance(response, dict) else {}


def _cut_short(response_id: str) -> ResponseCutShort:
    return ResponseCutShort(
        f"Response {response_id!r} was completed by the gateway after its upstream stream "
        "broke, so the upstream's stored copy of it is cut short, and the gateway's own "
        "copy is not available here (it expired, or another replica served it). Send the "
        "conversation as 'input' instead of "
        "'previous_response_id' (the whole answer is in the response you received)."
    )
