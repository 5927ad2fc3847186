# The compiled `split_head` and `take_chunked` of `specproxy.proxy.transports.wire` (`_wire.c`);
# `wire.py_split_head` and `wire.py_take_chunked` are the references with the same results.
def split_head(
    raw: bytes, drop: tuple[str, ...], /
) -> (
    tuple[
        int,
        str,
        bool,
        list[tuple[str, str]],
        list[tuple[str, str]],
        str | None,
        str | None,
        str | None,
        list[str],
    ]
    | None
): ...
def take_chunked(buf: bytearray, left: int, /) -> tuple[bytes, int, bool]: ...
