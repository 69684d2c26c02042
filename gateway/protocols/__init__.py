"""One adapter per wire protocol; the recovery engine is shared (base.py)."""

from __future__ import annotations

from gateway.checkpoint.model import RunUnreadable
from gateway.protocols.base import Adapter, ClientStream
from gateway.protocols.chat import CHAT
from gateway.protocols.gemini import GEMINI
from gateway.protocols.messages import MESSAGES
from gateway.protocols.responses import RESPONSES

ADAPTERS: dict[str, Adapter] = {
    adapter.name: adapter for adapter in (CHAT, RESPONSES, MESSAGES, GEMINI)
}


def adapter_named(name: str) -> Adapter:
    """The adapter a checkpoint names (``RunRecord.protocol``); ``RunUnreadable`` (503)
    for a protocol this release does not speak: a later release's run, in a rolling
    update, which a replica of that release can resume."""
    adapter = ADAPTERS.get(name)
    if adapter is None:
        raise RunUnreadable(
            f"This run speaks a protocol ({name!r}) that this replica's release of the "
            "gateway does not know; a replica of the release that started it can resume "
            "it: resume it again there."
        )
    return adapter


__all__ = [
    "ADAPTERS",
    "CHAT",
    "GEMINI",
    "MESSAGES",
    "RESPONSES",
    "Adapter",
    "ClientStream",
    "adapter_named",
]
