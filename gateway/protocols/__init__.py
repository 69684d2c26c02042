"""One adapter per wire protocol; the recovery engine is shared (base.py)."""

from __future__ import annotations

from gateway.protocols.base import Adapter, ClientStream
from gateway.protocols.chat import CHAT
from gateway.protocols.gemini import GEMINI
from gateway.protocols.messages import MESSAGES
from gateway.protocols.responses import RESPONSES

ADAPTERS: dict[str, Adapter] = {
    adapter.name: adapter for adapter in (CHAT, RESPONSES, MESSAGES, GEMINI)
}


def adapter_named(name: str) -> Adapter:
    """The adapter a checkpoint names (``RunRecord.protocol``)."""
    return ADAPTERS[name]


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
