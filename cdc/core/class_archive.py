"""A class-data-sharing archive for the Spark driver's JVM: Spark's, Delta's and Scala's classes parsed
and verified once, then mapped by every later JVM instead of loaded again from the jars.

A fresh JVM that lands or refines a batch loads ~20,000 classes, each read from its jar, parsed and
verified: seconds of a scheduled run and of the first batches of a continuous one, on two cores. The
JDK's dynamic class-data sharing (``-XX:ArchiveClassesAtExit``, JDK 13 and later) writes the classes
one run loaded to a file; a JVM started with ``-XX:SharedArchiveFile`` maps them from it.

:func:`build` makes that archive with a training run (a small raw landing and two refines, in a JVM
of their own, on tables in a temporary folder: no Kafka needed) and keeps it in the jars cache, named
by a digest of what it is only valid for (the JDK, pyspark's jars, the session's jars). ``cdc jars
fetch`` builds it; a local session (:func:`cdc.core.session.build_spark_session`) uses the archive of its
digest when it exists. A JVM that finds the archive does not match it ignores it and loads classes as
usual (``-Xshare:auto``, the JDK's default), so a stale or missing archive costs time, never a run.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from cdc.core.errors import DependencyError
from cdc.core.jars import built_once

# The JDK's own messages about the archive (classes it skips while writing, an archive it will not
# use) are for JDK developers: the archive is an optimisation, and a run without it is still right.
_QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def archive_path(cache_dir: Path, java: str, jars: list[str]) -> Path:
    """Where the archive for this JDK (``java``, the launcher Spark starts), this pyspark's jars and
    these jars (the session's ``spark.jars``) is kept: any change to them names another file."""
    import pyspark

    jdk = Path(os.path.realpath(java)).parent.parent
    release = jdk / "release"
    pyspark_jars = sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    parts = [str(jdk), release.read_text() if release.exists() else ""]
    # The JVM maps an archive only for the class path it was written with, jar for jar (path, size
    # and time): another virtualenv's pyspark, even of the same version, needs an archive of its own.
    parts += [
        f"{path} {Path(path).stat().st_size} {Path(path).stat().st_mtime_ns}"
        for path in [*map(str, pyspark_jars), *jars]
    ]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return cache_dir / "class-archives" / f"spark-{digest}.jsa"


def java_options(cache_dir: Path, java: str, jars: list[str]) -> list[str]:
    """The driver JVM's options that map the archive, when there is one for this JDK and these jars."""
    archive = archive_path(cache_dir, java, jars)
    return [f"-XX:SharedArchiveFile={archive}", *_QUIET] if archive.exists() else []


def build(cache_dir: Path, java: str, jars: list[str]) -> Path:
    """The archive for this JDK and these jars: made by a training run in a process of its own on the
    first call (~1 minute), then found in the cache."""
    archive = archive_path(cache_dir, java, jars)
    return built_once(cache_dir, lambda: archive if archive.exists() else None, lambda: _train(archive))


def _train(archive: Path) -> Path:
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    # The child builds its session from the same settings as the caller, so with the same jars.
    conf = json.loads(os.environ.get("CDC_SPARK__CONF") or "{}")
    conf["spark.driver.extraJavaOptions"] = " ".join([f"-XX:ArchiveClassesAtExit={partial}", *_QUIET])
    env = {**os.environ, "CDC_SPARK__CONF": json.dumps(conf)}
    result = subprocess.run(
        [sys.executable, "-m", "cdc.class_training"], env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0 or not partial.exists() or partial.stat().st_size == 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        partial.unlink(missing_ok=True)
        raise DependencyError(f"the training run of the JVM class archive failed:\n{tail}", archive=str(archive))
    partial.rename(archive)
    return archive
