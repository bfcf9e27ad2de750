"""Primary-key changes of rows with TOASTed values, from a real Debezium connector to the refined table."""

import psycopg
import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cdc.stack.workload import run_workload
from refine.toast import TOAST_PLACEHOLDER

pytestmark = pytest.mark.integration


def change_primary_keys(dsn: str) -> None:
    """Re-key a row refined earlier, and a row inserted and updated (TOAST placeholder) since."""
    with psycopg.connect(dsn) as conn:
        refined_earlier = conn.execute("SELECT min(id) FROM shop.customers").fetchone()[0]
        conn.execute("UPDATE shop.customers SET id = id + 1000 WHERE id = %s", (refined_earlier,))
    run_workload(dsn, customers=2, seed=32)  # updates its first customer, leaving the TOASTed notes alone
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE shop.customers SET id = id + 1000 WHERE id = (SELECT min(id) FROM shop.customers "
                     "WHERE id > %s)", (refined_earlier + 1000,))  # fmt: skip


def test_new_key_takes_the_old_rows_toasted_values(kafka, stack_config, postgres_connector, tmp_path, wait_for,
                                                    land_and_refine, postgres_table, refined_table):  # fmt: skip
    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    topic = f"{postgres_connector.topic_prefix}.shop.customers"
    run_workload(dsn, customers=3, seed=31)
    kafka.wait_for_last_value(topic, lambda value: value is None)  # the workload ends with a delete
    land_and_refine(warehouse, topic)

    change_primary_keys(dsn)

    def rekeyed_creates() -> list[tuple]:
        return [record for record in kafka.records(topic) if any(key == "__debezium.oldkey" for key, _ in record[5])]

    wait_for(lambda: len(rekeyed_creates()) == 2, 60, "both primary-key changes in Kafka", 0.5)
    assert all(TOAST_PLACEHOLDER.encode() in record[4] for record in rekeyed_creates())
    for _ in range(2):  # a rerun changes nothing
        land_and_refine(warehouse, topic)
        assertDataFrameEqual(refined_table(warehouse, topic), postgres_table("customers"))
    assert refined_table(warehouse, topic).where(F.col("notes") == TOAST_PLACEHOLDER).count() == 0


def test_new_key_in_the_batch_after_the_old_keys_delete(kafka, stack_config, postgres_connector, tmp_path, unique_name,
                                                        wait_for, land_and_refine, postgres_table, refined_table):  # fmt: skip
    """Raw landing may end a batch between the delete of the old key and the create of the new one."""
    dsn, warehouse = stack_config.postgres.dsn(), str(tmp_path)
    topic = f"{postgres_connector.topic_prefix}.shop.customers"
    run_workload(dsn, customers=2, seed=33)
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE shop.customers SET id = id + 1000 WHERE id = (SELECT min(id) FROM shop.customers)")
    records: list[tuple] = []

    def ends_with_the_rekeyed_create() -> bool:
        # The new key's create carries the old key in a header; the workload's own creates do not.
        records[:] = kafka.records(topic)
        return bool(records) and any(key == "__debezium.oldkey" for key, _ in records[-1][5])

    wait_for(ends_with_the_rekeyed_create, 60, "the primary-key change in Kafka", 0.5)
    split = len(records) - 1  # the delete and its tombstone in the first batch, the create in the next
    copy = kafka.create_topic(f"{unique_name}.copy")
    for chunk in (records[:split], records[split:]):
        kafka.produce_again(copy, chunk)
        land_and_refine(warehouse, copy)
    assertDataFrameEqual(refined_table(warehouse, copy), postgres_table("customers"))
