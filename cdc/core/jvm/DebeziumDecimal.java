package cdc.jvm;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.Base64;

import org.apache.spark.sql.api.java.UDF2;

/**
 * A Debezium precise decimal as plain text (null when it is not base64 or holds no byte): the base64
 * of a big-endian two's-complement unscaled integer, and its scale.
 *
 * Spark's expressions decode it as text through hex and conv, and cannot share the parts of that
 * expression under its conditions: they evaluated conv 4-6 times per value, ~15% of a refine's CPU
 * with one decimal column.
 */
public final class DebeziumDecimal implements UDF2<String, Integer, String> {
  private static final long serialVersionUID = 1L;

  @Override
  public String call(String base64, Integer scale) {
    if (base64 == null || scale == null) {
      return null;
    }
    byte[] unscaled;
    try {
      unscaled = Base64.getDecoder().decode(base64);
    } catch (IllegalArgumentException notBase64) {
      return null;
    }
    return unscaled.length == 0 ? null : new BigDecimal(new BigInteger(unscaled), scale).toPlainString();
  }
}
