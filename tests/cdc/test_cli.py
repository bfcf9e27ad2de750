import pytest

from cdc.cli import build_parser, main


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
