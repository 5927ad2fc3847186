"""Persistence of request records, engine samples and stats history (see `base.Store`)."""

from specproxy.store.base import ArmArrays, Store

__all__ = ["ArmArrays", "Store"]
