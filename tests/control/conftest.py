"""Fixtures of the arm-control tests: the store tests' real PostgreSQL cluster."""

from tests.store.conftest import pg_cluster, pg_url  # noqa: F401 - fixtures
