"""How `cdc stack status` asks the Spark master for its state: a master that answers slowly (a busy host) is
still a running master, not a cluster that is down."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cdc.stack.spark_cluster import master_state

SLOW_ANSWER_S = 5.0  # longer than a short probe's patience, as seen from a master under load in CI


class _SlowMasterPage(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        time.sleep(SLOW_ANSWER_S)
        body = json.dumps({"status": "ALIVE", "workers": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_master_that_answers_slowly_is_read_as_answering():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowMasterPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert master_state(server.server_address[1]) == {"status": "ALIVE", "workers": []}
    finally:
        server.shutdown()
        server.server_close()


def test_a_master_nobody_listens_for_is_read_as_down():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowMasterPage)
    port = server.server_address[1]
    server.server_close()
    assert master_state(port) is None
