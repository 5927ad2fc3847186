from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import Any

import pytest

from specproxy.errors import ErrorKind
from specproxy.fastinit import fast_init
from specproxy.records import RECORD_FIELDS, RequestRecord, RerouteReason
from specproxy.timing import Measures


def _twin_classes() -> tuple[type[Any], type[Any]]:
    """The same frozen, slotted dataclass twice: with dataclasses' `__init__` and with ours."""

    def make() -> type[Any]:
        @dataclasses.dataclass(frozen=True, slots=True)
        class Point:
            x: int
            y: str
            z: float | None = None
            tag: str = "t"

            def __post_init__(self) -> None:
                if self.tag != self.tag.lower():
                    object.__setattr__(self, "tag", self.tag.lower())

        return Point

    return make(), fast_init(make())


def _values(obj: Any) -> tuple[Any, ...]:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1, "a"), {}),
        ((1, "a", 2.5), {}),
        ((1, "a", 2.5, "T"), {}),
        ((), {"y": "b", "x": 2, "tag": "Q"}),
        ((3,), {"y": "c", "z": None}),
    ],
)
def test_fields_defaults_and_post_init_are_those_of_the_dataclass(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    plain, fast = _twin_classes()
    assert fast.__init__ is not plain.__init__
    assert _values(fast(*args, **kwargs)) == _values(plain(*args, **kwargs))


def test_the_signature_and_the_argument_errors_are_kept() -> None:
    plain, fast = _twin_classes()
    assert list(inspect.signature(fast).parameters) == list(inspect.signature(plain).parameters)
    for bad_args, bad_kwargs in [((), {}), ((1, "a", 2.5, "t", 9), {}), ((1, "a"), {"w": 1})]:
        with pytest.raises(TypeError):
            plain(*bad_args, **bad_kwargs)
        with pytest.raises(TypeError):
            fast(*bad_args, **bad_kwargs)


def test_the_class_stays_frozen_and_picklable() -> None:
    _, fast = _twin_classes()
    point = fast(1, "a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 2
    assert dataclasses.replace(point, x=5).x == 5
    assert hash(point) == hash(fast(1, "a"))


def test_classes_it_cannot_serve_are_refused() -> None:
    @dataclasses.dataclass(slots=True)
    class Mutable:
        x: int

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        x: list[int] = dataclasses.field(default_factory=list)

    for cls in (Mutable, NoSlots, Factory):
        with pytest.raises(TypeError):
            fast_init(cls)


def test_request_records_and_measures_are_built_by_it() -> None:
    """Every field of the record lands in its slot, by position and by keyword, the model is
    bounded and stored strings become enums (`__post_init__` runs), and a record pickles."""
    assert RequestRecord.__init__.__qualname__ == "RequestRecord.__init__"
    assert Measures.__init__.__qualname__ == "Measures.__init__"
    assert "_set_0" in RequestRecord.__init__.__globals__
    assert "_set_0" in Measures.__init__.__globals__
    values: dict[str, Any] = {name: f"v{i}" for i, name in enumerate(RECORD_FIELDS)}
    values.update(model="m" * 300, error_kind="timeout", reroute_reason="down")
    by_name = RequestRecord(**values)
    by_position = RequestRecord(*values.values())
    assert by_name == by_position
    for name in RECORD_FIELDS:
        if name not in ("model", "error_kind", "reroute_reason"):
            assert getattr(by_name, name) == values[name], name
    assert len(by_name.model.encode()) == 256
    assert by_name.error_kind is ErrorKind.TIMEOUT
    assert by_name.reroute_reason is RerouteReason.DOWN
    assert pickle.loads(pickle.dumps(by_name)) == by_name
