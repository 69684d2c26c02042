"""The Messages splicer, pure: scripted upstream events in, client events out."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import UpstreamFailure
from gateway.protocols.messages import MESSAGES, parse_event, replay
from gateway.protocols.messages_items import MessagesAccumulator
from gateway.protocols.messages_splice import MESSAGE_STOP, MessagesSplicer, frame
from gateway.recovery.events import DONE, Chunk, InBandError
from gateway.recovery.plan import Plan
from gateway.recovery.seam import SeamRule
from tests.protocols.named import events


def chunk(kind: str, **fields: Any) -> Chunk:
    obj = {"type": kind} | fields
    return Chunk(orjson.dumps(obj), obj)


class Leg:
    """One upstream message's events."""

    def __init__(self, message_id: str, input_tokens: int = 10) -> None:
        self.id = message_id
        self.input_tokens = input_tokens

    def start(self) -> list[Chunk]:
        message: dict[str, Any] = {"id": self.id, "type": "message", "role": "assistant",
                   "model": "claude",
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": self.input_tokens, "output_tokens": 1}}  # fmt: skip
        return [chunk("message_start", message=message), chunk("ping")]

    @staticmethod
    def text(index: int, *deltas: str, stop: bool = True) -> list[Chunk]:
        events = [chunk("content_block_start", index=index,
                        content_block={"type": "text", "text": ""})]  # fmt: skip
        events += [
            chunk("content_block_delta", index=index, delta={"type": "text_delta", "text": d})
            for d in deltas
        ]
        if stop:
            events.append(chunk("content_block_stop", index=index))
        return events

    @staticmethod
    def thinking(index: int, *deltas: str, signature: str | None = "sig") -> list[Chunk]:
        block = {"type": "thinking", "thinking": "", "signature": ""}
        events = [chunk("content_block_start", index=index, content_block=block)]
        events += [
            chunk(
                "content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": d}
            )  # fmt: skip
            for d in deltas
        ]
        if signature is not None:
            delta = {"type": "signature_delta", "signature": signature}
            events.append(chunk("content_block_delta", index=index, delta=delta))
            events.append(chunk("content_block_stop", index=index))
        return events

    @staticmethod
    def tool(index: int, call_id: str, *fragments: str, stop: bool = True) -> list[Chunk]:
        block = {"type": "tool_use", "id": call_id, "name": "lookup", "input": {}}
        events = [chunk("content_block_start", index=index, content_block=block)]
        events += [
            chunk(
                "content_block_delta",
                index=index,
                delta={"type": "input_json_delta", "partial_json": f},
            )  # fmt: skip
            for f in ("", *fragments)
        ]
        if stop:
            events.append(chunk("content_block_stop", index=index))
        return events

    @staticmethod
    def end(reason: str, output_tokens: int) -> list[Chunk]:
        delta = {"stop_reason": reason, "stop_sequence": None}
        return [chunk("message_delta", delta=delta, usage={"output_tokens": output_tokens})]


def feed(splicer: MessagesSplicer, chunks: list[Chunk]) -> bytes:
    return b"".join(out for c in chunks if (out := splicer.feed(c)) is not None)


def new() -> MessagesSplicer:
    return MessagesSplicer(MessagesAccumulator())


def next_leg(splicer: MessagesSplicer, plan: Plan, seam: SeamRule | None = None) -> None:
    splicer.end_leg()
    splicer.begin_leg(plan, seam)


def text_of(client: list[dict[str, Any]], index: int) -> str:
    return "".join(
        e["delta"]["text"]
        for e in client
        if e["type"] == "content_block_delta" and e["index"] == index
    )


def check_blocks(client: list[dict[str, Any]]) -> None:
    """Indices 0, 1, 2… each started once and stopped once, in order."""
    started = [e["index"] for e in client if e["type"] == "content_block_start"]
    stopped = [e["index"] for e in client if e["type"] == "content_block_stop"]
    assert started == list(range(len(started)))
    assert stopped == started


