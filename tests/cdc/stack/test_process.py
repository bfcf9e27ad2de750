import os
import time

import pytest

from cdc.core.errors import StackError
from cdc.stack.process import ManagedProcess, port_open, tail


@pytest.fixture
def managed(tmp_path) -> ManagedProcess:
    return ManagedProcess("sleeper", tmp_path / "logs" / "sleeper.log", tmp_path / "run" / "sleeper.pid")


def test_start_find_and_stop_leaves_no_process(managed):
    # The server forks a child: stopping must end the whole process group.
    pid = managed.start(["sh", "-c", "sleep 300 & echo started; wait"])
    assert managed.pid() == pid
    managed.wait_until(lambda: "started" in tail(managed.log_file), 10, "start")
    managed.stop(timeout_s=5)
    assert managed.pid() is None
    assert not managed.pid_file.exists()
    assert live_members_of_group(pid) == []


def live_members_of_group(pgid: int) -> list[int]:
    """Pids of running (not zombie) processes in process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry))
    return members


def test_a_reused_pid_is_not_taken_for_ours(managed):
    managed.pid_file.parent.mkdir(parents=True)
    managed.pid_file.write_text(f"{os.getpid()} 1\n")  # our pid, but another start time
    assert managed.pid() is None


def test_a_process_that_dies_while_starting_fails_with_its_log(managed):
    managed.start(["sh", "-c", "echo 'FATAL: bad setting'; exit 3"])
    with pytest.raises(StackError) as raised:
        managed.wait_until(lambda: False, 10, "answer")
    assert "sleeper exited while starting" in str(raised.value)
    assert "FATAL: bad setting" in str(raised.value)


def test_waiting_times_out_with_the_log_tail(managed):
    managed.start(["sh", "-c", "echo still booting; sleep 30"])
    started = time.monotonic()
    with pytest.raises(StackError, match="did not answer within 1 s") as raised:
        managed.wait_until(lambda: False, 1, "answer")
    assert time.monotonic() - started < 10
    assert "still booting" in raised.value.log_tail
    managed.stop(timeout_s=5)


def test_port_open_sees_a_listener():
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert port_open(port)
    assert not port_open(port)
