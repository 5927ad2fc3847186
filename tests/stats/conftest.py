"""The filled store of the job tests (`tests.stats.job.conftest`) for every stats test."""

from tests.stats.job.store_fixture import store

__all__ = ["store"]
