"""How often a seam rule loses or doubles text, by how the continuing model behaves.

    python -m bench.seam [--answers 4000] [--seed 0]

Pure (no sockets): chaos answers (which repeat words, lines and whitespace on
purpose) are cut at a random character; the continuation is what a model of each
behaviour would send; each rule decides what to cut. Side by side in one run:

- ``guess`` — the rule before the anchor (the longest overlap of >= 3 characters
  between the sent tail and the reply, or a whole restart of >= 3), kept here as
  the baseline;
- ``anchored`` — today's prompt mode (gateway/recovery/seam.py);
- ``restart only`` — prompt mode with ``continuation_anchor: false``.

Behaviours: ``as asked`` (begins with the quoted anchor), ``no echo`` (exactly
the rest: a literal upstream, or a model that ignores the anchor), ``restart``
(the whole answer again), ``echo k`` (the last k characters, k in 1..60: a model
that echoes on its own).
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from collections.abc import Callable

from gateway.chaos.answer import expected_answer
from gateway.recovery.seam import SeamRule, SeamTrimmer, anchor_tail

Rule = Callable[[str, str], str]  # (sent, reply) -> what the client gets after sent


def guess(sent: str, reply: str, window: int = 64, min_overlap: int = 3) -> str:
    """The seam before the anchor: trim the longest tail overlap, or a restart."""
    if len(sent) >= min_overlap and reply.startswith(sent):
        return reply[len(sent) :]
    tail = sent[-window:]
    for k in range(min(len(tail), len(reply)), min_overlap - 1, -1):
        if sent.endswith(reply[:k]):
            return reply[k:]
    return reply


def _trimmed(sent: str, reply: str, rule: SeamRule) -> str:
    trimmer = SeamTrimmer(sent, rule)
    return trimmer.feed(reply) + trimmer.flush()


RULES: dict[str, Rule] = {
    "guess": guess,
    "anchored": lambda sent, reply: _trimmed(sent, reply, SeamRule(anchor_tail(sent), True)),
    "restart only": lambda sent, reply: _trimmed(sent, reply, SeamRule(None, True)),
}


def _reply(behaviour: str, sent: str, rest: str, rng: random.Random) -> str:
    if behaviour == "as asked":
        return anchor_tail(sent) + rest
    if behaviour == "no echo":
        return rest
    if behaviour == "restart":
        return sent + rest
    return sent[-rng.randint(1, 60) :] + rest


BEHAVIOURS = ("as asked", "no echo", "restart", "echo k")


def measure(answers: int, seed: int) -> dict[tuple[str, str], Counter[str]]:
    rng = random.Random(seed)
    results: dict[tuple[str, str], Counter[str]] = {}
    for n in range(answers):
        text = expected_answer(f"chaos:text={rng.randint(5, 120)},seed={seed * 100_003 + n}").text
        cut = rng.randint(1, len(text) - 1)
        sent, rest = text[:cut], text[cut:]
        for behaviour in BEHAVIOURS:
            reply = _reply(behaviour, sent, rest, random.Random(n))
            for name, rule in RULES.items():
                got = rule(sent, reply)
                verdict = "exact" if got == rest else "lost" if len(got) < len(rest) else "doubled"
                results.setdefault((behaviour, name), Counter())[verdict] += 1
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    results = measure(args.answers, args.seed)
    print(f"{args.answers} chaos answers, one cut each at a random character (seed {args.seed})")
    print("| model behaviour | rule | exact | lost | doubled | exact % |")
    print("|---|---|---|---|---|---|")
    for (behaviour, name), counts in results.items():
        share = 100 * counts["exact"] / args.answers
        print(
            f"| {behaviour} | {name} | {counts['exact']} | {counts['lost']} | "
            f"{counts['doubled']} | {share:.2f} |"
        )


if __name__ == "__main__":
    main()
