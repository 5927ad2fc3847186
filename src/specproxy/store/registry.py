"""Which backend serves which store URL scheme: the one list of store schemes.

`BACKEND_MODULES` maps each scheme to the module that defines its backend, and each backend class
registers itself for its schemes with `@register_backend(...)` (guidellm's `@Backend.register`).
`open_store` looks the scheme up here, imports only that module (so one backend's driver, such as
asyncpg, never loads for another) and builds the class it registered; `StoreConfig` validates its
URL against `STORE_SCHEMES`. This module imports nothing but `specproxy.errors`, so the config can
read it without importing any backend.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final, TypeVar

from specproxy.errors import ConfigError

__all__ = ["BACKEND_MODULES", "STORE_SCHEMES", "backend_class", "register_backend"]

BACKEND_MODULES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "sqlite": "specproxy.store.sqlite",
        "postgresql": "specproxy.store.postgres",
        "postgres": "specproxy.store.postgres",
        "memory": "specproxy.store.memory",
    }
)
STORE_SCHEMES: Final[tuple[str, ...]] = tuple(BACKEND_MODULES)

_T = TypeVar("_T", bound=type)
_registered: dict[str, type] = {}


def register_backend(*schemes: str) -> Callable[[_T], _T]:
    """Class decorator: the backend serving `schemes`; each must name this class's module."""

    def register(cls: _T) -> _T:
        for scheme in schemes:
            if BACKEND_MODULES.get(scheme) != cls.__module__:
                raise ValueError(
                    f"{scheme}:// must map to {cls.__module__} in store.registry.BACKEND_MODULES"
                )
            _registered[scheme] = cls
        return cls

    return register


def backend_class(scheme: str) -> type:
    """The class registered for `scheme`, importing its module on first use."""
    module = BACKEND_MODULES.get(scheme)
    if module is None:
        known = ", ".join(f"{s}://" for s in STORE_SCHEMES)
        raise ConfigError(f"store.url scheme {scheme!r} is not one of {known}")
    importlib.import_module(module)
    try:
        return _registered[scheme]
    except KeyError:
        raise ConfigError(f"{module} registers no backend for {scheme}://") from None
