"""Choosing the contenders (aiowheel/bench/contenders.py), with and without the
uvloop and trio extras (a missing module is played by ``sys.modules[name] = None``)."""

from __future__ import annotations

import sys

import pytest
from bench_support import RLOOP_MISSING, TRIO_MISSING, UVLOOP_MISSING

from aiowheel.bench.contenders import CONTENDERS, SAMPLE_EVERY, missing_backend, select


def names(specs: list[str] | None) -> list[str]:
    return [c.name for c in select(specs).run]


def test_names_kinds_and_backends_select_contenders() -> None:
    assert names(["aiowheel"]) == ["aiowheel-asyncio", "aiowheel-uvloop", "aiowheel-trio"]
    assert names(["uvloop,trio-native"]) == [
        "aiowheel-uvloop",
        "call_later-uvloop",
        "deadline-uvloop",
        "loop-uvloop",
        "trio-native",
    ]
    # The drop-in loop's contenders, and rloop, a peer of theirs.
    assert names(["loop"]) == ["loop-asyncio", "loop-uvloop"]
    assert names(["rloop"]) == ["call_later-rloop"]
    # `trio` is a backend and a kind: both trio contenders.
    assert names(["trio"]) == ["aiowheel-trio", "trio-native"]
    # Repeated or overlapping tokens select a contender once, in the order asked.
    assert names(["call_later-asyncio", "asyncio"]) == [
        "call_later-asyncio",
        "aiowheel-asyncio",
        "deadline-asyncio",
        "loop-asyncio",
    ]
    everything = select(None)
    # The -pure contenders (a child process each) and the -traced and -sampled ones
    # are opt-in: never in the default set.
    assert everything.run == [c for c in CONTENDERS if not c.pure and not c.trace_every]
    assert everything.unavailable == []
    assert names(["traced"]) == [
        f"aiowheel-{backend}-{kind}"
        for kind in ("traced", "sampled")
        for backend in ("asyncio", "uvloop", "trio")
    ]


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["libuv"], "unknown contender 'libuv'"),
        (["aiowheel,"], None),
        ([" , "], "no contender given"),
    ],
)
def test_bad_tokens(specs: list[str], message: str | None) -> None:
    if message is None:
        assert names(specs) == ["aiowheel-asyncio", "aiowheel-uvloop", "aiowheel-trio"]
        return
    with pytest.raises(ValueError, match=message):
        select(specs)


def test_default_set_leaves_out_missing_event_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    monkeypatch.setitem(sys.modules, "trio", None)
    monkeypatch.setitem(sys.modules, "rloop", None)
    selection = select(None)
    assert [c.name for c in selection.run] == [
        "aiowheel-asyncio",
        "call_later-asyncio",
        "deadline-asyncio",
        "loop-asyncio",
    ]
    assert [(c.name, reason) for c, reason in selection.unavailable] == [
        ("aiowheel-uvloop", UVLOOP_MISSING),
        ("aiowheel-trio", TRIO_MISSING),
        ("call_later-uvloop", UVLOOP_MISSING),
        ("trio-native", TRIO_MISSING),
        ("deadline-uvloop", UVLOOP_MISSING),
        ("loop-uvloop", UVLOOP_MISSING),
        ("call_later-rloop", RLOOP_MISSING),
    ]


def test_a_kind_leaves_out_missing_loops_but_a_name_or_backend_must_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    selection = select(["aiowheel"])
    assert [c.name for c in selection.run] == ["aiowheel-asyncio", "aiowheel-trio"]
    assert [c.name for c, _ in selection.unavailable] == ["aiowheel-uvloop"]
    with pytest.raises(ValueError, match=r"contender aiowheel-uvloop cannot run: uvloop is not"):
        select(["aiowheel-uvloop"])
    with pytest.raises(ValueError, match=r"contender aiowheel-uvloop cannot run"):
        select(["uvloop"])
    with pytest.raises(ValueError, match=r"contender call_later-uvloop cannot run"):
        select(["aiowheel", "call_later-uvloop"])


def test_missing_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    assert missing_backend("asyncio") is None
    assert missing_backend("trio") is None
    monkeypatch.setitem(sys.modules, "trio", None)
    assert missing_backend("trio") == TRIO_MISSING
    monkeypatch.setattr(sys, "platform", "win32")
    assert missing_backend("uvloop") == "uvloop does not run on Windows"


def test_traced_contenders_are_compared_with_untraced_aiowheel() -> None:
    by_name = {c.name: c for c in CONTENDERS}
    traced, sampled = by_name["aiowheel-asyncio-traced"], by_name["aiowheel-asyncio-sampled"]
    assert (traced.trace_every, sampled.trace_every) == (1, SAMPLE_EVERY)
    assert traced.is_aiowheel
    assert not traced.baseline
    assert by_name["aiowheel-asyncio"].baseline
    assert not by_name["call_later-asyncio"].baseline
