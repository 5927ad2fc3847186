# The compiled `specproxy.proxy.transports.head.split_head` (`_head.c`); `head.py_split_head` is
# the reference with the same results.
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
