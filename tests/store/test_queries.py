"""The read SQL written once for both dialects (`store.queries`); run against each in test_base."""

from __future__ import annotations

import pytest

from specproxy.errors import StoreError
from specproxy.store.queries import (
    RecordQuery,
    engine_sql,
    export_sql,
    latest_stats_sql,
    placeholders,
    records_sql,
    stats_history_sql,
    with_arm,
)


def test_postgresql_gets_numbered_placeholders_in_order() -> None:
    sql = "SELECT a FROM t WHERE x = ? AND y = ? AND z = ?"
    assert placeholders(sql, "sqlite") == sql
    assert placeholders(sql, "postgresql") == "SELECT a FROM t WHERE x = $1 AND y = $2 AND z = $3"


def test_records_query_filters_in_the_where_clause_with_the_arm_second() -> None:
    query = RecordQuery.of("r", ("t_start", "e2e_s"), since=1.0, until=2.0)
    sql, params = records_sql(query, "postgresql")
    assert sql == (
        "SELECT t_start, e2e_s FROM requests WHERE run_id = $1 AND arm = $2 AND t_start >= $3 "
        "AND t_start < $4 ORDER BY t_start"
    )
    assert with_arm(params, "baseline") == ("r", "baseline", 1.0, 2.0)
    usable = RecordQuery.of("r", ("t_start", "shadow"), usable_only=True)
    sql, params = records_sql(usable, "sqlite")
    assert sql == (
        'SELECT t_start, shadow AS "shadow [specproxy_bool]" FROM requests '
        "WHERE run_id = ? AND arm = ? AND status = 200 AND error_kind IS NULL "
        "AND rerouted_from IS NULL AND disconnected = 0 ORDER BY t_start"
    )
    assert params == ("r",)
    sql, _ = records_sql(usable, "postgresql")
    assert "SELECT t_start, shadow FROM" in sql and "AND NOT disconnected ORDER BY" in sql


def test_a_record_query_takes_record_fields_only() -> None:
    with pytest.raises(StoreError, match="unknown record column"):
        RecordQuery.of("r", ("t_start", "1; DROP TABLE requests"))
    with pytest.raises(StoreError, match="at least one column"):
        RecordQuery.of("r", ())


def test_engine_history_and_export_queries() -> None:
    sql, params = engine_sql("r", 5.0, "speculative", "postgresql")
    assert "WHERE run_id = $1 AND t >= $2 AND arm = $3 ORDER BY t" in sql
    assert params == ("r", 5.0, "speculative")
    assert engine_sql("r", None, None, "sqlite")[1] == ("r",)
    sql, params = stats_history_sql("r", None, "postgresql")
    assert sql == (
        "SELECT t, result::text AS result FROM stats_history WHERE run_id = $1 ORDER BY t, id"
    )
    assert stats_history_sql("r", 3.0, "sqlite") == (
        "SELECT t, result FROM stats_history WHERE run_id = ? AND t >= ? ORDER BY t, id",
        ("r", 3.0),
    )
    assert latest_stats_sql("r", None, "sqlite") == (
        "SELECT t, result FROM stats_history WHERE run_id = ? ORDER BY t DESC, id DESC LIMIT 1",
        ("r",),
    )
    sql, params = latest_stats_sql("r", 4.0, "postgresql")
    assert sql == (
        "SELECT t, result::text AS result FROM stats_history WHERE run_id = $1 AND t > $2 "
        "ORDER BY t DESC, id DESC LIMIT 1"
    )
    assert params == ("r", 4.0)
    assert export_sql(None, "sqlite")[0].endswith("FROM requests ORDER BY t_start")
    sql, params = export_sql("r", "postgresql")
    assert sql.endswith("FROM requests WHERE run_id = $1 ORDER BY t_start") and params == ("r",)
