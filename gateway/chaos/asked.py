"""What a request to the chaos upstream asks, read from its conversation (chat's
``messages``, a Responses request's ``input`` items, a Messages request's turns): the
assistant text it continues (a prompt-mode continuation's, vLLM's
``continue_final_message``, Mistral's ``"prefix": true``, a prefill), the anchor a
prompt-mode request quotes, and whether it ends with tool results (a new turn, answered
in text) or with an assistant message for the model to go on. ``answer.py`` says what
is answered."""

from __future__ import annotations

from typing import Any


def message_text(message: Any) -> str:
    """A message's text: its string content, or the text of its content parts."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):  # content parts
        parts = (part.get("text") for part in content if isinstance(part, dict))
        return "".join(text for text in parts if isinstance(text, str))
    return content if isinstance(content, str) else ""


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else None


def turns(body: dict[str, Any]) -> list[Any] | None:
    """The conversation of a request: chat's ``messages``, or a Responses ``input`` item list.

    A Responses ``input`` that is a string (or an embeddings ``input`` of strings)
    holds no assistant turn, so it never reads as a continuation.
    """
    messages = body.get("messages")
    if isinstance(messages, list):
        return messages
    items = body.get("input")
    return items if isinstance(items, list) else None


def find_prefix(body: dict[str, Any], text: str) -> str:
    """The assistant prefix of ``text`` this request continues from ("" for a fresh one).

    Three shapes: an assistant message followed by a user "continue" message; vLLM's
    ``continue_final_message``; Mistral's ``"prefix": true`` on the last message.
    The messages are chat's ``messages`` or a Responses request's ``input`` items.
    """
    prefix = assistant_prefix(body)
    return prefix if text.startswith(prefix) else ""


def assistant_prefix(body: dict[str, Any]) -> str:
    """The assistant text this request asks to continue, whatever it is ("" for a fresh
    request): ``find_prefix``'s shapes, without requiring a prefix of one answer."""
    messages = turns(body)
    if not messages:
        return ""
    last = messages[-1]
    if _role(last) == "assistant":
        continued = body.get("continue_final_message") is True or last.get("prefix") is True
        prefix = message_text(last) if continued else ""
    elif _role(last) == "user" and len(messages) >= 2 and _role(messages[-2]) == "assistant":
        prefix = message_text(messages[-2])
    else:
        prefix = ""
    return prefix


def ends_in_tool_results(body: dict[str, Any]) -> bool:
    """Whether a request's conversation ends with the results of the tools the model
    called (chat's ``tool`` message, a Responses ``function_call_output`` item, a Messages
    ``tool_result`` block): a new turn, not a continuation, which a model answers in
    text, having what it asked for. So an agent's tool loop ends. A continuation of
    that answer (a prefill of it, or it and a prompt to go on) is still that answer."""
    messages = turns(body)
    if not messages:
        return False
    if _tool_results(messages[-1]):
        return True
    if _role(messages[-1]) == "assistant" and len(messages) >= 2:
        return _tool_results(messages[-2])
    if len(messages) >= 3 and _role(messages[-2]) == "assistant":
        return _role(messages[-1]) == "user" and _tool_results(messages[-3])
    return False


def _tool_results(last: Any) -> bool:
    if not isinstance(last, dict):
        return False
    kind = last.get("type")
    if _role(last) == "tool" or (isinstance(kind, str) and kind.endswith("_call_output")):
        return True
    content = last.get("content")
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "tool_result" for block in content
    )


def ends_in_prefill(body: dict[str, Any]) -> bool:
    """Whether a request ends with an assistant message for the model to continue."""
    messages = turns(body)
    return messages is not None and bool(messages) and _role(messages[-1]) == "assistant"


def anchor_of(body: dict[str, Any], prefix: str) -> str:
    """The tail of ``prefix`` a prompt-mode continuation asks to repeat, between <<< and >>>.

    The tail may itself hold the markers (code does): it is the quoted text that
    is a tail of the prefix.
    """
    messages = turns(body)
    if not prefix or not messages or _role(messages[-1]) != "user":
        return ""
    prompt = message_text(messages[-1]).rstrip()
    if not prompt.endswith(">>>"):
        return ""
    start = prompt.find("<<<")
    while start >= 0:
        quoted = prompt[start + 3 : -3]
        if quoted and prefix.endswith(quoted):
            return quoted
        start = prompt.find("<<<", start + 1)
    return ""
