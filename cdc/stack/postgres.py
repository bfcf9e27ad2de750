"""PostgreSQL from the system's packages, with logical decoding for Debezium, and the demo schema."""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import psycopg

from cdc.core.config import StackConfig
from cdc.core.errors import DependencyError, StackError
from cdc.stack.base import POSTGRES
from cdc.stack.component import Component
from cdc.stack.process import account_kwargs


def remove_connector(stack: StackConfig, connector) -> None:
    """Delete a Debezium Postgres connector (a ``connectors.definitions.ConnectorDefinition``) from Kafka
    Connect, then drop its replication slot and publication (a slot left behind keeps WAL forever)."""
    import time

    from connectors.client import ConnectClient

    client = ConnectClient(stack.connect.url)
    if connector.name in client.connectors():  # it may never have been registered
        client.delete(connector.name)
    slot, publication = connector.config["slot.name"], connector.config["publication.name"]
    with psycopg.connect(stack.postgres.dsn(), autocommit=True) as conn:
        deadline = time.monotonic() + 60
        # The slot stays active until the stopped task lets go of its replication connection.
        while conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone() == (
            True,
        ):
            if time.monotonic() > deadline:
                raise StackError(
                    f"replication slot {slot} still active 60 s after its connector was deleted", component=POSTGRES
                )
            time.sleep(0.2)
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        )
        conn.execute(f'DROP PUBLICATION IF EXISTS "{publication}"')


# Postgres refuses to run as root; a root caller runs it as the account Debian's package creates.
SERVER_ACCOUNT = "postgres"


def bin_dir() -> Path:
    """The folder of the newest installed PostgreSQL server's programs (initdb, postgres)."""
    pg_config = shutil.which("pg_config")
    if pg_config:
        found = Path(
            subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        )
        if (found / "initdb").exists():
            return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if versions:
        return versions[-1].parent
    if shutil.which("initdb"):
        return Path(shutil.which("initdb")).resolve().parent  # type: ignore[arg-type]
    raise DependencyError(
        "PostgreSQL server not found (no initdb): install it with `apt-get install postgresql` "
        "or run ./dev, which installs it"
    )


def demo_schema_sql() -> str:
    return resources.files("cdc.stack").joinpath("sql/demo_schema.sql").read_text()


class PostgresServer(Component):
    name = POSTGRES

    def __init__(self, config: StackConfig) -> None:
        super().__init__(config, config.postgres.port)
        self.settings = config.postgres

    @property
    def data_dir(self) -> Path:
        # Resolved: the server account may reach the folder only through its real path.
        return self.home.resolve() / "data"

    def user(self) -> str | None:
        return SERVER_ACCOUNT if os.geteuid() == 0 else None

    def command(self) -> list[str]:
        return [
            str(bin_dir() / "postgres"),
            "-D",
            str(self.data_dir),
            "-p",
            str(self.port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={self.data_dir}",
            "-c",
            "wal_level=logical",
            # Room for a connector per encoding setting on one table (tests/refine/test_type_matrix.py).
            "-c",
            "max_wal_senders=20",
            "-c",
            "max_replication_slots=20",
        ]

    def is_up(self) -> bool:
        try:
            with psycopg.connect(self.settings.dsn(database="postgres"), connect_timeout=2):
                return True
        except psycopg.Error:
            return False

    def prepare(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        account = self.user()
        if account is not None:
            self._make_reachable_for(account)
        self.home.mkdir(parents=True, exist_ok=True)
        password_file = self.home.resolve() / "initdb.pw"
        password_file.write_text(self.settings.password + "\n")
        if account is not None:
            record = pwd.getpwnam(account)
            os.chown(self.home, record.pw_uid, record.pw_gid)
            os.chown(password_file, record.pw_uid, record.pw_gid)
        command = [
            str(bin_dir() / "initdb"),
            "-D",
            str(self.data_dir),
            "-U",
            self.settings.user,
            "--pwfile",
            str(password_file),
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--no-locale",
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False, **account_kwargs(account))
        password_file.unlink()
        if result.returncode != 0:
            raise StackError("initdb failed", component=self.name, log_tail=(result.stdout + result.stderr)[-2000:])

    def after_start(self) -> None:
        """Create the demo database and apply its schema (both idempotent)."""
        with psycopg.connect(self.settings.dsn(database="postgres"), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.settings.database,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{self.settings.database}"')
        with psycopg.connect(self.settings.dsn(), autocommit=True) as conn:
            conn.execute(demo_schema_sql())

    def _make_reachable_for(self, account: str) -> None:
        """Keep the data folder where ``account`` can reach it.

        A state folder under a private home (root's is mode 700) is out of the server account's
        reach; the data then lives under /var/tmp and the state folder links to it.
        """
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        probe = subprocess.run(["test", "-x", str(self.config.state_dir)], check=False, **account_kwargs(account))
        if probe.returncode == 0:
            return
        digest = hashlib.sha256(str(self.config.state_dir).encode()).hexdigest()[:12]
        outside = Path("/var/tmp/cdc-lakehouse") / digest / self.name
        outside.mkdir(parents=True, exist_ok=True)
        os.chmod(outside.parent.parent, 0o755)
        os.chmod(outside.parent, 0o755)
        if self.home.is_symlink():
            self.home.unlink()
        elif self.home.exists():
            shutil.rmtree(self.home)
        self.home.symlink_to(outside, target_is_directory=True)


def add_to_publication(conn: psycopg.Connection, publication: str, table: str) -> None:
    """Add ``table`` (schema-qualified) to ``publication``, unless it is a member already: Debezium's filtered
    publication mode adds the captured tables it finds itself when its task starts after the CREATE TABLE."""
    conn.execute(
        f'DO $$ BEGIN ALTER PUBLICATION "{publication}" ADD TABLE {table}; '
        "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
