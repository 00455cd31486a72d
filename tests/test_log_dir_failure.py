"""kstore/log_dir_failure.py: LogDirFailureChannel records the first error of a dir, guards work
on a dir, and tells disk errors (offline) from a file's own errors (raised as they are)."""
import errno

import pytest

from kstore.errors import LogDirOfflineError
from kstore.log_dir_failure import LogDirFailureChannel


def test_first_error_wins_and_is_logged_once(caplog):
    ch = LogDirFailureChannel()
    assert ch.mark_offline("/d", OSError(errno.EIO, "first"))
    assert not ch.mark_offline("/d", OSError(errno.EIO, "second"))
    assert ch.offline_dirs == {"/d": "[Errno 5] first"} and ch.reason("/d") == "[Errno 5] first"
    assert ch.is_offline("/d") and not ch.is_offline("/e")
    assert ch.all_offline(["/d"]) and not ch.all_offline(["/d", "/e"])
    assert ch.summary() == "/d: [Errno 5] first"
    assert [r.getMessage() for r in caplog.records] == ["log dir /d is offline: [Errno 5] first"]


def test_guard():
    ch = LogDirFailureChannel()
    assert ch.guard("/d", lambda x, y=0: x + y, 1, y=2) == 3

    def fail(code):
        raise OSError(code, "boom")
    with pytest.raises(PermissionError):
        ch.guard("/d", fail, errno.EACCES)         # a file's own error: the dir stays online
    assert ch.offline_dirs == {}
    with pytest.raises(LogDirOfflineError, match="log dir /d went offline"):
        ch.guard("/d", fail, errno.ENOSPC)
    with pytest.raises(LogDirOfflineError, match=r"log dir /d is offline \(\[Errno 28\] boom\)"):
        ch.guard("/d", lambda: 1)
