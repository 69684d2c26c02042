"""The demo's run: each scene on its stage, then the summary."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TextIO

import httpx2

from gateway.chaos import (
    ChaosUpstream,
    expected_answer,
    running_chaos_upstream,
)
from gateway.demo.checks import (
    Outcome,
    Rescue,
    differences,
    gemini_differences,
    messages_differences,
    rescue_of,
    responses_differences,
    surfaced_cleanly,
    tally,
)
from gateway.demo.client import (
    Received,
    stream_answer,
    stream_gemini,
    stream_message,
    stream_response,
)
from gateway.demo.realmodel import INSTALL, run_real_model
from gateway.demo.report import (
    Report,
    Style,
    broke_line,
    gemini_received_line,
    messages_received_line,
    received_line,
    rescued_line,
    responses_received_line,
    seam_line,
    signature_line,
    thinking_line,
    thoughts_line,
    tool_line,
)
from gateway.demo.scenes import (
    CHAT,
    GEMINI,
    IDLE_TIMEOUT,
    MESSAGES,
    PACE_MS,
    RESPONSES,
    SCENARIOS,
    Scenario,
    demo_config,
    running_gateway,
)
from gateway.metrics import Metrics


@dataclass(frozen=True)
class Stage:
    """The servers one demo runs against, and its client."""

    upstream: ChaosUpstream
    gateway_url: str
    metrics: Metrics
    client: httpx2.Client

    def stream(
        self, model: str, show: Callable[[str], None], api: str = CHAT
    ) -> tuple[Received, Rescue]:
        """Stream one answer; return it with the evidence of what broke and was done."""
        before, seen = tally(self.metrics), len(self.upstream.requests)
        if api == RESPONSES:
            received = stream_response(self.gateway_url, model, show)
        elif api == MESSAGES:
            received = stream_message(self.gateway_url, model, show)
        elif api == GEMINI:
            received = stream_gemini(self.gateway_url, model, show)
        else:
            received = stream_answer(self.client, self.gateway_url, model, show)
        requests = self.upstream.requests[seen:]
        return received, rescue_of(before, tally(self.metrics), requests, expected_answer(model))


@contextlib.contextmanager
def staged() -> Iterator[Stage]:
    """The chaos upstream and a gateway in front of it, each in a thread; an httpx2 client."""
    metrics = Metrics()
    with (
        running_chaos_upstream() as upstream,
        running_gateway(
            demo_config(upstream.base_url, bedrock=has_botocore()), metrics
        ) as gateway_url,
        httpx2.Client(timeout=httpx2.Timeout(30.0)) as client,
    ):
        yield Stage(upstream, gateway_url, metrics, client)


@contextlib.contextmanager
def _quiet_gateway() -> Iterator[None]:
    """The gateway's log at ERROR while the demo runs: the report says it all."""
    logger = logging.getLogger("gateway")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def has_openai() -> bool:
    try:
        import openai  # noqa: F401
    except ImportError:
        return False
    return True


def has_anthropic() -> bool:
    try:
        import anthropic  # noqa: F401
    except ImportError:
        return False
    return True


def has_genai() -> bool:
    try:
        import google.genai  # noqa: F401  (not "from google import genai": see the tests)
    except ImportError:
        return False
    return True


def has_botocore() -> bool:
    try:
        import botocore  # noqa: F401
    except ImportError:
        return False
    return True


# How the report names the door each request of a scene went through.
DOORS = {
    "anthropic": "Anthropic (x-api-key, SSE)",
    "bedrock": "Amazon Bedrock (SigV4, AWS event stream)",
}

# The SDK scenes: the package each needs, and how the report names its client.
SDKS = {
    RESPONSES: ("openai", has_openai, "openai SDK: client.responses.stream(model=..., input=...)"),
    MESSAGES: (
        "anthropic",
        has_anthropic,
        "anthropic SDK: client.messages.stream(model=..., max_tokens=4096, thinking="
        '{"type": "enabled", "budget_tokens": 1024}, tools=[get_weather], messages=...)',
    ),
    GEMINI: (
        "google-genai",
        has_genai,
        "google-genai SDK: client.models.generate_content_stream(model=..., contents=..., "
        "config=GenerateContentConfig(thinking_config=ThinkingConfig(include_thoughts=True), "
        "tools=[get_weather]))",
    ),
}


