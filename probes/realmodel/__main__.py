"""The real-model figures: how often a real model's answer, broken mid-stream, reaches
the client through the gateway byte-equal to the answer it gives unbroken.

    .venv/bin/python -m probes.realmodel                     # ~4 min on 2 cores
    .venv/bin/python -m probes.realmodel --prompts 6 --out /tmp/realmodel.md
    .venv/bin/python -m probes.realmodel --rounds 3 --details /tmp/realmodel.json

It starts two llama.cpp servers with SmolLM2-135M-Instruct (``probes.realmodel.server``,
one thread each): A, the primary, behind a ``CuttingProxy``, and B, the fallback; and
a gateway in this process (``tests.servers.running_gateway``) whose routes
(``probes.realmodel.routes``) send each request to A and, once A's retries are spent,
to B. One route per continuation mode, picked by the client's model name:
``smollm2`` (the mode left unset: each upstream's default for its kind),
``smollm2-vllm`` (``continue_final_message``; llama.cpp continues a final assistant
message anyway) and ``smollm2-prompt``; the mode is set on every leg.

Each of ``--prompts`` fixed prompts (``PROMPTS``) is asked through each door (chat,
Responses, Messages; the official openai and anthropic SDKs, ``probes.realmodel.cases``),
greedy, with a budget of 60 tokens (prompts 0-5, 12-17) or 300 (6-11, 18-23) so that
some answers end on their budget: first directly of server A (the truth), then
through the gateway with a fault, ``--rounds`` times. The (mode, fault) pair of prompt
i in round r is pair (i + r) mod 6, so six rounds give every prompt every pair on
every door. The faults: ``reset`` (the proxy resets the gateway's connection to A
after N events; A is asked again) and ``kill`` (A is SIGKILLed after sending N
events, so the retries find it gone and B finishes the answer; A is restarted after
the case). N is drawn (``--seed``) from 3 to the truth's event count less 2.

Every case is ``exact`` (the same text, byte for byte, and the same finish reason),
``error`` (the SDK raised, or the stream said it failed: explicit) or ``wrong`` (it
ended as a whole answer does, and differs: silent). A wrong one is tried once more
without the gateway: server A is asked to continue the same prefix itself
(``cases.server_drifts``); when it drifts from the truth too, float rounding in the
server tipped a greedy choice, and no gateway could have made that answer exact by
prefill (the table's last column). The markdown table (door x mode x fault) goes to
stdout and to ``--out``; every case, with both answers, to ``--details`` (JSON).
Seeded, greedy, and with no prompt cache on the servers: a second run gives the same
table.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from probes.realmodel.cases import (
    DOORS,
    Answer,
    Door,
    Outcome,
    classify,
    server_drifts,
    through_gateway,
    unbroken,
)
from probes.realmodel.cut import CuttingProxy
from probes.realmodel.routes import MODES, Mode, gateway_config, model_for
from probes.realmodel.server import LlamaServer, check_installed
from tests.servers import running_gateway

Fault = Literal["reset", "kill"]
FAULTS: tuple[Fault, ...] = ("reset", "kill")
PAIRS: tuple[tuple[Mode, Fault], ...] = tuple((m, f) for f in FAULTS for m in MODES)
BUDGETS = (60, 300)  # max tokens: the short one ends most answers on their budget
FIRST_CUT = 3  # events: after the preamble of every door, so most cuts fall in the text

# Short, varied, and answered in a few seconds by a 135M model: facts, lists, prose,
# code and structured output (whose seams are whitespace, punctuation, braces).
PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Name three primary colors.",
    "List five fruits, one per line.",
    "Write the opening sentence of a short story about a lighthouse keeper.",
    "Give a JSON object with the keys name and age for a fictional person.",
    "What is 12 times 12?",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about autumn.",
    "What are the four seasons of the year?",
    "Describe a cat in one paragraph.",
    "Write a Python function that adds two numbers.",
    "List the days of the week.",
    "Who wrote Romeo and Juliet?",
    "Give three tips for staying healthy.",
    "What is photosynthesis? Answer briefly.",
    "Write a short thank-you note to a teacher.",
    "Translate 'good morning' into Spanish and French.",
    "What is the largest planet in the solar system?",
    "Write a limerick about a dog.",
    "List four common programming languages.",
    "How many continents are there? Name them.",
    "Give a one-sentence definition of gravity.",
    "Write a short dialogue between two friends meeting at a cafe.",
    "Return a JSON array of three city names.",
)


@dataclass(frozen=True)
class Case:
    door: Door
    mode: Mode
    fault: Fault
    prompt: int  # index into PROMPTS
    max_tokens: int
    cut_after: int  # events of the gateway's response from A
    round: int


@dataclass
class Result:
    case: Case
    outcome: Outcome
    truth: Answer
    got: Answer | None
    error: str | None
    cut: bool  # the proxy did cut (the answer was longer than cut_after events)
    seconds: float
    # For a wrong answer: whether server A, continuing the same prefix itself, drifts
    # from the truth too (``cases.server_drifts``); None otherwise.
    server_drifts: bool | None = None

    def report(self) -> dict[str, Any]:
        def answer(value: Answer | None) -> dict[str, Any] | None:
            if value is None:
                return None
            return {"text": value.text, "finish": value.finish, "events": value.events}

        return {
            "case": asdict(self.case),
            "outcome": self.outcome,
            "truth": answer(self.truth),
            "got": answer(self.got),
            "error": self.error,
            "cut": self.cut,
            "seconds": round(self.seconds, 3),
            "server_drifts": self.server_drifts,
            "prefix": self.truth.prefix(self.case.cut_after),
        }


def budget(prompt: int) -> int:
    return BUDGETS[(prompt // 6) % 2]


def plan(
    prompts: int, rounds: int, seed: int, truths: dict[tuple[Door, int], Answer]
) -> list[Case]:
    cases = []
    for round_ in range(rounds):
        for door in DOORS:
            for i in range(prompts):
                mode, fault = PAIRS[(i + round_) % len(PAIRS)]
                events = truths[door, i].events
                rng = random.Random(f"{seed}:{door}:{i}:{round_}")
                cut_after = rng.randint(FIRST_CUT, max(FIRST_CUT, events - 2))
                cases.append(Case(door, mode, fault, i, budget(i), cut_after, round_))
    return cases


def the_truths(a: LlamaServer, b: LlamaServer, prompts: int) -> dict[tuple[Door, int], Answer]:
    """Every door's unbroken answer to every prompt, two at a time on each server (the
    servers are deterministic across slots and processes: tests/realmodel checks it)."""
    keys = [(door, i) for door in DOORS for i in range(prompts)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = {
            key: pool.submit(unbroken, (a, b)[n % 2].url, key[0], PROMPTS[key[1]], budget(key[1]))
            for n, key in enumerate(keys)
        }
        return {key: future.result() for key, future in futures.items()}


def run_case(
    case: Case, truth: Answer, gateway_url: str, a: LlamaServer, proxy: CuttingProxy
) -> Result:
    cuts = proxy.cuts
    if case.fault == "reset":
        proxy.arm(case.cut_after, "reset")
    else:
        # A SIGKILLed server's kernel ends its connections with a FIN.
        proxy.arm(case.cut_after, "close", on_cut=a.kill)
    started = time.monotonic()
    got: Answer | None = None
    error = None
    try:
        got = through_gateway(
            gateway_url,
            case.door,
            PROMPTS[case.prompt],
            case.max_tokens,
            model=model_for(case.mode),
        )
    except Exception as exc:  # every failure the client sees: the SDKs', StreamFailed
        error = f"{type(exc).__name__}: {exc}"
    seconds = time.monotonic() - started
    proxy.disarm()  # an answer shorter than the cut leaves it armed
    if not a.alive:
        a.restart()
    outcome = classify(truth, got if got is not None else RuntimeError(error))
    result = Result(case, outcome, truth, got, error, proxy.cuts > cuts, seconds)
    if outcome == "wrong":
        prompt = PROMPTS[case.prompt]
        result.server_drifts = server_drifts(a.url, prompt, truth, case.cut_after)
    return result


ROW_COLUMNS = (
    "cases",
    "exact",
    "explicit error",
    "silently wrong",
    "of which the server drifts too",
)


DRIFT_NOTE = (
    "A silently wrong answer where the server drifts too: server A, asked to continue "
    "the same prefix itself (a literal prefill), does not write the rest of the truth "
    "either (float rounding tips a greedy choice); no gateway could make it exact by "
    "prefill.\n"
)


def table(results: Sequence[Result]) -> str:
    counts: dict[tuple[str, str, str], collections.Counter[str]] = {}
    for door in DOORS:
        for mode in MODES:
            for fault in FAULTS:
                counts[door, mode, fault] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    for result in results:
        case = result.case
        for counter in (counts[case.door, case.mode, case.fault], total):
            counter[result.outcome] += 1
            counter["drifts"] += bool(result.server_drifts)
    lines = [
        "| door | continuation | fault | " + " | ".join(ROW_COLUMNS) + " |",
        "|---|---|---|" + "---:|" * len(ROW_COLUMNS),
    ]

    def row(label: str, counter: collections.Counter[str]) -> str:
        outcomes = ("exact", "error", "wrong")
        cells = [str(sum(counter[o] for o in outcomes)), *(str(counter[o]) for o in outcomes)]
        cells.append(str(counter["drifts"]))
        return f"| {label} | " + " | ".join(cells) + " |"

    for key, counter in counts.items():
        lines.append(row(" | ".join(key), counter))
    lines.append(row("**all** | | ", total))
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m probes.realmodel", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument(
        "--prompts", type=int, default=len(PROMPTS), help=f"how many of the {len(PROMPTS)}"
    )
    parser.add_argument("--rounds", type=int, default=1, help="each (mode, fault) pair per prompt")
    parser.add_argument("--seed", type=int, default=1, help="picks where each answer is cut")
    parser.add_argument("--out", type=Path, help="write the markdown table here too")
    parser.add_argument("--details", type=Path, help="every case, both answers (JSON)")
    parser.add_argument(
        "--batched-prompts",
        action="store_true",
        help="llama.cpp's default prompt batches, not batch-invariant (probes.realmodel.server)",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.prompts <= len(PROMPTS):
        parser.error(f"--prompts must be 1 to {len(PROMPTS)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    gguf = check_installed()
    started = time.monotonic()
    results: list[Result] = []
    with (
        LlamaServer(gguf, batch_invariant=not args.batched_prompts) as a,
        LlamaServer(gguf, batch_invariant=not args.batched_prompts) as b,
        CuttingProxy(a.port) as proxy,
        running_gateway(gateway_config(proxy.url, b.url)) as gateway,
    ):
        truths = the_truths(a, b, args.prompts)
        print(
            f"{len(truths)} unbroken answers in {time.monotonic() - started:.0f} s", file=sys.stderr
        )
        cases = plan(args.prompts, args.rounds, args.seed, truths)
        for n, case in enumerate(cases, 1):
            result = run_case(case, truths[case.door, case.prompt], gateway.url, a, proxy)
            results.append(result)
            print(
                f"[{n}/{len(cases)}] {case.door} {case.mode} {case.fault} prompt {case.prompt} "
                f"cut after {case.cut_after}: {result.outcome} ({result.seconds:.1f} s)",
                file=sys.stderr,
            )
    text = table(results)
    uncut = sum(not result.cut for result in results)
    text += (
        f"\n{len(results)} cases ({args.prompts} prompts x 3 doors x {args.rounds} round(s), "
        f"seed {args.seed}) in {time.monotonic() - started:.0f} s"
    )
    text += f"; {uncut} answer(s) ended before their cut.\n" if uncut else ".\n"
    text += DRIFT_NOTE
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)
    if args.details is not None:
        args.details.write_text(
            json.dumps([result.report() for result in results], indent=1, ensure_ascii=False)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
