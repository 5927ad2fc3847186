"""specproxy: prove, on live traffic, whether speculative decoding makes a vLLM service faster."""

from specproxy.config import Config
from specproxy.errors import ConfigError, SpecProxyError
from specproxy.records import Arm, RequestRecord

__all__ = ["Arm", "Config", "ConfigError", "RequestRecord", "SpecProxyError", "__version__"]

__version__ = "0.1.0"
