from cdc.core.source import PartitionOffsets
from cdc.core.storage import Storage
from cdc.raw.checkpoint import committed_offsets
from cdc.raw.gaps import OffsetGap, find_gaps, record_gaps


def test_a_gap_is_what_kafka_deleted_before_it_was_read():
    next_offsets = {("t", 0): 100, ("t", 1): 50, ("t", 2): 7}
    kafka = {("t", 0): PartitionOffsets(150, 300), ("t", 1): PartitionOffsets(50, 60), ("t", 2): PartitionOffsets(0, 7)}
    assert find_gaps(next_offsets, kafka) == [OffsetGap("t", 0, 100, 149)]


def test_committed_offsets_come_from_the_last_committed_batch(spark, tmp_path):
    checkpoint = tmp_path / "cp"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    for batch, offsets in ((0, '{"t":{"0":10,"1":4}}'), (1, '{"t":{"0":20,"1":9}}'), (2, '{"t":{"0":30,"1":9}}')):
        (checkpoint / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{offsets}')
    for batch in (0, 1):  # batch 2 was planned but never committed
        (checkpoint / "commits" / str(batch)).write_text("v1\n{}")
    (checkpoint / "commits" / ".1.crc").write_text("")
    assert committed_offsets(Storage(spark), str(checkpoint)) == {("t", 0): 20, ("t", 1): 9}
    assert committed_offsets(Storage(spark), str(tmp_path / "none")) == {}


def test_a_gap_recorded_again_is_kept_once_and_grows_with_what_kafka_deleted_since(spark, tmp_path):
    gaps_table = str(tmp_path / "gaps")
    record_gaps(spark, gaps_table, "raw/t", [OffsetGap("t", 0, 100, 149)])
    record_gaps(spark, gaps_table, "raw/t", [OffsetGap("t", 0, 100, 149), OffsetGap("t", 1, 5, 9)])
    record_gaps(spark, gaps_table, "raw/t", [OffsetGap("t", 0, 100, 180)])  # found again later: more is gone
    record_gaps(spark, gaps_table, "raw/t", [OffsetGap("t", 0, 100, 149)])  # an older sight of it
    rows = spark.read.format("delta").load(gaps_table).collect()
    assert sorted((row.partition, row.first_missing, row.last_missing) for row in rows) == [(0, 100, 180), (1, 5, 9)]