def run_scenario(
    number: str, scenario: Scenario, stage: Stage, report: Report, pace_ms: int
) -> Outcome:
    model = scenario.spec + (f",pace_ms={pace_ms}" if pace_ms else "")
    expected = expected_answer(scenario.spec)
    report.line()
    report.paragraph(f"{number}  {scenario.title}", indent="     ", code="1")
    report.field("model", model)
    responses, messages = scenario.api == RESPONSES, scenario.api == MESSAGES
    gemini = scenario.api == GEMINI
    if scenario.api in SDKS:
        package, installed, client = SDKS[scenario.api]
        if not installed():
            why = f"the {package} package is not installed"
            report.field("skipped", f"{why} ({INSTALL}, or pip install {package})")
            return Outcome(broke=False, passed=True, skipped=True, why=why)
        report.field("client", client)
    if scenario.needs == "botocore" and not has_botocore():
        why = "the botocore package is not installed"
        report.field("skipped", f"{why} ({INSTALL}, or pip install 'resumable-gateway[bedrock]')")
        return Outcome(broke=False, passed=True, skipped=True, why=why)
    started = time.perf_counter()
    report.start_live("text" if scenario.api in SDKS else "client")
    try:
        received, rescue = stage.stream(model, report.live, scenario.api)
    finally:
        report.end_live()
    for call in received.tool_calls:
        report.field("", tool_line(call))
    if messages:
        report.field("thinking", thinking_line(received))
    if gemini:
        report.field("signature", signature_line(received))
        report.field("thoughts", thoughts_line(received))
    seconds = time.perf_counter() - started
    if responses:
        report.field("received", responses_received_line(received, seconds))
    elif messages:
        report.field("received", messages_received_line(received, seconds))
    elif gemini:
        report.field("received", gemini_received_line(received, seconds))
    else:
        report.field("received", received_line(received, seconds))
    if received.error is not None and not scenario.rescuable:
        report.field("error", f"{received.error.get('code')}: {received.error.get('message')}")
    report.field("broke", broke_line(rescue, received))
    report.field("rescued" if scenario.rescuable else "handled", rescued_line(rescue, received))
    seams = [seam_line(received.text, at) for at in rescue.resumed_at if at]
    for seam in seams:
        report.field("seam", seam)
    if rescue.trimmed:
        trimmed = f"{rescue.trimmed} characters the continuation quoted back, cut before the client"
        report.field("trimmed", trimmed)
    cloud_problems = []
    if scenario.needs == "botocore":  # finished on another provider of the same model
        doors = [r.dialect or "anthropic" for r in stage.upstream.requests[-rescue.requests :]]
        report.field("legs", " then ".join(DOORS.get(door, door) for door in doors))
        if doors[-1:] != ["bedrock"]:
            cloud_problems.append("the answer was not finished on Amazon Bedrock")
    if responses:
        problems = responses_differences(expected, received)
        report.verdict(
            "identical to an unbroken answer, one response, sequence_number without a gap",
            problems,
        )
    elif messages:
        problems = messages_differences(expected, received) + cloud_problems
        report.verdict(
            "identical to an unbroken answer, every block whole, one message_stop", problems
        )
    elif gemini:
        problems = gemini_differences(expected, received)
        report.verdict(
            "identical to an unbroken answer, thoughts once, the call whole with its "
            "signature, one finishReason",
            problems,
        )
    elif scenario.rescuable:
        problems = differences(expected, received)
        report.verdict("identical to an unbroken answer", problems)
    else:
        problems = surfaced_cleanly(expected, received)
        report.verdict("an explicit error, no [DONE], the text so far intact", problems)
    return Outcome(
        broke=bool(rescue.interruptions), passed=not problems, rescuable=scenario.rescuable
    )


def _intro(report: Report, real_model: bool, count: int) -> None:
    answers = f"{count} answer{'' if count == 1 else 's'}"
    if real_model and count:
        text = (
            "resumable-gateway demo: first a real model's answer, its server killed "
            f"mid-sentence; then a chaos upstream breaks {answers} on purpose, in ways a "
            "small model cannot show (tool calls, reasoning, every protocol). A gateway in "
            "front rescues each."
        )
    elif real_model:
        text = (
            "resumable-gateway demo: a real model's answer, its server killed mid-sentence, "
            "rescued by a gateway in front."
        )
    else:
        text = (
            f"resumable-gateway demo: a chaos upstream breaks {answers} on purpose, and a "
            "gateway in front of it rescues them."
        )
    report.paragraph(
        text + " Everything runs on this machine, on loopback: no API key, no network."
    )


