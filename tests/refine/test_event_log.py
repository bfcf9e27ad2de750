"""The event log: one row per batch per table, appended for all tables in one commit; metrics read by
Prometheus's own parser."""

from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families

from refine.event_log import BatchEvent, EventLog, event_log_location, table_freshness

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def event(table: str, batch: int, seconds: float, lag: float | None = 2.0) -> BatchEvent:
    return BatchEvent(
        table=table,
        batch=batch,
        started_at=AT + timedelta(seconds=batch),
        ended_at=AT + timedelta(seconds=batch + seconds),
        changes_read=10 * batch,
        quarantined=batch % 2,
        spark_jobs=12,
        seconds=seconds,
        newest_source_commit=None if lag is None else AT,
        lag_seconds=lag,
    )


def test_the_batches_of_all_tables_are_appended_in_one_commit_and_give_each_tables_freshness(spark, tmp_path):
    warehouse = str(tmp_path)
    log = EventLog(warehouse)
    log.metrics_file = tmp_path / "metrics" / "cdc.prom"
    for table in ("orders", "customers", 'odd "name"'):
        for batch in range(1, 5):
            log.record(event(table, batch, seconds=float(batch), lag=None if table == "customers" else 2.0 * batch))
    assert log.flush(spark) == 12
    assert log.flush(spark) == 0  # nothing held: no empty commit
    history = spark.sql(f"DESCRIBE HISTORY delta.`{event_log_location(warehouse)}`").collect()
    assert len(history) == 1
    fresh = table_freshness(spark, warehouse)
    assert fresh["orders"].batches == 4
    assert fresh["orders"].last_batch_at == datetime(2026, 12, 1, 12, 0, 8)
    assert (fresh["orders"].batch_p50_s, fresh["orders"].batch_p95_s) == (2.0, 4.0)
    assert fresh["customers"].lag_p95_s is None
    families = {family.name: family for family in text_string_to_metric_families(log.metrics_file.read_text())}
    changes = {sample.labels["table"]: sample.value for sample in families["cdc_refine_changes_read"].samples}
    assert changes == {"orders": 100.0, "customers": 100.0, 'odd "name"': 100.0}
    assert families["cdc_refine_changes_read"].type == "counter"
    assert families["cdc_refine_lag_seconds"].type == "gauge"
    lags = {sample.labels["table"]: sample.value for sample in families["cdc_refine_lag_seconds"].samples}
    assert lags == {"orders": 8.0, 'odd "name"': 8.0}
    last = families["cdc_refine_last_batch_timestamp_seconds"].samples
    assert {s.value for s in last} == {(AT + timedelta(seconds=8)).timestamp()}  # every digit of epoch seconds


def test_a_failed_append_keeps_the_rows_for_the_next_flush(spark, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    log = EventLog(str(blocked))  # <file>/_cdc/events cannot be made
    log.record(event("orders", 1, 1.0))
    assert log.flush(spark) == 0
    assert log.last_error is not None
    assert len(log.pending) == 1
    log.warehouse = str(tmp_path / "warehouse")
    assert log.flush(spark) == 1
