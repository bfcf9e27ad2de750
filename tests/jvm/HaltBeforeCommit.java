package cdc.testing;

import io.delta.storage.HDFSLogStore;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.regex.Pattern;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;

/**
 * A fault-injection point for tests: Delta's log store for local tables, which halts the JVM at once
 * (as SIGKILL would: no shutdown hook runs) when it is about to write a chosen commit, after the
 * transaction's data files are written and before the commit that would make them part of the table.
 *
 * Compiled by tests/refine/test_kill_points.py and put on the driver's class path there; off unless a
 * test turns it on, with two Spark settings (CDC_SPARK__CONF):
 * {@code spark.delta.logStore.file.impl=cdc.testing.HaltBeforeCommit} and
 * {@code spark.hadoop.cdc.halt-before-commit=<end of a table's path>@<version>}: the first commit of
 * that table at or after that version that adds data files (not a commit of settings alone). Any other
 * commit is written as Delta's own HDFSLogStore writes it.
 */
public final class HaltBeforeCommit extends HDFSLogStore {
  public static final String SETTING = "cdc.halt-before-commit";
  public static final int EXIT_CODE = 137; // what a shell reports for a process killed by SIGKILL
  private static final Pattern COMMIT = Pattern.compile("\\d{20}\\.json");

  public HaltBeforeCommit(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    String point = hadoopConf.get(SETTING, "");
    int at = point.lastIndexOf('@');
    Path table = path.getParent() == null ? null : path.getParent().getParent();
    if (at > 0 && table != null && COMMIT.matcher(path.getName()).matches()
        && table.toString().endsWith(point.substring(0, at))
        && Long.parseLong(path.getName().substring(0, 20)) >= Long.parseLong(point.substring(at + 1))) {
      List<String> lines = new ArrayList<>();
      actions.forEachRemaining(lines::add);
      if (lines.stream().anyMatch(line -> line.startsWith("{\"add\""))) {
        System.err.println("cdc: halting before commit " + path);
        Runtime.getRuntime().halt(EXIT_CODE);
      }
      actions = lines.iterator();
    }
    super.write(path, actions, overwrite, hadoopConf);
  }
}
