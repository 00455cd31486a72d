"""The kstore command: quickstart writes a real store and reports what it did; errors are one line."""
import os
import subprocess
import sys

import kstore
from kstore.tools import cli


def test_quickstart_builds_and_tours_a_store(tmp_path, capsys):
    assert cli.main(["quickstart", "--dir", str(tmp_path / "data")]) == 0
    out = capsys.readouterr().out
    assert "offsets 0..99" in out and "log end offset 400" in out
    assert "read by offset 250 → key=b'user-250'" in out
    assert "0 segments needed recovery" in out
    assert "compacted 'profiles': 500 -> " in out and "user-7 reads b'profile version 487'" in out
    assert "retention.bytes=8192: deleted" in out
    part = tmp_path / "data" / "quickstart-0"
    with kstore.Log.open(str(part)) as log:
        assert log.log_end_offset == 400
        assert len(log.segments) > 1


def test_python_dash_m_entry_point(tmp_path):
    r = subprocess.run([sys.executable, "-m", "kstore", "quickstart", "--dir", str(tmp_path)],
                       capture_output=True, text=True, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "kstore" in r.stdout and os.path.isdir(tmp_path / "quickstart-0")


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "quickstart" in capsys.readouterr().out


# -- errors: one line, no traceback, exit status 1 (issue 12, defect 18) ------------------------
def _kstore(*args):
    # cwd "/": python -m puts the cwd first on sys.path; PYTHONPATH chooses the tree under test
    r = subprocess.run([sys.executable, "-m", "kstore", *args], capture_output=True, text=True,
                       timeout=120, cwd="/")
    return r.returncode, r.stderr


def test_a_file_as_log_dirs_is_one_error_line(tmp_path):
    f = tmp_path / "afile"
    f.write_bytes(b"")
    for cmd in (["topics", "list"], ["get-offsets", "--topic", "t"],
                ["consume", "--topic", "t", "--from-beginning"]):
        assert _kstore(*cmd, "--log-dirs", str(f)) == (1, f"kstore: error: refusing {f}: not a directory\n"), cmd
    assert _kstore("topics", "create", "--topic", "t", "--partitions", "1", "--log-dirs", str(f)) == (
        1, f"kstore: error: every log dir is offline: {f}: refusing {f}: a log dir that is not a directory\n")
    assert _kstore("quickstart", "--dir", str(f / "sub")) == (1, f"kstore: error: {f / 'sub'}: Not a directory\n")
    rc, err = _kstore("topics", "list", "--no-such-option")
    assert rc == 2 and err.startswith("usage: ")


def test_os_errors_and_odd_names_are_one_error_line(tmp_path):
    d = tmp_path / "x.log"
    d.mkdir()
    assert _kstore("dump-log", "--files", str(d)) == (1, f"kstore: error: refusing {d}: a directory, not a regular file\n")
    fifo = tmp_path / "00000000000000000000.log"
    os.mkfifo(fifo)
    assert _kstore("dump-log", "--files", str(fifo)) == (1, f"kstore: error: refusing {fifo}: a FIFO, not a regular file\n")
    with kstore.LogManager(str(tmp_path / "s")) as m:
        m.create_topic("t", 1)
        m.append("t", None, b"v")
    odd = tmp_path / "s" / "t-0" / "99999999999999999999.log"
    odd.write_bytes(b"")
    assert _kstore("consume", "--topic", "t", "--from-beginning", "--log-dirs", str(tmp_path / "s")) == (
        1, f"kstore: error: refusing {odd}: its base offset is above 2^63-1\n")


def test_an_unreadable_topic_config_file_is_named_on_stderr_not_passed_over(tmp_path, capsys):
    """A damaged kstore-topic-config.json is ignored (its overrides are then not in force), and
    a command that reads it says so on stderr, once; a command that writes refuses the store
    (test_topics.py): before, `topics describe` printed the topic with no configs and `topics
    create` replaced the file, dropping every other topic's overrides (cleanup.policy=compact,
    retention.ms=-1), both exit 0 and silent."""
    d = str(tmp_path / "s")
    assert cli.main(["topics", "create", "--log-dirs", d, "--topic", "keep", "--partitions", "1",
                     "--config", "cleanup.policy=compact", "--config", "retention.ms=-1"]) == 0
    path = os.path.join(d, "kstore-topic-config.json")
    with open(path, "ab") as f:
        f.write(b"}")
    capsys.readouterr()
    raw = open(path).read()
    lines = raw.count("\n") + 1
    warning = (f"kstore: warning: ignoring unreadable topic config file {path}: "
               f"Extra data: line {lines} column 2 (char {len(raw) - 1})\n")
    assert cli.main(["topics", "describe", "--log-dirs", d, "--topic", "keep"]) == 0
    cap = capsys.readouterr()
    assert cap.err == warning
    assert cap.out.splitlines()[0].endswith("\tConfigs: ")
    assert cli.main(["consume", "--log-dirs", d, "--topic", "keep", "--from-beginning", "--follow",
                     "--timeout-ms", "2500"]) == 0          # rescans (re-reads the file) every 1 s
    assert capsys.readouterr().err == warning + "Processed a total of 0 messages\n"
    # a writing command refuses the store: going on would drop the overrides from the file
    assert cli.main(["topics", "create", "--log-dirs", d, "--topic", "z", "--partitions", "1"]) == 1
    reason = warning.split(f"{path}: ", 1)[1].rstrip("\n")
    assert capsys.readouterr() == ("", warning + (
        f"kstore: error: refusing {path}: unreadable ({reason}): without it every topic's "
        "overrides (retention.ms, cleanup.policy, ...) would fall back to Kafka's defaults and "
        "retention could delete records they keep; restore it, or remove it to start with the "
        "defaults\n"))
    assert open(path).read() == raw
