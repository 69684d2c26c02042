"""A real model on a real inference server: SmolLM2-135M-Instruct (Q4_1 GGUF) served by
llama.cpp's own server (the ``xllamacpp`` wheel), for the tests of ``tests/realmodel``
and the figures of ``python -m probes.realmodel``.

``server.LlamaServer`` runs one server in a subprocess (SIGKILL is a real server dying),
``cut.CuttingProxy`` breaks one response after exactly N SSE events, and ``cases``
asks a question through one of the three doors (chat, Responses, Messages) with the
official SDKs, directly or through a gateway. Both files come from ``scripts/install``
(``.venv/models/``); nothing here downloads anything.
"""
