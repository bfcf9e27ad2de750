package cdc.jvm;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import scala.Console$;

/**
 * Catches what Scala code prints with {@code println} on the calling thread (Scala's {@code
 * Console.out}, a per-thread variable), such as Delta's VACUUM summary, which would otherwise go
 * straight to the process's standard output, between the project's own lines.
 */
public final class ConsoleCapture {
  private final ByteArrayOutputStream buffer = new ByteArrayOutputStream();
  private PrintStream previous;

  /** From now on, this thread's Scala {@code println}s go into this capture. */
  public void start() {
    previous = Console$.MODULE$.out();
    Console$.MODULE$.setOutDirect(new PrintStream(buffer, true, StandardCharsets.UTF_8));
  }

  /** This thread's Scala output as before; returns what was printed meanwhile. */
  public String stop() {
    if (previous != null) {
      Console$.MODULE$.setOutDirect(previous);
      previous = null;
    }
    return buffer.toString(StandardCharsets.UTF_8);
  }
}
