"""The seam is cut by what the continuation request made known, never by guessing.

Answers are drawn from a small vocabulary full of repeats (the words, lines and
whitespace runs that a guess mistakes for an echo), broken once or twice at any
character, continued by upstreams of every kind, and chunked at random.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gateway.chaos.asked import anchor_of
from gateway.chaos.spec import parse_spec
from gateway.config.schema import Continuation
from gateway.protocols.chat_splice import Splicer
from gateway.recovery.accumulator import RunAccumulator
from gateway.recovery.events import Chunk
from gateway.recovery.plan import Plan
from gateway.recovery.seam import ANCHOR_MAX, SeamDiverged, SeamRule, SeamTrimmer, anchor_tail
from gateway.upstream.continuation import REPLAY, continuation_request

VOCABULARY = ["papa", " papa", " sierra", " ", "    }", "\n", "1,", " 1", "|", "é", "👩‍💻"]
ANSWERS = st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=40).map("".join)


def chunk(text: str) -> Chunk:
    obj: dict[str, Any] = {"id": "c", "choices": [{"index": 0, "delta": {"content": text}}]}
    return Chunk(orjson.dumps(obj), obj)


def feed(splicer: Splicer, text: str, sizes: list[int]) -> None:
    """Feed ``text`` in pieces of the given sizes (cycled), then whatever is left."""
    at, i = 0, 0
    while at < len(text):
        size = sizes[i % len(sizes)] if sizes else len(text)
        splicer.feed(chunk(text[at : at + size]))
        at, i = at + size, i + 1


def reply(capability: Continuation, sent: str, rest: str, behaviour: str) -> tuple[str, Any]:
    """What an upstream of ``capability`` sends to continue ``sent``, and its seam rule."""
    request = continuation_request(
        {"messages": [{"role": "user", "content": "q"}]}, capability, sent, "Go on."
    )
    assert request is not None
    if capability == "prompt":
        anchor = anchor_of(request.body, sent)  # as the chaos upstream reads it
        echo = {"anchor": anchor, "restart": sent}[behaviour]
        # The one case no rule can tell: a restart of an answer that begins with its
        # own last words (periodic text) also begins with the anchor. Documented and
        # shown in test_a_restart_of_periodic_text_is_cut_as_the_anchor.
        assume(echo == anchor or anchor == sent or not (sent + rest).startswith(anchor))
    else:
        echo = sent if capability == "prefix_echo" else ""
    return echo + rest, request.seam


@settings(max_examples=400, deadline=None)
@given(
    answer=ANSWERS,
    data=st.data(),
    capability=st.sampled_from(["prompt", "vllm", "prefix", "prefix_echo"]),
    behaviour=st.sampled_from(["anchor", "restart"]),
    sizes=st.lists(st.integers(min_value=1, max_value=7), max_size=6),
)
def test_a_deterministic_upstream_is_spliced_exactly(
    answer: str,
    data: st.DataObject,
    capability: Continuation,
    behaviour: str,
    sizes: list[int],
) -> None:
    """One or two faults anywhere after the first character: the client gets ``answer``."""
    first = data.draw(st.integers(min_value=1, max_value=len(answer)), "first fault")
    second = data.draw(st.integers(min_value=0, max_value=len(answer) * 2), "second fault")
    splicer = Splicer(RunAccumulator(), include_usage=False)
    feed(splicer, answer[:first], sizes)
    splicer.end_leg()
    faults = [second]
    while splicer.sent.text != answer or not splicer.finished:
        sent = splicer.sent.text
        assert answer.startswith(sent)
        if sent == answer:
            splicer.feed(Chunk(b"{}", {"choices": [{"delta": {}, "finish_reason": "stop"}]}))
            break
        text, rule = reply(capability, sent, answer[len(sent) :], behaviour)
        splicer.begin_leg(Plan.CONTINUE_TEXT, rule)
        cut = faults.pop() if faults else len(text)
        feed(splicer, text[:cut], sizes)
        if cut < len(text):
            splicer.end_leg()  # a second fault, mid-continuation (mid-anchor too)
            continue
        splicer.feed(Chunk(b"{}", {"choices": [{"delta": {}, "finish_reason": "stop"}]}))
    assert splicer.sent.text == answer


@pytest.mark.parametrize(
    ("sent", "reply_text", "rule", "released"),
    [
        # The outside soak's losses: a genuine repeat right after the seam is kept.
        ("alpha papa", " papa sierra", None, " papa sierra"),
        ("        }\n", "    }\n}", None, "    }\n}"),
        ("1, 1", ", 1, 2", None, ", 1, 2"),
        ("a  ", "   b", None, "   b"),
        # ... and with an anchor, the anchor goes, the repeat stays.
        ("alpha papa", "alpha papa papa sierra", SeamRule("alpha papa", True), " papa sierra"),
        # A restart is recognised whatever was sent, one character included.
        ("T", "The end", SeamRule("T", True), "he end"),
        ("He", "Hello", SeamRule(None, True), "llo"),
        # prefix_echo: exactly the prefix, even when the text then repeats it.
        ("ab", "ababc", SeamRule("ab", False), "abc"),
    ],
)
def test_the_seam_releases_exactly_the_new_text(
    sent: str, reply_text: str, rule: SeamRule | None, released: str
) -> None:
    splicer = Splicer(RunAccumulator(), include_usage=False)
    splicer.feed(chunk(sent))
    splicer.begin_leg(Plan.CONTINUE_TEXT, rule)
    for char in reply_text:  # one character per delta: the hardest chunking
        splicer.feed(chunk(char))
    splicer.feed(Chunk(b"{}", {"choices": [{"delta": {}, "finish_reason": "stop"}]}))
    assert splicer.sent.text == sent + released


def test_a_restart_of_periodic_text_is_cut_as_the_anchor() -> None:
    """The documented residual: the anchor wins, the restart's extra words stay."""
    sent = "1, " * 20
    rule = SeamRule(anchor_tail(sent), restart=True)
    trimmer = SeamTrimmer(sent, rule)
    released = trimmer.feed(sent + "2") + trimmer.flush()
    assert trimmer.outcome == "echo" and released == sent[len(anchor_tail(sent)) :] + "2"


