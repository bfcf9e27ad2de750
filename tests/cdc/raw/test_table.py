"""Raw tables' Parquet settings: set at creation, added to tables of earlier versions, honoured by Delta."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from delta.tables import DeltaTable

from cdc.core.errors import TableError
from cdc.core.tables import CHECKPOINT_PROPERTIES, is_delta_table, raw_table_topic
from cdc.raw.rows import raw_rows
from cdc.raw.table import PARQUET_PROPERTIES, PAYLOAD_COLUMNS, create_raw_table


def append_records(kafka_records, table: str, first_offset: int, count: int) -> None:
    """``count`` records whose keys and values repeat (Parquet would keep them in a dictionary), one
    invalid UTF-8 value among them (so value_bytes is written too)."""
    records = [
        (
            f"k{offset % 3}".encode(),
            b"\xff" if offset == first_offset else f"v{offset % 3}".encode(),
            "t",
            0,
            offset,
            datetime(2026, 1, 1),
            0,
            None,
        )
        for offset in range(first_offset, first_offset + count)
    ]
    raw_rows(kafka_records(records), first_offset).write.format("delta").mode("append").save(table)


def column_chunks(table: str) -> dict[str, list]:
    """Every Parquet column chunk's metadata of the table's files, by column."""
    chunks: dict[str, list] = {}
    for file in Path(table).rglob("*.parquet"):
        metadata = pq.ParquetFile(file).metadata
        for group in range(metadata.num_row_groups):
            for index in range(metadata.num_columns):
                chunk = metadata.row_group(group).column(index)
                chunks.setdefault(chunk.path_in_schema, []).append(chunk)
    return chunks


def test_payload_columns_are_written_without_dictionary_or_statistics(spark, kafka_records, tmp_path):
    table = str(tmp_path / "raw" / "t")
    create_raw_table(spark, table, "t")
    append_records(kafka_records, table, 0, 100)
    chunks = column_chunks(table)
    for column in PAYLOAD_COLUMNS:
        assert chunks[column], column
        for chunk in chunks[column]:
            assert not chunk.has_dictionary_page, (column, chunk)
            assert chunk.statistics is None, (column, chunk)
    # The other columns keep Parquet's defaults.
    assert all(chunk.has_dictionary_page and chunk.statistics is not None for chunk in chunks["topic"])


def test_a_new_raw_table_is_append_only_with_a_change_feed_and_a_checkpoint_every_100_commits(spark, tmp_path):
    table = str(tmp_path / "raw" / "t")
    create_raw_table(spark, table, "t")
    properties = DeltaTable.forPath(spark, table).detail().select("properties").head()[0]
    assert properties["delta.appendOnly"] == properties["delta.enableChangeDataFeed"] == "true"
    assert properties["delta.checkpointInterval"] == "100"
    assert (properties["cdc.kind"], properties["cdc.topic"], properties["cdc.reset.allowed"]) == ("raw", "t", "false")


def test_a_raw_table_of_an_earlier_version_gets_the_settings_and_its_change_feed_reads_on(
    spark, kafka_records, tmp_path
):
    table, copy = str(tmp_path / "raw" / "t"), str(tmp_path / "copy")
    create_raw_table(spark, table, "t")
    settings = PARQUET_PROPERTIES | CHECKPOINT_PROPERTIES
    keys = ", ".join(f"'{key}'" for key in settings)
    spark.sql(f"ALTER TABLE delta.`{table}` UNSET TBLPROPERTIES ({keys})")  # as an earlier version created it
    append_records(kafka_records, table, 0, 5)

    def copy_change_feed() -> None:  # as refine reads it: a stream with a checkpoint
        (
            spark.readStream.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", 0)
            .load(table)
            .select("offset")
            .writeStream.format("delta")
            .option("checkpointLocation", f"{copy}/_checkpoint")
            .trigger(availableNow=True)
            .start(copy)
            .awaitTermination()
        )

    copy_change_feed()
    create_raw_table(spark, table, "t")  # a later run: adds the settings
    properties = DeltaTable.forPath(spark, table).detail().select("properties").head()[0]
    assert {key: properties.get(key) for key in settings} == settings
    version = DeltaTable.forPath(spark, table).history(1).head().version
    create_raw_table(spark, table, "t")  # nothing missing: no commit
    assert DeltaTable.forPath(spark, table).history(1).head().version == version
    append_records(kafka_records, table, 5, 5)
    copy_change_feed()
    assert sorted(row.offset for row in spark.read.format("delta").load(copy).collect()) == list(range(10))


def test_a_table_is_found_by_its_first_commit_or_after_log_cleanup_by_its_last_checkpoint(spark, tmp_path):
    table = str(tmp_path / "t")
    assert not is_delta_table(spark, table)
    (tmp_path / "t" / "_delta_log").mkdir(parents=True)  # another writer is creating it
    assert not is_delta_table(spark, table)
    for _ in range(11):  # a checkpoint at version 10
        spark.range(1).write.format("delta").mode("append").save(table)
    assert is_delta_table(spark, table)
    log = tmp_path / "t" / "_delta_log"
    assert (log / "_last_checkpoint").exists()
    for version in range(10):  # as log cleanup leaves it
        (log / f"{version:020d}.json").unlink()
    assert is_delta_table(spark, table)
    assert spark.read.format("delta").load(table).count() == 11


def test_a_creation_cut_short_is_finished_but_a_location_holding_data_or_versions_is_refused(spark, tmp_path):
    interrupted = tmp_path / "interrupted"
    # What a kill -9 while Delta created the table left: the log's folders, a commit's temporary file.
    (interrupted / "_delta_log" / "_staged_commits").mkdir(parents=True)
    (interrupted / "_delta_log" / f".{0:020d}.json.8c1f.tmp").write_text("{")
    create_raw_table(spark, str(interrupted), "t")
    assert raw_table_topic(spark, str(interrupted)) == "t"
    assert spark.read.format("delta").load(str(interrupted)).count() == 0

    data = tmp_path / "data"
    (data / "_delta_log").mkdir(parents=True)
    (data / "part-00000.parquet").write_bytes(b"PAR1")
    versions = tmp_path / "versions"
    (versions / "_delta_log").mkdir(parents=True)
    (versions / "_delta_log" / f"{1:020d}.json").write_text("{}")
    for location in (data, versions):
        with pytest.raises(TableError, match="the location holds files but no Delta table"):
            create_raw_table(spark, str(location), "t")
