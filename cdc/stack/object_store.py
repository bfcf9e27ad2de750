"""The local stack's S3-compatible object store: S3Proxy (Maven Central's org.gaul:s3proxy) serving
folders under the stack's own as buckets, with AWS signature checks, on 127.0.0.1.

A real S3 server over HTTP: hadoop-aws talks to it as to AWS S3 (path-style addresses). Its
``filesystem-nio2`` store keeps each bucket as a folder and each object as a file, so creating the
bucket is making its folder before the server starts.
"""

from __future__ import annotations

import urllib.request

from pydantic import SecretStr

from cdc.core import jars
from cdc.core.config import S3Connection, StackConfig
from cdc.stack.base import OBJECT_STORE
from cdc.stack.component import Component
from cdc.stack.jvm import properties_text
from cdc.stack.process import port_open

# S3Proxy logs through logback, at DEBUG without a configuration of its own.
_LOGBACK_XML = """\
<configuration>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>[%d] %level %msg \\(%logger{0}\\)%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="STDOUT"/></root>
  <logger name="org.gaul.s3proxy.Main" level="INFO"/>
</configuration>
"""


class ObjectStoreServer(Component):
    name = OBJECT_STORE

    def __init__(self, config: StackConfig) -> None:
        super().__init__(config, config.object_store.port)
        self.settings = config.object_store
        self.data_dir = self.home / "data"
        self.properties_file = self.home / "s3proxy.properties"

    def connection(self) -> S3Connection:
        """How the jobs reach this server (``CDC_S3__*`` settings)."""
        return S3Connection(
            endpoint=self.settings.endpoint,
            path_style_access=True,
            region="us-east-1",
            access_key_id=self.settings.access_key_id,
            secret_access_key=SecretStr(self.settings.secret_access_key),
        )

    def server_properties(self) -> dict[str, object]:
        return {
            "s3proxy.endpoint": self.settings.endpoint,
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": self.settings.access_key_id,
            "s3proxy.credential": self.settings.secret_access_key,
            "jclouds.provider": "filesystem-nio2",
            "jclouds.identity": self.settings.access_key_id,
            "jclouds.credential": self.settings.secret_access_key,
            "jclouds.filesystem.basedir": self.data_dir,
        }

    def command(self) -> list[str]:
        classpath = ":".join(str(path) for path in jars.resolve(jars.S3PROXY_BUNDLE))
        return [
            jars.java_executable(),
            f"-Xmx{self.settings.heap}",
            "-Djava.awt.headless=true",
            f"-Dlogback.configurationFile={self.home / 'logback.xml'}",
            "-cp",
            classpath,
            "org.gaul.s3proxy.Main",
            "--properties",
            str(self.properties_file),
        ]

    def is_up(self) -> bool:
        if not port_open(self.port):
            return False
        try:
            # S3Proxy's health check: answers without a signature once the store serves requests.
            with urllib.request.urlopen(f"{self.settings.endpoint}/healthz", timeout=3) as response:
                return bool(response.status == 200)
        except OSError:  # urllib's errors (refused, HTTP errors, timeouts) are OSErrors
            return False

    def prepare(self) -> None:
        """Write the server's settings, and the bucket's folder (the bucket) the first time."""
        self.home.mkdir(parents=True, exist_ok=True)
        # The secret key is a local demo secret, as Postgres' password is: readable by this user only.
        self.properties_file.touch(mode=0o600, exist_ok=True)
        self.properties_file.write_text(properties_text(self.server_properties()))
        (self.home / "logback.xml").write_text(_LOGBACK_XML)
        (self.data_dir / self.settings.bucket).mkdir(parents=True, exist_ok=True)