def test_a_clean_reply_is_released_once_it_cannot_be_the_anchor() -> None:
    trimmer = SeamTrimmer("The cat sat on the mat.", SeamRule("on the mat.", restart=True))
    assert trimmer.feed(" Then") == " Then"
    assert (trimmer.trimmed, trimmer.outcome) == (0, "none")


def test_the_anchor_starts_at_a_word_and_is_bounded() -> None:
    text = "lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do"
    tail = anchor_tail(text)
    assert text.endswith(tail) and len(tail) <= ANCHOR_MAX and tail[0] != " "
    assert text[-len(tail) - 1] == " "
    assert anchor_tail("short") == "short"


def test_the_chaos_upstream_reads_the_anchor_even_when_it_holds_the_markers() -> None:
    sent = "x = '<<<' + y >>> z"
    request = continuation_request({"messages": []}, "prompt", sent, "Go on.")
    assert request is not None and request.seam is not None
    assert anchor_of(request.body, sent) == request.seam.echo == sent
    unanchored = continuation_request({"messages": []}, "prompt", sent, "Go on.", anchored=False)
    assert unanchored is not None and anchor_of(unanchored.body, sent) == ""
    assert parse_spec("chaos:anchor=0").anchor is False


def test_a_prefill_is_sent_without_trailing_whitespace_which_the_seam_then_cuts() -> None:
    request = continuation_request({"messages": []}, "prefill", "Hello, ", "Go on.")
    assert request is not None
    assert request.body["messages"] == [{"role": "assistant", "content": "Hello,"}]
    assert request.seam is not None
    trimmer = SeamTrimmer("Hello, ", request.seam)
    assert trimmer.feed(" world") == "world"  # the space the client already has
    other = SeamTrimmer("Hello, ", request.seam)
    assert other.feed("\nworld") == "\nworld"  # not that whitespace: nothing is cut


