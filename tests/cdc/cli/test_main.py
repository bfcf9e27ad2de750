import subprocess
import sys

import pytest

from cdc.cli import build_parser, main
from cdc.core.config import GarbageCollector


def test_every_command_has_help(capsys):
    for argv in (["--help"], ["stack", "--help"], ["stack", "up", "--help"], ["connectors", "register", "--help"]):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(argv)
        assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "start every component and wait until it answers" in out
    assert "--state-dir" in out


@pytest.mark.parametrize("command", ["raw", "sync", "status", "refine", "optimize", "vacuum"])
def test_only_the_commands_that_read_kafka_take_kafka_secrets(command, capsys):
    reads_kafka = command in ("raw", "sync", "status")
    options = {"raw": ["--topic", "t"], "sync": ["--topic", "t"], "status": []}
    argv = [command, "--kafka-secrets-file", "secrets.yaml", *options.get(command, ["--table", "t"])]
    if reads_kafka:
        assert str(build_parser().parse_args(argv).kafka_secrets_file) == "secrets.yaml"
    else:
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(argv)
        assert exited.value.code == 2
        assert "unrecognized arguments: --kafka-secrets-file" in capsys.readouterr().err


def test_status_of_a_stack_that_is_not_running(tmp_path, capsys):
    assert main(["stack", "status", "--state-dir", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["postgres", "down"],
        ["kafka", "down"],
        ["connect", "down"],
        ["s3", "down"],
    ]


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

    from cdc.cli.common import not_py4j_failures_after_jvm_exit, stop_on_signals

    proxy = logging.getLogger("py4j.clientserver")
    proxy_failure = "There was an exception while executing the Python Proxy on the Python Side."
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        # Before a stop, py4j's own failures are logged as py4j logs them (a failed micro-batch's Python Proxy
        # traceback is kept out by every session cdc.core.session builds: see test_bad_records; not what this
        # test is about).
        logging.getLogger().error("Exception while sending command.")
        stop = stop_on_signals()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)
        logging.getLogger().error("Exception while sending command.")
        proxy.error(proxy_failure)
        logging.getLogger().error("something else")
    finally:
        for logger in (logging.getLogger(), proxy):
            logger.removeFilter(not_py4j_failures_after_jvm_exit)
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

    monkeypatch.setattr("cdc.api.build_spark_session", session_asked)
    with pytest.raises(_SessionAsked) as asked:
        main([*argv, "--warehouse", str(tmp_path)])
    assert asked.value.args[0].garbage_collector is collector


def test_a_job_shows_its_own_lines_and_keeps_sparks_warnings_in_its_log_file(
    kafka, stack_config, postgres_connector, postgres_table, tmp_path, cdc_process
):
    """`cdc raw` and `cdc refine` as processes of their own: the terminal shows the jobs' lines and no
    WARN line of Spark's (each streaming query's start alone logs one); they are in the run's log file,
    and `--verbose` shows them on the terminal too."""
    from cdc.stack.workload import run_workload

    run_workload(stack_config.postgres.dsn(), customers=2, seed=51)
    topic = f"{postgres_connector.topic_prefix}.shop.orders"
    kafka.wait_for_last_value(topic, lambda value: value is None)  # the workload ends with a delete
    warehouse, logs = tmp_path / "warehouse", tmp_path / "logs"

    def run(*args: str) -> str:
        job = cdc_process([*args, "--warehouse", str(warehouse), "--available-now"], log_dir=logs)
        output = job.wait(timeout=300)
        assert job.returncode == 0, output
        return output

    landed = run("raw", "--topic", topic)
    refined = run("refine", "--table", topic)
    assert f"raw {topic} -> " in landed
    assert f"refine {topic}: " in refined
    assert [line for line in (landed + refined).splitlines() if " WARN " in line] == []
    log_files = sorted(logs.glob("cdc-*.log"))
    assert len(log_files) == 2, log_files  # one per process
    assert " WARN " in "".join(path.read_text() for path in log_files)

    verbose = run("--verbose", "refine", "--table", topic)
    assert " WARN " in verbose


def test_a_job_that_fails_prints_its_one_line_and_nothing_of_the_jvms_start(tmp_path):
    """The JDK's warning about the incubator module Spark's launcher adds is not shown."""
    result = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "refine", "--table", "t", "--warehouse", str(tmp_path), "--available-now"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 8, result.stderr
    assert (result.stdout, result.stderr.splitlines()) == (
        "",
        [f"cdc: error: no raw table for this topic: run `cdc raw` first (table={tmp_path}/raw/t)"],
    )
