package cdc.jvm;

import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.util.sketch.BloomFilter;

/**
 * Whether a broadcast Bloom filter may hold a long: false means it surely does not; null for null.
 *
 * A MERGE's condition tests the target's key hash with it, so that Spark drops the rows of the
 * refined table no key of the batch can match before its join shuffles them. The filter travels
 * as a broadcast variable rather than a literal: Delta writes a MERGE's condition into the
 * commit, where a literal filter would add ~2.4 MB of text per million keys to the table's log.
 */
public final class MightContain implements UDF1<Long, Boolean> {
  private static final long serialVersionUID = 1L;

  private final Broadcast<BloomFilter> filter;

  public MightContain(Broadcast<BloomFilter> filter) {
    this.filter = filter;
  }

  @Override
  public Boolean call(Long value) {
    return value == null ? null : filter.value().mightContainLong(value);
  }
}
