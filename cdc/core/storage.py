"""Small file operations on the warehouse through Hadoop's FileSystem, so that a local path and an
object-store URI (s3a://, abfss://, gs://) behave the same. Metadata only: listings, checkpoint
files and probes, never table data."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from py4j.java_gateway import is_instance_of
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from cdc.core.errors import TableError

_ASIDE = ".next"  # where Storage.replace_text writes a file's new text before it takes the file's place


def normalize_location(location: str) -> str:
    """A URI stays as it is; a local path becomes absolute (and gets no scheme)."""
    if "://" in location or location.startswith("file:"):
        return location.rstrip("/")
    return str(Path(location).expanduser().absolute())


def _java_reason(error: Py4JJavaError) -> str:
    """The Java exception's class and message, on one line."""
    java = error.java_exception
    message = " ".join(str(java.getMessage() or "").split())
    return f"{java.getClass().getSimpleName()}: {message}" if message else str(java.getClass().getName())


@contextmanager
def storage_errors(spark: SparkSession, location: str) -> Iterator[None]:
    """The file system's I/O failures (an object store refusing the keys, a network error) as one
    TableError naming the location and the store's reason, instead of py4j's traceback."""
    try:
        yield
    except Py4JJavaError as error:
        if not is_instance_of(spark.sparkContext._gateway, error.java_exception, "java.io.IOException"):
            raise
        raise TableError(f"the warehouse's storage failed: {_java_reason(error)}", location=location) from None


class Storage:
    """File operations on any Hadoop-supported file system, run on the driver. An I/O failure of the
    file system is a :class:`TableError` naming the location and the reason."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        self._jvm: Any = spark._jvm  # py4j's view of the JVM: untyped
        self._conf = spark._jsc.hadoopConfiguration()

    def _fs(self, location: str) -> tuple[Any, Any]:
        path = self._jvm.org.apache.hadoop.fs.Path(location)
        return path.getFileSystem(self._conf), path

    def exists(self, location: str) -> bool:
        with storage_errors(self._spark, location):
            fs, path = self._fs(location)
            return bool(fs.exists(path))

    def list_names(self, location: str) -> list[str]:
        """Names of the entries in a folder ([] when it does not exist)."""
        with storage_errors(self._spark, location):
            fs, path = self._fs(location)
            if not fs.exists(path):
                return []
            return sorted(status.getPath().getName() for status in fs.listStatus(path))

    def file_names(self, location: str) -> list[str]:
        """Names of the files under a folder, at any depth ([] when it does not exist)."""
        with storage_errors(self._spark, location):
            fs, path = self._fs(location)
            if not fs.exists(path):
                return []
            files, names = fs.listFiles(path, True), []
            while files.hasNext():
                names.append(files.next().getPath().getName())
            return sorted(names)

    def last_modified(self, location: str) -> float:
        """When anything at ``location`` (the folder itself, or a file or folder at any depth) last
        changed, in seconds since the epoch (0 when nothing is there)."""
        with storage_errors(self._spark, location):
            fs, path = self._fs(location)
            if not fs.exists(path):
                return 0.0
            newest, folders = 0, [fs.getFileStatus(path)]
            while folders:
                status = folders.pop()
                newest = max(newest, status.getModificationTime())
                if status.isDirectory():
                    folders.extend(fs.listStatus(status.getPath()))
            return newest / 1000

    def read_text(self, location: str) -> str:
        with storage_errors(self._spark, location):
            fs, path = self._fs(location)
            stream = fs.open(path)
            try:
                reader = self._jvm.java.io.BufferedReader(self._jvm.java.io.InputStreamReader(stream, "UTF-8"))
                lines = []
                while (line := reader.readLine()) is not None:
                    lines.append(line)
                return "\n".join(lines)
            finally:
                stream.close()

    def write_text(self, location: str, text: str) -> None:
        """Write (or replace) a small UTF-8 text file, creating its folder."""
        with storage_errors(self._spark, location):
            fs, path = self._fs(location)
            fs.mkdirs(path.getParent())
            self._write(fs, path, text.encode("utf-8"))

    def replace_text(self, location: str, text: str) -> None:
        """Replace a small UTF-8 text file whole or not at all, for :meth:`read_replaced_text`: the text is
        written beside it first, then takes its place. Hadoop's rename refuses to overwrite, so the file is
        removed in between; a reader finding it gone, or torn, reads the one beside it."""
        with storage_errors(self._spark, location):
            fs, path = self._fs(location)
            fs.mkdirs(path.getParent())
            aside = self._jvm.org.apache.hadoop.fs.Path(f"{location}{_ASIDE}")
            self._write(fs, aside, text.encode("utf-8"))
            fs.delete(path, False)
            if not fs.rename(aside, path):
                raise OSError(f"could not rename {location}{_ASIDE} to {location}")

    def read_replaced_text(self, location: str, whole: Callable[[str], bool]) -> str | None:
        """The text of a file written by :meth:`replace_text`: the file's when it is ``whole``, else the one
        written beside it when that is (a replacement cut short), else None."""
        for candidate in (location, f"{location}{_ASIDE}"):
            if self.exists(candidate) and whole(text := self.read_text(candidate)):
                return text
        return None

    def _write(self, fs: Any, path: Any, data: bytes) -> None:
        stream = fs.create(path, True)
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()

    def delete(self, location: str) -> None:
        with storage_errors(self._spark, location):
            fs, path = self._fs(location)
            fs.delete(path, True)

    def ensure_writable(self, location: str) -> None:
        """Create the folder and write and remove a probe file in it, or fail saying why."""
        probe = f"{location}/_cdc_write_probe"
        try:
            fs, path = self._fs(probe)
            fs.mkdirs(path.getParent())
            fs.create(path, True).close()
            fs.delete(path, False)
        except Exception as error:  # noqa: BLE001 - py4j wraps the JVM's IOException
            reason = str(error).split("\n", 2)[1] if "\n" in str(error) else str(error)
            raise TableError(f"the warehouse is not writable: {reason.strip()}", location=location) from None
