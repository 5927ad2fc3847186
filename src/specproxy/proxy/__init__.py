"""The proxy's request path: routing (pure), SSE scanning (pure), forwarding and recording."""

from specproxy.proxy.headers import ARM_HEADER, REQUEST_ID_HEADER
from specproxy.proxy.lifecycle import MEASURED_ENDPOINTS, Forwarder
from specproxy.proxy.recorder import MemoryRecorder
from specproxy.proxy.routing import FORCED_ARM_HEADER, ForcedArmError, Router, sticky_point
from specproxy.proxy.sse import SSEScanner, count_token_ids

__all__ = [
    "ARM_HEADER",
    "FORCED_ARM_HEADER",
    "MEASURED_ENDPOINTS",
    "REQUEST_ID_HEADER",
    "ForcedArmError",
    "Forwarder",
    "MemoryRecorder",
    "Router",
    "SSEScanner",
    "count_token_ids",
    "sticky_point",
]
