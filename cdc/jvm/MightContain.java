package cdc.jvm;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.UncheckedIOException;

import org.apache.spark.util.sketch.BloomFilter;

import org.apache.spark.sql.api.java.UDF2;

/**
 * Whether a serialized Spark Bloom filter (BloomFilter.writeTo) may hold a long: false means it
 * surely does not; null for a null long.
 *
 * A MERGE's condition uses it on the target's key hash, so that Spark drops the rows of the
 * refined table no key of the batch can match before its join shuffles them. The filter arrives
 * as the same literal array for every row of a task, so it is read once per array and thread.
 */
public final class MightContain implements UDF2<byte[], Long, Boolean> {
  private static final long serialVersionUID = 1L;

  private static final ThreadLocal<Object[]> LAST_READ = ThreadLocal.withInitial(() -> new Object[2]);

  @Override
  public Boolean call(byte[] serialized, Long value) {
    if (value == null) {
      return null;
    }
    Object[] last = LAST_READ.get();
    if (last[0] != serialized) {
      try {
        last[1] = BloomFilter.readFrom(new ByteArrayInputStream(serialized));
      } catch (IOException error) {
        throw new UncheckedIOException("not a serialized Bloom filter", error);
      }
      last[0] = serialized;
    }
    return ((BloomFilter) last[1]).mightContainLong(value);
  }
}
