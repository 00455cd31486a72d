"""Shared machinery of the group membership tests: a minimal coordinator (the four methods a
GroupMember uses of kstore.group_coordinator.GroupCoordinator) and a member in a child process
driven line by line, so a test can kill -9 it at a chosen point."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional

TESTS = str(Path(__file__).resolve().parent)


class FakeCoordinator:
    """Records store_group/commit_offsets calls in memory and, if record is a path, appends
    each stored generation to that file (one JSON line, O_APPEND: shared by processes)."""

    def __init__(self, log_dir: str, record: Optional[str] = None):
        self.dir = str(log_dir)
        self.record = record
        self.groups: dict = {}
        self.commits: list = []
        self.lock = threading.Lock()

    def log_dir_for(self, group_id: str) -> str:
        return self.dir

    def partition_for(self, group_id: str) -> int:
        return 0

    def check_available(self, group_id: str) -> int:
        """Its one dir never goes offline (GroupCoordinator's raises while it is)."""
        return 0

    def store_group(self, group_id, group, *, sleep=None) -> None:
        with self.lock:
            self.groups.setdefault(group_id, []).append(group)
        if self.record:
            line = json.dumps({"group": group_id, "generation": group.generation, "pid": os.getpid(),
                               "members": [m.member_id for m in group.members]}) + "\n"
            fd = os.open(self.record, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)

    def group(self, group_id):
        with self.lock:
            return (self.groups.get(group_id) or [None])[-1]

    def commit_offsets(self, group_id, offsets, *, generation=-1, member_id="", sleep=None) -> None:
        with self.lock:
            self.commits.append((group_id, dict(offsets), generation, member_id))


CHILD = r"""
import sys, json, time, re
sys.path.insert(0, sys.argv[2])
from group_helpers import FakeCoordinator
from kstore.group_membership import GroupMember
from kstore.group_files import GroupDir
co = FakeCoordinator(sys.argv[1], sys.argv[3] or None)
for line in sys.stdin:
    try:
        r = eval(compile(line, "<cmd>", "eval")) if not line.startswith("!") else exec(line[1:])
        print(json.dumps({"ok": repr(r)}), flush=True)
    except Exception as e:
        print(json.dumps({"error": repr(e)}), flush=True)
"""


class ChildMember:
    """A Python child process that runs statements (a line prefixed with "!" is exec'd) or
    evaluates expressions, replying with their repr: members and lock holders to kill -9."""

    def __init__(self, log_dir, record: Optional[str] = None):
        env = dict(os.environ)
        self.p = subprocess.Popen([sys.executable, "-c", CHILD, str(log_dir), TESTS, record or ""],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                  cwd=str(log_dir))

    def run(self, cmd: str) -> str:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        reply = json.loads(self.p.stdout.readline())
        if "error" in reply:
            raise AssertionError(f"{cmd}: {reply['error']}")
        return reply["ok"]

    def kill(self) -> None:
        self.p.kill()
        self.p.wait(timeout=30)

    def close(self) -> None:
        if self.p.poll() is None:
            assert self.p.stdin is not None
            self.p.stdin.close()
            self.p.wait(timeout=30)


_HOLD_FLOCK = ("import fcntl, os, sys\n"
               "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
               "fcntl.flock(fd, fcntl.LOCK_EX)\n"
               "print('locked', flush=True)\n"
               "sys.stdin.read()\n")


class FlockHolder:
    """Another process holding a directory's exclusive flock (a __consumer_offsets partition's,
    as its commit does) from its start until release(); cwd: outside the checkout."""

    def __init__(self, path: str, cwd) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", _HOLD_FLOCK, path], cwd=str(cwd),
                                  env=dict(os.environ), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert self.p.stdout is not None and self.p.stdout.readline() == "locked\n"

    def release(self) -> None:
        if self.p.poll() is None:
            assert self.p.stdin is not None
            self.p.stdin.close()
            assert self.p.wait(timeout=30) == 0
