"""The record's one client-controlled free-form string, `model`, is bounded before it is stored."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from specproxy.records import MODEL_MAX_BYTES, RequestRecord, bound_model


def _record(model: str) -> RequestRecord:
    return RequestRecord("r", "run", "baseline", 0.0, model, "completions", False, 200, 1.0, 1.0)


def test_usual_names_are_kept_as_they_are() -> None:
    for name in ("tiny-llama", "meta-llama/Llama-3.1-70B-Instruct", "", "模型-7b", "a" * 256):
        assert bound_model(name) == name


def test_long_names_are_cut_to_the_byte_bound_on_a_character_boundary() -> None:
    assert bound_model("a" * 5_000_000) == "a" * MODEL_MAX_BYTES
    cut = bound_model("é" * 200)  # 2 bytes each: 128 characters fit
    assert cut == "é" * 128 and len(cut.encode()) == MODEL_MAX_BYTES
    cut = bound_model("a" + "😀" * 100)  # 4 bytes each: the 64th emoji would pass the bound
    assert cut == "a" + "😀" * 63 and len(cut.encode()) == 253


def test_unstorable_characters_are_replaced() -> None:
    assert bound_model("x\ud800y") == "x?y"  # a lone surrogate, as json.loads gives for \\ud800
    assert bound_model("a\x00b") == "a\ufffdb"  # PostgreSQL TEXT rejects NUL


@given(st.text(max_size=400))
def test_any_name_becomes_bounded_valid_utf8(name: str) -> None:
    bounded = bound_model(name)
    raw = bounded.encode("utf-8")  # raises on a lone surrogate
    assert len(raw) <= MODEL_MAX_BYTES and "\x00" not in bounded
    assert bound_model(bounded) == bounded  # stable: a stored value reads back as a key
    clean = name.replace("\x00", "\ufffd").encode("utf-8", "replace")
    assert clean.startswith(raw)  # a prefix, nothing invented


def test_the_record_stores_the_bounded_name() -> None:
    assert _record("m" * 10_000).model == "m" * MODEL_MAX_BYTES
    assert RequestRecord.from_dict(_record("x\ud800" * 300).to_dict()).model == bound_model(
        "x\ud800" * 300
    )


def test_a_rerouted_record_round_trips_and_is_not_comparable() -> None:
    import dataclasses

    from specproxy.records import RerouteReason

    served = _record("m")
    assert served.comparable
    rerouted = dataclasses.replace(
        served, rerouted_from="speculative", reroute_reason=RerouteReason.CONNECT
    )
    assert not rerouted.comparable
    row = rerouted.to_dict()
    assert (row["rerouted_from"], row["reroute_reason"]) == ("speculative", "connect")
    back = RequestRecord.from_dict(row)  # stored strings become the enums again
    assert back == rerouted and back.rerouted_from == "speculative"
    assert back.reroute_reason is RerouteReason.CONNECT
