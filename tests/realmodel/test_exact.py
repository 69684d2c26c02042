"""Exact on a real model (issue 46): SmolLM2-135M on llama.cpp's own server, greedy.

Every answer the SDKs receive through the gateway is compared with the answer the
server gives unbroken (``probes.realmodel.cases``): cut by a proxy that resets the
connection after a seeded random number of events, or by SIGKILL of the server, with
a second server as the next leg. Chat, Responses and Messages doors; budgets short
enough that most answers end on them (the budget carried across legs), and long
enough that some end by themselves. The continuation mode is left unset: the gateway
learns that llama.cpp continues a final assistant message (``continuation: auto``).

Then what only a real model shows: a structured answer across a seam is the unbroken
one, or an explicit error; a greedy request on a prompt-mode leg, whose replies this
small model rarely makes as asked, is never silently wrong. The servers are
batch-invariant (``probes.realmodel.server``): a byte-exact prefill needs that.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import openai
import pytest
from openai.types.shared_params import ResponseFormatJSONSchema

from probes.realmodel.cases import DOORS, MODEL, Answer, Door, ask, classify, unbroken
from probes.realmodel.cut import CuttingProxy
from probes.realmodel.routes import Mode, gateway_config, model_for
from probes.realmodel.server import LlamaServer
from tests.servers import RunningGateway, running_gateway

PROMPTS = (
    "What is the capital of France?",
    "Write the opening sentence of a short story about a lighthouse keeper.",
    "Explain in two sentences why the sky is blue.",
    "List five fruits, one per line.",
)
FIRST_CUT = 5  # events: past every door's preamble, so the cut falls in the text
RETRY = {"retries": 1, "backoff_initial": 0, "backoff_max": 0, "idle_retry_delay": 0}


@pytest.fixture(scope="module")
def cutting_proxy_module(llama_a: LlamaServer) -> Iterator[CuttingProxy]:
    with CuttingProxy(llama_a.port) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def gateway(cutting_proxy_module: CuttingProxy, llama_b: LlamaServer) -> Iterator[RunningGateway]:
    """Server A through the proxy, B the fallback, a route per continuation mode
    (``probes.realmodel.routes``): ``smollm2`` leaves it unset (``auto``)."""
    with running_gateway(gateway_config(cutting_proxy_module.url, llama_b.url)) as running:
        yield running


def cases(seed: int, count: int) -> list[tuple[Door, str, int, int]]:
    """(door, prompt, budget, cut position as a fraction in thousandths), seeded."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        door = DOORS[i % len(DOORS)]
        prompt = PROMPTS[(i // len(DOORS)) % len(PROMPTS)]
        budget = (24, 48, 200)[rng.randrange(3)]
        out.append((door, prompt, budget, rng.randrange(1000)))
    return out


def cut_after(truth: Answer, where: int) -> int:
    """An event position inside the answer, from a fraction in thousandths."""
    last = max(FIRST_CUT, truth.events - 2)
    return FIRST_CUT + (last - FIRST_CUT) * where // 1000


@pytest.mark.parametrize(("door", "prompt", "budget", "where"), cases(seed=46, count=12))
def test_a_reset_anywhere_is_spliced_byte_exact(
    gateway: RunningGateway,
    llama_a: LlamaServer,
    cutting_proxy_module: CuttingProxy,
    door: Door,
    prompt: str,
    budget: int,
    where: int,
) -> None:
    truth = unbroken(llama_a.url, door, prompt, budget)
    cutting_proxy_module.arm(cut_after(truth, where), "reset")
    cuts = cutting_proxy_module.cuts
    got = ask(gateway.url, door, prompt, budget)
    assert cutting_proxy_module.cuts == cuts + 1  # the answer was broken, once
    assert classify(truth, got) == "exact", (got, truth)


@pytest.mark.parametrize(("door", "prompt", "budget", "where"), cases(seed=47, count=6))
def test_a_server_killed_mid_answer_is_finished_on_the_other_byte_exact(
    gateway: RunningGateway,
    llama_a: LlamaServer,
    llama_b: LlamaServer,
    cutting_proxy_module: CuttingProxy,
    door: Door,
    prompt: str,
    budget: int,
    where: int,
) -> None:
    truth = unbroken(llama_b.url, door, prompt, budget)
    killed = threading.Event()

    def kill() -> None:
        llama_a.kill()
        killed.set()

    # The proxy passes exactly that many events, then A dies: its connections with it.
    cutting_proxy_module.arm(cut_after(truth, where), "close", on_cut=kill)
    try:
        got = ask(gateway.url, door, prompt, budget)
        assert killed.is_set()
        assert classify(truth, got) == "exact", (got, truth)
    finally:
        if not llama_a.alive:
            llama_a.restart()


SCHEMA: ResponseFormatJSONSchema = {
    "type": "json_schema",
    "json_schema": {
        "name": "city",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
            "required": ["city", "country"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize("mode", ["unset", "prompt"])
@pytest.mark.parametrize("where", [200, 600])
def test_structured_output_across_a_seam_is_the_unbroken_document(
    gateway: RunningGateway,
    llama_a: LlamaServer,
    cutting_proxy_module: CuttingProxy,
    mode: Mode,
    where: int,
) -> None:
    def answer(base_url: str, model: str = MODEL) -> tuple[str, str | None]:
        with openai.OpenAI(base_url=base_url, api_key="k", max_retries=0, timeout=60) as sdk:
            text, finish = "", None
            stream = sdk.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Name a big city and its country."}],
                response_format=SCHEMA,
                max_tokens=60,
                temperature=0,
                seed=1,
                stream=True,
            )
            for chunk in stream:
                for choice in chunk.choices:
                    text += choice.delta.content or ""
                    finish = choice.finish_reason or finish
            return text, finish

    truth = answer(llama_a.base_url)
    events = len(truth[0]) // 2 + 2  # about a token a delta: a cut well inside the text
    cutting_proxy_module.arm(max(3, events * where // 1000), "reset")
    assert answer(gateway.base_url, model_for(mode)) == truth


@pytest.mark.parametrize(("door", "prompt", "budget", "where"), cases(seed=48, count=9))
def test_prompt_mode_on_a_greedy_request_is_never_silently_wrong(
    gateway: RunningGateway,
    llama_a: LlamaServer,
    cutting_proxy_module: CuttingProxy,
    door: Door,
    prompt: str,
    budget: int,
    where: int,
) -> None:
    """A greedy request asks for the model's one answer, which a prompt-mode reply is
    not, even one that does as asked (this small model echoes the anchor and then says
    "... called Rayleigh." and stops): such a leg replays the request and verifies it,
    so the answer is the unbroken one, or the client is told."""
    truth = unbroken(llama_a.url, door, prompt, budget)
    registry = gateway.metrics.registry

    def seams() -> dict[str, float]:
        kinds = ("echo", "restart", "none", "diverged")
        return {k: registry.get_sample_value("gateway_seams_total", {"cut": k}) or 0 for k in kinds}

    before = seams()
    cutting_proxy_module.arm(cut_after(truth, where), "reset")
    got: Answer | BaseException
    try:
        got = ask(gateway.url, door, prompt, budget, model=model_for("prompt"))
    except Exception as exc:  # noqa: BLE001 - an explicit failure is allowed here
        got = exc
    cuts = {k: n - before[k] for k, n in seams().items()}
    assert classify(truth, got) != "wrong", (got, cuts)
    assert cuts["echo"] == cuts["none"] == 0  # no prompt-mode reply was shown