def test_the_first_leg_goes_out_as_received() -> None:
    splicer = new()
    chunks = Leg("msg_a").start() + Leg.text(0, "Hello", " world")
    out = [splicer.feed(c) for c in chunks]
    assert out[1] is None  # the upstream's ping: the gateway pings by itself
    for c, sent in zip(chunks, out, strict=True):
        if c.obj["type"] != "ping":
            assert sent == frame(c.obj["type"], c.data)  # the bytes received


def test_a_continuation_goes_on_in_the_clients_text_block() -> None:
    splicer = new()
    out = feed(splicer, Leg("msg_a").start() + Leg.text(0, "Hello", " wor", stop=False))
    next_leg(splicer, Plan.CONTINUE_TEXT, SeamRule(" wor", restart=True))
    out += feed(
        splicer, Leg("msg_b").start() + Leg.text(0, " w", "or", "ld!") + Leg.end("end_turn", 4)
    )
    out += splicer.close()
    client = events(out)
    assert [e["type"] for e in client].count("message_start") == 1
    assert client[0]["message"]["id"] == "msg_a"
    assert text_of(client, 0) == "Hello world!"
    check_blocks(client)
    message_delta = [e for e in client if e["type"] == "message_delta"]
    assert len(message_delta) == 1
    # Usage summed over both legs: input tokens paid twice, output tokens of both.
    assert message_delta[0]["usage"]["input_tokens"] == 20
    assert message_delta[0]["usage"]["output_tokens"] == 4 + 1
    assert client[-1] == {"type": "message_stop"}
    assert splicer.sent.message_object()["content"] == [{"type": "text", "text": "Hello world!"}]


def test_a_tool_use_is_released_whole_with_the_client_index() -> None:
    splicer = new()
    out = feed(splicer, Leg("msg_a").start() + Leg.text(0, "Let me look."))
    held = Leg.tool(1, "toolu_1", '{"q":', ' "x"}', stop=False)
    assert feed(splicer, held) == b""  # nothing of a tool use before its stop
    assert splicer.holding() and splicer.held_calls() == [("lookup", '{"q": "x"}')]
    out += feed(splicer, [chunk("content_block_stop", index=1)])
    client = events(out)
    assert [e["type"] for e in client[-5:]] == ["content_block_start"] + [
        "content_block_delta"
    ] * 3 + ["content_block_stop"]
    assert splicer.sent.tool_calls[0].arguments == '{"q": "x"}'
    out += feed(splicer, Leg.end("tool_use", 9)) + splicer.close()
    message = splicer.sent.message_object()
    assert message["content"][1] == {"type": "tool_use", "id": "toolu_1", "name": "lookup",
                                     "input": {"q": "x"}}  # fmt: skip
    assert message["stop_reason"] == "tool_use"


def test_a_cut_tool_use_is_dropped_and_the_text_goes_on_in_a_new_block() -> None:
    splicer = new()
    out = feed(splicer, Leg("msg_a").start() + Leg.text(0, "Let me look."))
    out += feed(splicer, Leg.tool(1, "toolu_1", '{"q":', stop=False))
    assert splicer.in_flight() == ["lookup"]
    next_leg(splicer, Plan.TRUNCATE_BEFORE_TOOL)
    assert splicer.in_flight() == []
    second = Leg("msg_b")
    out += feed(
        splicer,
        second.start() + Leg.text(0, " Now.") + Leg.tool(1, "toolu_1", '{"q": "y"}')
        + Leg.end("tool_use", 3),
    )  # fmt: skip
    client = events(out + splicer.close())
    check_blocks(client)
    assert text_of(client, 0) == "Let me look."
    assert text_of(client, 1) == " Now."
    # The cut call was never sent: the continuation's, with the same id, is the client's.
    assert [c.id for c in splicer.sent.tool_calls] == ["toolu_1"]


