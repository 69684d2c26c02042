"""Continuation requests: asking an upstream for the rest of a broken answer (section 4).

Policy only: builds request bodies by the upstream's declared capability, and
says what the answer to each will repeat first (``SeamRule``), so the seam is cut
by what the request made known, never by guessing from the text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.config.schema import Continuation
from gateway.recovery.seam import SeamRule, anchor_tail

# Appended to the route's continuation prompt: the reply then begins with a known
# text, cut exactly at the seam (gateway/recovery/seam.py).
ANCHOR_INSTRUCTION = (
    "\n\nBegin your reply by repeating exactly the text between <<< and >>> below, "
    "which is how your previous message ended (without the markers), then go on "
    "from there. Repeat nothing else.\n<<<{tail}>>>"
)
LITERAL = None  # the upstream continues right after the prefix: nothing to cut
# A verified replay (the client's request again) must begin with everything sent.
REPLAY = SeamRule(None, restart=True, verify=True)


@dataclass(frozen=True, slots=True)
class Continuing:
    """How a leg continues an answer: its mode (learned, or refused: prompt), and its
    route's continuation prompt and whether that quotes an anchor."""

    mode: Continuation
    prompt: str
    anchored: bool = True


@dataclass(frozen=True, slots=True)
class ContinuationRequest:
    body: dict[str, Any]
    seam: SeamRule | None
    # It ends with an assistant message for the model to go on (a prefill): a 4xx
    # answer to it may be the model refusing that, never to a prompt-mode request.
    prefill: bool = True


def continuation_request(
    body: dict[str, Any],
    capability: Continuation,
    prefix: str,
    prompt: str,
    *,
    anchored: bool = True,
    turns: str = "messages",
) -> ContinuationRequest | None:
    """The request that continues ``prefix``, or None when the upstream cannot.

    ``anchored``: in ``prompt`` mode, ask the model to begin with the prefix's last
    words, and cut exactly those; without it only a restart is recognised.
    ``turns``: the body's list of turns (chat's ``messages``, the Responses ``input``).
    """
    messages = list(body.get(turns) or [])
    if capability == "prefill" and not prefix.strip():
        capability = "prompt"  # whitespace only: nothing a prefill may end with
    if capability == "prompt":
        # Works everywhere, including legs that reject a trailing assistant prefill.
        tail = anchor_tail(prefix) if anchored else None
        if tail is not None:
            prompt += ANCHOR_INSTRUCTION.format(tail=tail)
        messages += [
            {"role": "assistant", "content": prefix},
            {"role": "user", "content": prompt},
        ]
        # Anchored, a reply that neither begins with the anchor nor restarts did not
        # do as asked: it is never shown (``SeamDiverged``), the run tries another way.
        anchor = SeamRule(tail, restart=True, verify=tail is not None)
        return ContinuationRequest(body | {turns: messages}, anchor, prefill=False)
    if capability == "prefill":  # Anthropic: a final assistant message is continued
        # It refuses one that ends in whitespace; the reply then usually begins with the
        # whitespace the client already has: exactly that is cut when it does.
        stripped = prefix.rstrip()
        messages.append({"role": "assistant", "content": stripped})
        dropped = prefix[len(stripped) :]
        rule = SeamRule(dropped, restart=False) if dropped else LITERAL
        return ContinuationRequest(body | {turns: messages}, rule)
    if capability == "vllm":  # vLLM and SGLang
        messages.append({"role": "assistant", "content": prefix})
        continued = body | {
            turns: messages,
            "continue_final_message": True,
            "add_generation_prompt": False,
        }
        return ContinuationRequest(continued, LITERAL)
    if capability in ("prefix", "prefix_echo"):  # DeepSeek (beta); Mistral echoes the prefix
        messages.append({"role": "assistant", "content": prefix, "prefix": True})
        echo = SeamRule(prefix, restart=False) if capability == "prefix_echo" else LITERAL
        return ContinuationRequest(body | {turns: messages}, echo)
    return None


# Servers that continue a final assistant message literally (with vLLM's
# ``continue_final_message``, which the others ignore), by the ``owned_by`` their own
# ``GET /v1/models`` gives every model: exact on a real model (tests/realmodel).
PREFILL_SERVERS = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp"}


def learned_continuation(models: bytes, model: str) -> tuple[Continuation, str]:
    """How an ``auto`` upstream continues ``model``, from its ``GET /models`` answer:
    ``vllm`` where the server is one of ``PREFILL_SERVERS``, else ``prompt``; and why,
    in words (``check-config``, the log)."""
    try:
        listed = orjson.loads(models).get("data")
    except (orjson.JSONDecodeError, AttributeError):
        listed = None
    if not isinstance(listed, list):
        return "prompt", "no model list"
    owners = {m.get("id"): m.get("owned_by") for m in listed if isinstance(m, dict)}
    # The model's own entry; else the server's, when every model it lists says the
    # same (llama.cpp answers any model name with the one it loaded).
    owner = owners.get(model)
    if owner is None and len(set(owners.values())) == 1:
        owner = next(iter(owners.values()))
    server = PREFILL_SERVERS.get(owner) if isinstance(owner, str) else None
    if server is None:
        return "prompt", f"owned_by {owner!r}" if isinstance(owner, str) else "no owner"
    return "vllm", f"served by {server}"
