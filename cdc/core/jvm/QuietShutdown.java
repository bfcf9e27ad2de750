package cdc.jvm;

import java.io.ByteArrayOutputStream;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import org.apache.hadoop.util.ShutdownHookManager;
import org.apache.logging.log4j.LogManager;
import org.apache.logging.log4j.Logger;
import org.apache.logging.log4j.core.LoggerContext;
import org.apache.logging.log4j.core.config.Configuration;
import org.apache.logging.log4j.core.config.LoggerConfig;

/**
 * Takes the terminal's log appender ("console") off every logger when the JVM starts to shut down
 * (or when a job stopping on a signal runs it first, from Python).
 *
 * A service manager stops a job by signalling its process group, so the driver JVM gets the same
 * SIGTERM as Python: Spark's shutdown hook then stops the SparkContext under a running micro-batch,
 * and each component of the batch logs its cut-short work at ERROR ("Job cancelled because
 * SparkContext was shut down", aborted writes). The batch is replayed by the next run; those lines
 * still reach the log file. Runs before Spark's own hooks (priority 40 in Hadoop's manager).
 *
 * What the JVM then prints to its standard error without a logger (a Scala Future rejected by a
 * thread pool shutting down prints its stack trace there) goes to the log file too, line by line.
 */
public final class QuietShutdown implements Runnable {
  public static final int PRIORITY = 100;
  private static boolean installed = false;

  /** Install the hook once per JVM. */
  public static synchronized void install() {
    if (!installed) {
      ShutdownHookManager.get().addShutdownHook(new QuietShutdown(), PRIORITY);
      installed = true;
    }
  }

  @Override
  public void run() {
    LoggerContext context = (LoggerContext) LogManager.getContext(false);
    Configuration configuration = context.getConfiguration();
    configuration.getRootLogger().removeAppender("console");
    for (LoggerConfig logger : configuration.getLoggers().values()) {
      logger.removeAppender("console");
    }
    context.updateLoggers();
    if (!(System.err instanceof LoggedLines)) {
      System.err.flush();
      System.setErr(new LoggedLines(LogManager.getLogger("stderr")));
    }
  }

  /** A stream whose lines go to a logger at WARN (the log file only, once the console is off). */
  private static final class LoggedLines extends PrintStream {
    LoggedLines(Logger logger) {
      super(new LineLogger(logger), true, StandardCharsets.UTF_8);
    }
  }

  private static final class LineLogger extends OutputStream {
    private final Logger logger;
    private final ByteArrayOutputStream line = new ByteArrayOutputStream();

    LineLogger(Logger logger) {
      this.logger = logger;
    }

    @Override
    public synchronized void write(int b) {
      if (b == '\n') {
        flush();
      } else {
        line.write(b);
      }
    }

    @Override
    public synchronized void flush() {
      if (line.size() > 0) {
        logger.warn(line.toString(StandardCharsets.UTF_8));
        line.reset();
      }
    }
  }
}
