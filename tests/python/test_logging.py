"""The library's logging as a host sees it: nothing below warnings unless asked (TPDRAFT_LOG_LEVEL
or set_log_level), each line to a callback when one is set, a callback that raises reported to
Python without harm, and bad levels refused by name."""

import os
import subprocess
import sys
import threading

import pytest
import tpdraft

# Opening a drafter logs at info what it loaded ("loaded ..."): the line these tests look for.
HOST = """
import sys, tpdraft
ck = sys.argv[1]
tpdraft.Drafter(ck + "/drafter", ck + "/target", backend="cpu", threads=1).close()
print("opened")
"""


def run_host(ck, **env):
    environment = {k: v for k, v in os.environ.items() if k != "TPDRAFT_LOG_LEVEL"}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", HOST, str(ck)], capture_output=True, text=True, check=True,
                          env=environment)


def test_a_host_that_does_not_ask_sees_no_info_lines(checkpoint):
    ck = checkpoint()
    quiet = run_host(ck)
    assert quiet.stdout == "opened\n" and quiet.stderr == ""
    loud = run_host(ck, TPDRAFT_LOG_LEVEL="INFO")
    assert "[info] loaded " in loud.stderr and "[rank 0/1]" in loud.stderr


@pytest.fixture
def restore_logging():
    yield
    tpdraft.set_log_callback(None)
    tpdraft.set_log_level("warn")


def open_drafter(ck):
    return tpdraft.Drafter(str(ck / "drafter"), str(ck / "target"), backend="cpu", threads=1, tp=2)


def test_callback_receives_each_line(checkpoint, restore_logging, capfd):
    ck = checkpoint()
    lines = []
    tpdraft.set_log_callback(lambda level, line: lines.append((level, line, threading.get_ident())))
    open_drafter(ck).close()
    assert lines == []  # warn: the loading lines stay below the level
    tpdraft.set_log_level("Info")
    open_drafter(ck).close()
    loaded = [line for line in lines if " loaded " in line[1]]
    # Formatted as on stderr (the rank's field too), without the newline.
    assert loaded and all(line[1].split("] [")[1].startswith("rank 0/") for line in loaded)
    assert all(level == "info" and not line.endswith("\n") and "[info] loaded " in line for level, line, _ in loaded)
    assert capfd.readouterr().err == ""
    # Back to stderr.
    tpdraft.set_log_callback(None)
    lines.clear()
    open_drafter(ck).close()
    assert lines == [] and "[info] loaded " in capfd.readouterr().err
    tpdraft.set_log_level("off")
    open_drafter(ck).close()
    assert capfd.readouterr().err == ""


def test_a_raising_callback_is_reported_and_harmless(checkpoint, restore_logging, monkeypatch):
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append((type(u.exc_value), str(u.exc_value))))

    def bad(level, line):
        raise KeyError("from the callback")

    tpdraft.set_log_callback(bad)
    tpdraft.set_log_level("debug")
    with open_drafter(checkpoint()) as d:
        s = d.open_session()
        d.step([{"session": s, "anchor": 1}])
    assert reported and all(r == (KeyError, "'from the callback'") for r in reported)


def test_bad_levels_and_callbacks_are_refused(restore_logging):
    with pytest.raises(tpdraft.ArgumentError, match="'verbose' names no log level; expected one of trace, debug"):
        tpdraft.set_log_level("verbose")
    with pytest.raises(TypeError):
        tpdraft.set_log_level(3)
    with pytest.raises(TypeError, match="set_log_callback takes a callable"):
        tpdraft.set_log_callback("print")
