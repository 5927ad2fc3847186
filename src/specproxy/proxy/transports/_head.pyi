# The compiled `specproxy.proxy.transports.head.split_head` (`_head.c`); `head.py_split_head` is
# the reference with the same results.
def split_head(
    raw: bytes, /
) -> tuple[int, str, bool, list[tuple[str, str]], str | None, str | None, list[str]] | None: ...
