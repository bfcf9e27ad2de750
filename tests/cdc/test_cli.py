import pytest

from cdc.cli import build_parser, main
from cdc.config import GarbageCollector


def test_every_command_has_help(capsys):
    for argv in (["--help"], ["stack", "--help"], ["stack", "up", "--help"], ["connectors", "register", "--help"]):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(argv)
        assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "start every component and wait until it answers" in out
    assert "--state-dir" in out


def test_status_of_a_stack_that_is_not_running(tmp_path, capsys):
    assert main(["stack", "status", "--state-dir", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["postgres", "down"], ["kafka", "down"], ["connect", "down"]]


def test_configuration_error_is_one_line_with_exit_code_2(monkeypatch, capsys):
    monkeypatch.setenv("CDC_STACK__CONNECT__PORT", "not-a-port")
    assert main(["stack", "status"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("cdc: error: invalid configuration: CDC_STACK__CONNECT__PORT")
    assert "Traceback" not in err


def test_debug_shows_the_traceback(monkeypatch, capsys):
    monkeypatch.setenv("CDC_STACK__CONNECT__PORT", "not-a-port")
    assert main(["--debug", "stack", "status"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_unreachable_connect_is_a_connector_error(monkeypatch, capsys):
    monkeypatch.setenv("CDC_STACK__CONNECT__PORT", "1")
    assert main(["connectors", "list"]) == 5
    assert "Kafka Connect does not answer" in capsys.readouterr().err


def test_after_a_stop_signal_py4j_failures_are_not_logged(caplog):
    """Once the job is told to stop, its JVM may already have exited (a process-group SIGTERM):
    py4j's tracebacks for calls the job expects to fail, and for the micro-batch the exit cut short,
    must not reach the output."""
    import logging
    import os
    import signal

    from cdc.cli import _not_py4j_failures_after_jvm_exit, _stop_on_signals

    proxy = logging.getLogger("py4j.clientserver")
    proxy_failure = "There was an exception while executing the Python Proxy on the Python Side."
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        # Before a stop, py4j's own failures are logged as py4j logs them (a failed micro-batch's Python Proxy
        # traceback is kept out by every session cdc.spark builds: see test_bad_records; not what this test is about).
        logging.getLogger().error("Exception while sending command.")
        stop = _stop_on_signals()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)
        logging.getLogger().error("Exception while sending command.")
        proxy.error(proxy_failure)
        logging.getLogger().error("something else")
    finally:
        for logger in (logging.getLogger(), proxy):
            logger.removeFilter(_not_py4j_failures_after_jvm_exit)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert [record.getMessage() for record in caplog.records] == ["Exception while sending command.", "something else"]


class _SessionAsked(Exception):
    """What the test's stand-in for the session factory raises: the job stops before Spark starts."""


@pytest.mark.parametrize(
    ("argv", "collector"),
    [
        (["raw", "--topic", "t"], GarbageCollector.PARALLEL),
        (["refine", "--table", "t", "--available-now"], GarbageCollector.PARALLEL),
        (["refine", "--table", "t"], None),
        (["sync", "--topic", "t", "--available-now"], GarbageCollector.PARALLEL),
        (["sync", "--topic", "t"], None),
    ],
)
def test_each_job_asks_for_its_garbage_collector(monkeypatch, tmp_path, argv, collector):
    def session_asked(config):
        raise _SessionAsked(config)

    monkeypatch.setattr("cdc.spark.build_spark_session", session_asked)
    with pytest.raises(_SessionAsked) as asked:
        main([*argv, "--warehouse", str(tmp_path)])
    assert asked.value.args[0].garbage_collector is collector