def test_a_thinking_block_is_held_until_its_signature_and_a_cut_one_is_never_shown() -> None:
    splicer = new()
    out = feed(splicer, Leg("msg_a").start() + Leg.thinking(0, "Let me", " think", signature=None))
    assert events(out)[-1]["type"] == "message_start"  # nothing of the unsigned thinking
    next_leg(splicer, Plan.WHOLE_RESTART)
    second = Leg("msg_b")
    out += feed(
        splicer,
        second.start() + Leg.thinking(0, "Again", signature="sig_b") + Leg.text(1, "Hi")
        + Leg.end("end_turn", 2),
    )  # fmt: skip
    client = events(out + splicer.close())
    check_blocks(client)
    thinking = [
        e["delta"] for e in client if e["type"] == "content_block_delta" and e["index"] == 0
    ]
    assert thinking == [
        {"type": "thinking_delta", "thinking": "Again"},
        {"type": "signature_delta", "signature": "sig_b"},
    ]
    assert splicer.sent.message_object()["content"] == [
        {"type": "thinking", "thinking": "Again", "signature": "sig_b"},
        {"type": "text", "text": "Hi"},
    ]


def test_a_later_legs_thinking_is_not_sent_again() -> None:
    splicer = new()
    out = feed(
        splicer, Leg("msg_a").start() + Leg.thinking(0, "Hmm") + Leg.text(1, "Hel", stop=False)
    )
    next_leg(splicer, Plan.CONTINUE_TEXT)
    out += feed(
        splicer,
        Leg("msg_b").start() + Leg.thinking(0, "Hmm again", signature="other")
        + Leg.text(1, "lo") + Leg.end("end_turn", 2),
    )  # fmt: skip
    client = events(out + splicer.close())
    check_blocks(client)
    assert [e["content_block"]["type"] for e in client if e["type"] == "content_block_start"] == [
        "thinking",
        "text",
    ]
    assert text_of(client, 1) == "Hello"
    assert splicer.sent.reasoning == "Hmm"


def test_a_continuation_that_only_repeats_the_anchor_adds_no_block() -> None:
    splicer = new()
    out = feed(splicer, Leg("msg_a").start() + Leg.text(0, "Done."))  # stopped
    out += feed(splicer, Leg.tool(1, "toolu_1", "{", stop=False))
    next_leg(splicer, Plan.TRUNCATE_BEFORE_TOOL, SeamRule("Done.", restart=True))
    out += feed(splicer, Leg("msg_b").start() + Leg.text(0, "Don", "e.") + Leg.end("end_turn", 1))
    client = events(out + splicer.close())
    check_blocks(client)
    assert [e["index"] for e in client if e["type"] == "content_block_start"] == [0]


def test_synthesized_tool_use_and_failure_end_the_stream_as_anthropic_does() -> None:
    splicer = new()
    out = feed(splicer, Leg("msg_a").start() + Leg.tool(0, "toolu_1", "{}"))
    out += feed(splicer, Leg.text(1, "and", stop=False))
    out += splicer.synthesize_tool_use() + splicer.close()
    client = events(out)
    check_blocks(client)
    assert client[-2]["delta"]["stop_reason"] == "tool_use"

    failing = new()
    raw = feed(failing, Leg("msg_c").start() + Leg.text(0, "Half", stop=False))
    raw += failing.fail(UpstreamFailure("Upstream 'a' sent an error event: Overloaded"))
    client = events(raw)
    check_blocks(client)  # the open block was stopped before the error
    assert client[-1] == {
        "type": "error",
        "error": {
            "type": "overloaded_error",
            "message": "Upstream 'a' sent an error event: Overloaded",
        },
    }
    assert MESSAGE_STOP not in raw


def test_events_decode_as_the_engine_needs() -> None:
    assert parse_event(b'{"type":"message_stop"}') is DONE
    error = parse_event(
        b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    )
    assert isinstance(error, InBandError) and error.message == "Overloaded"
    assert MESSAGES.is_terminal(MESSAGE_STOP) and MESSAGES.succeeded(MESSAGE_STOP)
    assert MESSAGES.is_terminal(b"event: error\ndata: {}\n\n")


