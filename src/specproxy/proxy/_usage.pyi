# The compiled `specproxy.proxy.usage._object_after` for plain JSON (`_usage.c`):
# (0, None) not found, (1, None) unsure, (2, value), or (3, None): left to the reference.
from typing import Any

def object_after(payload: bytes, key: bytes, /) -> tuple[int, Any]: ...
