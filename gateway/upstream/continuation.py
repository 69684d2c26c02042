"""Continuation requests: asking an upstream for the rest of a broken answer (section 4).

Policy only: builds request bodies by the upstream's declared capability.
"""

from __future__ import annotations

from typing import Any

from gateway.config import Continuation


def continuation_body(
    body: dict[str, Any], capability: Continuation, prefix: str, prompt: str
) -> dict[str, Any] | None:
    """The request that continues ``prefix``, or None when the upstream cannot."""
    messages = list(body.get("messages") or [])
    if capability == "prompt":
        # Works everywhere, including legs that reject a trailing assistant prefill.
        messages += [
            {"role": "assistant", "content": prefix},
            {"role": "user", "content": prompt},
        ]
        return body | {"messages": messages}
    if capability == "vllm":  # vLLM and SGLang
        messages.append({"role": "assistant", "content": prefix})
        return body | {
            "messages": messages,
            "continue_final_message": True,
            "add_generation_prompt": False,
        }
    if capability == "prefix":  # DeepSeek (beta), Mistral; an echoed prefix is trimmed
        messages.append({"role": "assistant", "content": prefix, "prefix": True})
        return body | {"messages": messages}
    return None