def test_replay_rebuilds_what_the_client_holds() -> None:
    splicer = new()
    out = feed(
        splicer,
        Leg("msg_a").start() + Leg.thinking(0, "Hmm") + Leg.text(1, "Hello")
        + Leg.tool(2, "toolu_1", '{"a":1}'),
    )  # fmt: skip
    log = [e + b"\n\n" for e in out.split(b"\n\n") if e]
    rebuilt = replay(log)
    assert rebuilt.text == "Hello" and rebuilt.reasoning == "Hmm"
    assert [(c.id, c.arguments) for c in rebuilt.tool_calls] == [("toolu_1", '{"a":1}')]
    assert [b.type for b in rebuilt.blocks] == ["thinking", "text", "tool_use"]


def test_a_server_tool_use_is_whole_content_not_a_call_for_the_client() -> None:
    splicer = new()
    block = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
    delta = {"type": "input_json_delta", "partial_json": '{"query": "x"}'}
    upstream = [
        chunk("content_block_start", index=0, content_block=block),
        chunk("content_block_delta", index=0, delta=delta),
    ]
    held = events(feed(splicer, Leg("msg_a").start() + upstream))
    assert [e["type"] for e in held] == ["message_start"]  # nothing of it before its stop
    assert not splicer.holding()  # the provider runs it: a break here restarts
    out = feed(splicer, [chunk("content_block_stop", index=0)])
    assert [e["type"] for e in events(out)] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    ]
    assert splicer.sent.tool_calls == []  # never a reason to end with stop_reason tool_use
    assert splicer.sent.message_object()["content"][0]["input"] == {"query": "x"}


def test_a_later_legs_first_block_stops_the_clients_open_text_block_first() -> None:
    splicer = new()
    out = feed(splicer, Leg("msg_a").start() + Leg.text(0, "Let me look.", stop=False))
    next_leg(splicer, Plan.CONTINUE_TEXT)  # the continuation begins with a tool use
    out += feed(
        splicer, Leg("msg_b").start() + Leg.tool(0, "toolu_1", "{}") + Leg.end("tool_use", 2)
    )
    client = events(out + splicer.close())
    check_blocks(client)
    order = [(e["type"], e.get("index")) for e in client if "index" in e and "delta" not in e]
    assert order == [
        ("content_block_start", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_stop", 1),
    ]


def test_blocks_whole_at_a_message_delta_that_came_before_their_stop_go_out() -> None:
    splicer = new()
    out = feed(splicer, Leg("msg_a").start() + Leg.thinking(0, "Hmm", signature=None))
    out += feed(splicer, [chunk("content_block_delta", index=0,
                                delta={"type": "signature_delta", "signature": "s"})])  # fmt: skip
    out += feed(splicer, Leg.tool(1, "toolu_1", '{"a":', " 1}", stop=False))
    out += feed(splicer, Leg.tool(2, "toolu_2", '{"b":', stop=False))  # cut: not whole
    out += feed(splicer, Leg.end("tool_use", 5)) + splicer.close()
    client = events(out)
    check_blocks(client)
    kinds = [e["content_block"]["type"] for e in client if e["type"] == "content_block_start"]
    assert kinds == ["thinking", "tool_use"]
    assert [(c.id, c.arguments) for c in splicer.sent.tool_calls] == [("toolu_1", '{"a": 1}')]


def test_a_tool_use_whose_start_holds_its_input_keeps_it() -> None:
    splicer = new()
    block = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}}
    upstream = [
        chunk("content_block_start", index=0, content_block=block),
        chunk("content_block_stop", index=0),
    ]
    feed(splicer, Leg("msg_a").start() + upstream + Leg.end("tool_use", 1))
    assert splicer.sent.tool_calls[0].arguments == '{"q":"x"}'
    assert splicer.sent.message_object()["content"][0]["input"] == {"q": "x"}