def test_a_prefill_of_whitespace_only_is_asked_for_in_prompt_mode() -> None:
    request = continuation_request({"messages": []}, "prefill", "\n\n", "Go on.")
    assert request is not None
    assert [m["role"] for m in request.body["messages"]] == ["assistant", "user"]


@pytest.mark.parametrize(
    ("mode", "prefill"),
    [("prompt", False), ("prefill", True), ("vllm", True), ("prefix", True), ("prefix_echo", True)],
)
def test_a_continuation_says_whether_it_ends_with_an_assistant_message(
    mode: Continuation, prefill: bool
) -> None:
    """Only then may a 4xx answer to it be a model refusing prefill (gateway/runs/run.py)."""
    request = continuation_request({"messages": []}, mode, "So far", "Go on.")
    assert request is not None and request.prefill is prefill
    assert (request.body["messages"][-1]["role"] == "assistant") is prefill


def test_a_prompt_reply_that_neither_echoes_nor_restarts_is_never_released() -> None:
    """A model that ignored the anchor: whatever it says, nothing of it is shown."""
    request = continuation_request({"messages": []}, "prompt", "The cat sat on the mat.", "Go.")
    assert request is not None and request.seam is not None and request.seam.verify
    trimmer = SeamTrimmer("The cat sat on the mat.", request.seam)
    assert trimmer.feed("The cat") == ""  # could still be the anchor: held
    with pytest.raises(SeamDiverged):
        trimmer.feed(" lay")
    assert trimmer.outcome == "diverged"


def test_a_reply_that_stops_before_it_said_the_anchor_is_not_released_either() -> None:
    trimmer = SeamTrimmer("The cat sat on the mat.", SeamRule("on the mat.", True, verify=True))
    assert trimmer.feed("on the") == ""
    with pytest.raises(SeamDiverged):
        trimmer.flush()


@pytest.mark.parametrize("lead", [" ", "\n\n", "\t \n"])
def test_whitespace_before_the_anchor_is_tolerated_and_cut(lead: str) -> None:
    trimmer = SeamTrimmer("The cat sat on the mat.", SeamRule("on the mat.", True, verify=True))
    released = trimmer.feed(lead) + trimmer.feed("on the mat. Then") + trimmer.flush()
    assert (released, trimmer.outcome) == (" Then", "echo")


def test_nothing_but_whitespace_before_the_anchor_is_tolerated() -> None:
    trimmer = SeamTrimmer("The cat sat on the mat.", SeamRule("on the mat.", True, verify=True))
    with pytest.raises(SeamDiverged):
        trimmer.feed(" - on the mat.")


@settings(max_examples=300, deadline=None)
@given(answer=ANSWERS, other=ANSWERS, data=st.data())
def test_a_verified_replay_releases_only_what_follows_all_that_was_sent(
    answer: str, other: str, data: st.DataObject
) -> None:
    """The request again: kept exactly when it repeats everything the client has, and
    never shown otherwise, wherever it diverges and however it is chunked."""
    cut = data.draw(st.integers(min_value=1, max_value=len(answer)), "cut")
    sent = answer[:cut]
    replay = data.draw(st.sampled_from([answer, other]), "replay")
    sizes = data.draw(st.lists(st.integers(min_value=1, max_value=5), min_size=1), "sizes")
    trimmer = SeamTrimmer(sent, REPLAY)
    released, at, i = "", 0, 0
    try:
        while at < len(replay):
            released += trimmer.feed(replay[at : at + sizes[i % len(sizes)]])
            at, i = at + sizes[i % len(sizes)], i + 1
        released += trimmer.flush()
    except SeamDiverged:
        assert not replay.startswith(sent) and released == ""
    else:
        assert replay.startswith(sent) and released == replay[len(sent) :]