def _chaos_header(report: Report, stage: Stage, after_real_model: bool) -> None:
    if after_real_model:
        report.line()
        report.paragraph(
            "The chaos upstream: deterministic answers that break where their model name "
            "says, through every protocol the gateway speaks."
        )
    upstream = stage.upstream.base_url
    report.field("upstream", f"{upstream}  (deterministic answers, faults on request)")
    report.field(
        "gateway",
        f"{stage.gateway_url}  (idle timeout {IDLE_TIMEOUT:g} s, 2 retries, in-memory state)",
    )


def _summary(report: Report, outcomes: list[Outcome], real_model: bool, seconds: float) -> None:
    ran = [o for o in outcomes if not o.skipped]
    rescuable = [o for o in ran if o.rescuable]
    report.line()
    if not all(o.passed for o in outcomes):
        failed = sum(not o.passed for o in outcomes)
        text = f"{failed} of {len(outcomes)} scenarios failed (see above). ({seconds:.1f} s)"
        report.paragraph(text, code="31;1")
        return
    broken, rescued = sum(o.broke for o in rescuable), sum(o.passed for o in rescuable)
    texts = []
    if rescuable:
        real = " (a real model's among them)" if real_model and not outcomes[0].skipped else ""
        texts.append(
            f"{broken} streams broke, {rescued} rescued{real}: every answer byte-identical "
            "to an unbroken one, 0 characters lost or repeated."
        )
    if refused := len(ran) - len(rescuable):
        texts.append(
            f"{refused} unrecoverable error ended its stream with an explicit error event."
        )
    for why in sorted({o.why for o in outcomes if o.skipped}):
        skipped = sum(o.skipped and o.why == why for o in outcomes)
        texts.append(f"{skipped} skipped: {why}.")
    if any(o.skipped for o in outcomes):
        texts.append(f"In a clone of the repository, {INSTALL} installs what they need.")
    report.paragraph(f"{' '.join(texts)} ({seconds:.1f} s)", code="32;1")


def _hint(report: Report) -> None:
    report.line()
    report.line(
        "Try it with your own client (any OpenAI, Anthropic or Gemini SDK; the model name picks "
        "the fault):"
    )
    for command in (
        "resumable-gateway chaos-upstream --port 9000 &",
        "GATEWAY_UPSTREAM_BASE_URL=http://127.0.0.1:9000/v1 \\",
        "  GATEWAY_ANTHROPIC_BASE_URL=http://127.0.0.1:9000 \\",
        "  GATEWAY_GEMINI_BASE_URL=http://127.0.0.1:9000/v1beta resumable-gateway serve &",
        "export OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_API_KEY=unused",
        "export ANTHROPIC_BASE_URL=http://127.0.0.1:8080 ANTHROPIC_API_KEY=unused",
        "export GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:8080 GEMINI_API_KEY=unused",
    ):
        report.line("  " + command)
    report.line('  then stream model "chaos:text=40,fault=reset,at=12,times=1,pace_ms=30"')
    report.line("  (times=1: only the first request with that exact name breaks; vary seed=)")
    report.line("  or the same model with client.responses.stream(model=..., input=...)")
    report.line("  or with client.messages.stream(model=..., max_tokens=..., messages=...)")
    report.line("  or with client.models.generate_content_stream(model=..., contents=...)")


def run_demo(
    quick: bool = False,
    out: TextIO | None = None,
    scenarios: tuple[Scenario, ...] = SCENARIOS,
    real_model: bool = True,
) -> int:
    """Run the real-model scene (``real_model``) and the chaos ``scenarios``, and report;
    0 when every one behaved as it should (or was skipped), else 1."""
    out = sys.stdout if out is None else out
    report = Report(out, Style(out.isatty() and "NO_COLOR" not in os.environ))
    pace_ms = 0 if quick else PACE_MS  # the real model keeps its own pace
    total = len(scenarios) + real_model
    outcomes: list[Outcome] = []
    started = time.perf_counter()
    try:
        with _quiet_gateway():
            _intro(report, real_model, len(scenarios))
            if real_model:
                outcomes.append(run_real_model(f"1/{total}", report))
            if scenarios:
                with staged() as stage:
                    _chaos_header(report, stage, real_model)
                    for number, scenario in enumerate(scenarios, 1 + real_model):
                        numbered = f"{number}/{total}"
                        outcomes.append(run_scenario(numbered, scenario, stage, report, pace_ms))
    except KeyboardInterrupt:
        report.line("interrupted")
        return 130
    _summary(report, outcomes, real_model, time.perf_counter() - started)
    _hint(report)
    return 0 if all(o.passed for o in outcomes) else 1
