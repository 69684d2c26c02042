from __future__ import annotations

import pytest

from gateway.chaos import ChaosSpec, parse_spec


def test_bare_chaos_is_the_default_spec() -> None:
    assert parse_spec("chaos") == ChaosSpec()
    assert parse_spec("chaos:") == ChaosSpec(source="chaos:")


def test_any_other_model_gets_the_default_answer() -> None:
    spec = parse_spec("gpt-4o-mini")
    assert spec == ChaosSpec(source="gpt-4o-mini")
    assert (spec.text, spec.fault, spec.done) == (20, None, True)


def test_every_key_parses() -> None:
    source = (
        "chaos:text=40,reasoning=3,tools=2,arg_deltas=5,seed=7,pace_ms=1.5,first_byte_ms=20,"
        "usage=1,lineend=crlf,comments=1,split=3,done=0,fault=reset,at=12,times=1,"
        "stall_s=0.5,retry_after=9,echo=4,echo_prefix=true"
    )
    assert parse_spec(source) == ChaosSpec(
        source=source,
        text=40,
        reasoning=3,
        tools=2,
        arg_deltas=5,
        seed=7,
        pace_ms=1.5,
        first_byte_ms=20.0,
        usage=True,
        lineend="crlf",
        comments=True,
        split=3,
        done=False,
        fault="reset",
        at=12,
        times=1,
        stall_s=0.5,
        retry_after=9,
        echo=4,
        echo_prefix=True,
    )
    assert parse_spec(source).line_ending == b"\r\n"


def test_spaces_and_trailing_commas_are_tolerated() -> None:
    assert parse_spec("chaos: text = 3 , fault=close,").text == 3


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("chaos:txt=3", "unknown key 'txt'"),
        ("chaos:text", "is not key=value"),
        ("chaos:text=many", "text='many': not an integer"),
        ("chaos:text=-1", "must be between 0 and 100000"),
        ("chaos:pace_ms=nan", "pace_ms='nan'"),
        ("chaos:pace_ms=soon", "not a number"),
        ("chaos:usage=yes", "must be 0 or 1"),
        ("chaos:lineend=crcr", "must be one of cr, crlf, lf"),
        ("chaos:fault=explode", "fault='explode'"),
        ("chaos:split=0", "split='0'"),
        ("chaos:text=1,text=2", "'text' given twice"),
        ("chaosmonkey", "expected 'chaos' or 'chaos:key=value,...'"),
    ],
)
def test_bad_specs_say_what_is_wrong(source: str, message: str) -> None:
    with pytest.raises(ValueError, match="invalid chaos spec") as caught:
        parse_spec(source)
    assert message in str(caught.value)
