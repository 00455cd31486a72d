"""Real faults, not injected ones (issue 12; facts: crash-and-fault-testing §4): a size-limited
tmpfs filled to ENOSPC under appends, RLIMIT_FSIZE giving EFBIG, and a read-only remount under a
running writer process. Each workload runs in a subprocess, so a SIGBUS (a mapped write into a
page the full filesystem cannot back) is reported as "killed by signal 7" instead of killing the
test run. Checked: the append fails with a kstore storage error naming the log and keeping the
errno (never a raw OSError, never a signal); later appends keep failing cleanly; acknowledged
records stay readable; once space (or write access) is back the store opens again, holds every
acknowledged record with its exact value, and takes appends.

Mounting needs root and a kernel that allows it (not every CI container does): the tmpfs tests
skip with the reason otherwise. Every mount is unmounted in a finally."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

COUNTS = {"faults": 0, "records_acked": 0, "records_lost": 0, "signals": 0}
ENV = dict(os.environ, PYTHONSAFEPATH="1")


@contextlib.contextmanager
def tmpfs(path: str, size: str = "1m"):
    """A size-limited tmpfs at path for the block; skips the test where mounting is not allowed."""
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and mount rights): {r.stderr.strip()}")
    try:
        yield path
    finally:
        u = subprocess.run(["umount", path], capture_output=True, text=True)
        if u.returncode != 0:
            subprocess.run(["umount", "-l", path], capture_output=True, text=True)


def run(script: str, *args: str, timeout: float = 60, pre: str = "") -> list[list[str]]:
    """Run a workload in a subprocess; its stdout lines, split. A signal or a hang fails."""
    code = textwrap.dedent(pre) + textwrap.dedent(script)
    try:
        p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code, *args],
                           capture_output=True, text=True, timeout=timeout, env=ENV)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"HANG: the workload still ran after {timeout:.0f} s (killed); output:\n"
                             f"{(e.stdout or b'')[-2000:]!r}") from None
    if p.returncode < 0:
        COUNTS["signals"] += 1
        raise AssertionError(f"KILLED: the workload died of signal {-p.returncode} "
                             f"({signal.Signals(-p.returncode).name}); output:\n{p.stdout[-2000:]}\n"
                             f"{p.stderr[-4000:]}")
    assert p.returncode == 0, f"the workload exited with {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    return parse(p.stdout)


def parse(out: str) -> list[list[str]]:
    """Workload lines: "ACK 7", "READ <json>", "FAIL <module.Class> <errno> <json message>"."""
    lines = []
    for line in out.splitlines():
        tag, _, rest = line.partition(" ")
        if tag in ("READ", "RECS"):
            lines.append([tag, rest])
        elif tag in ("FAIL", "AGAIN", "CLOSE", "OPENFAIL", "CLOSEFAIL", "READFAIL") and rest != "ok":
            lines.append([tag] + rest.split(" ", 2))
        else:
            lines.append(line.split())
    return lines


COMMON = """
    import errno, json, os, sys, traceback, kstore
    def value(o):
        return b"value-%06d-" % o + b"x" * 1000
    def describe(e):
        return "%s.%s %s %s" % (type(e).__module__, type(e).__name__, getattr(e, "errno", None),
                                json.dumps(str(e)))
"""

APPEND_UNTIL_FAILURE = """
    kind, path = sys.argv[1], sys.argv[2]
    cfg = {"segment.bytes": 256 * 1024, "segment.index.bytes": 4096, "index.interval.bytes": 4096}
    if kind == "manager":
        m = kstore.LogManager(path, {"log.segment.bytes": 256 * 1024, "log.index.size.max.bytes": 4096,
                                     "log.index.interval.bytes": 4096, "log.cleaner.enable": False})
        if "t" not in m.topics():
            m.create_topic("t", 1)
        lg = m.log("t", 0)
        append = lambda recs: m.append_batch("t", 0, recs)
    else:
        lg = kstore.Log.open(path, cfg)
        append = lg.append
    for i in range(100000):
        o = lg.log_end_offset
        try:
            append([(None, value(o))])
        except Exception as e:
            print("FAIL", describe(e), flush=True)
            traceback.print_exc()
            break
        print("ACK", o, flush=True)
        if i % 50 == 49:
            lg.flush()
    try:                                        # a failed log keeps refusing, cleanly
        append([(None, value(lg.log_end_offset))])
        print("AGAIN ok", flush=True)
    except Exception as e:
        print("AGAIN", describe(e), flush=True)
    try:                                        # acknowledged records stay readable
        print("READ", json.dumps([[r.offset, r.value == value(r.offset)] for r in lg]), flush=True)
    except Exception as e:
        print("READFAIL", describe(e), flush=True)
    try:
        (m if kind == "manager" else lg).close()
        print("CLOSE ok", flush=True)
    except Exception as e:
        print("CLOSE", describe(e), flush=True)
"""

REOPEN_AND_CHECK = """
    kind, path, n_more = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if kind == "manager":
        m = kstore.LogManager(path, {"log.cleaner.enable": False})
        lg = m.log("t", 0)
        append = lambda recs: m.append_batch("t", 0, recs)
    else:
        lg = m = kstore.Log.open(path)
        append = lg.append
    print("RECS", json.dumps([[r.offset, r.value == value(r.offset)] for r in lg]), flush=True)
    for _ in range(n_more):
        append([(None, value(lg.log_end_offset))])
    print("END", lg.log_end_offset, flush=True)
    m.close()
"""


def acked_of(lines) -> list[int]:
    return [int(p[1]) for p in lines if p[0] == "ACK"]


def failure_of(lines, tag: str = "FAIL") -> list[str]:
    got = [p for p in lines if p[0] == tag]
    assert got, f"no {tag} line in {lines[-5:]}"
    return got[0]


def check_storage_error(fail: list[str], want_errno: int, where: str) -> None:
    """fail: ["FAIL", "module.Class", errno, json message]."""
    cls, err, msg = fail[1], fail[2], json.loads(fail[3])
    assert cls.startswith("kstore.errors."), \
        f"UNEXPECTED EXCEPTION: a full disk raised {cls} (errno {err}): {msg}; expected a kstore storage error"
    assert cls in ("kstore.errors.KafkaStorageError", "kstore.errors.LogDirOfflineError"), (cls, msg)
    assert err == str(want_errno) or os.strerror(want_errno) in msg, \
        f"the error lost its cause ({errno.errorcode[want_errno]}): {cls} {err} {msg}"
    assert where in msg, f"the error does not name {where}: {msg}"


def check_all_acked(recs, acked: list[int]) -> None:
    offs = [o for o, _ok in recs]
    bad = [o for o, ok in recs if not ok]
    assert not bad, f"WRONG: records at {bad[:10]} do not hold their values"
    lost = sorted(set(acked) - set(offs))
    COUNTS["records_lost"] += len(lost)
    assert not lost, f"LOST: acknowledged offsets {lost[:10]} (of {len(acked)}) are gone"
    assert offs == list(range(len(offs))), "SKIP: offsets are not dense from 0"


@pytest.mark.parametrize("kind", ["log", "manager"])
def test_enospc_on_a_full_tmpfs(tmp_path, kind):
    """A 1 MiB tmpfs, part of it taken by a filler file, fills up under appends."""
    mnt = str(tmp_path / "mnt")
    with tmpfs(mnt, "1m"):
        filler = os.path.join(mnt, "filler")
        with open(filler, "wb") as f:
            f.write(b"\0" * (384 * 1024))
        path = os.path.join(mnt, "store" if kind == "manager" else "t-0")
        lines = run(APPEND_UNTIL_FAILURE, kind, path, pre=COMMON)
        acked = acked_of(lines)
        assert len(acked) > 100, f"only {len(acked)} appends before the disk filled"
        COUNTS["faults"] += 1
        COUNTS["records_acked"] += len(acked)
        check_storage_error(failure_of(lines), errno.ENOSPC, os.path.join(path, "t-0") if kind == "manager" else path)
        again = failure_of(lines, "AGAIN")
        assert again[1].startswith("kstore.errors."), f"UNEXPECTED EXCEPTION on the next append: {again}"
        read = failure_of(lines, "READ")
        check_all_acked(json.loads(read[1]), acked)
        os.unlink(filler)                               # space is back
        lines = run(REOPEN_AND_CHECK, kind, path, "50", pre=COMMON)
        check_all_acked(json.loads(failure_of(lines, "RECS")[1]), acked)
        end = int(failure_of(lines, "END")[1])
        assert end >= len(acked) + 50


def test_efbig_under_rlimit_fsize(tmp_path):
    """RLIMIT_FSIZE (SIGXFSZ ignored, so the write fails with EFBIG) caps a segment's growth."""
    path = str(tmp_path / "t-0")
    pre = COMMON + """
    import resource, signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200 * 1024, 200 * 1024))
    """
    lines = run(APPEND_UNTIL_FAILURE, "log", path, pre=pre)
    acked = acked_of(lines)
    assert len(acked) > 50, f"only {len(acked)} appends before EFBIG"
    COUNTS["faults"] += 1
    COUNTS["records_acked"] += len(acked)
    check_storage_error(failure_of(lines), errno.EFBIG, path)
    assert failure_of(lines, "AGAIN")[1].startswith("kstore.errors.")
    check_all_acked(json.loads(failure_of(lines, "READ")[1]), acked)
    lines = run(REOPEN_AND_CHECK, "log", path, "50", pre=COMMON)     # no limit now
    check_all_acked(json.loads(failure_of(lines, "RECS")[1]), acked)


CYCLING_WRITER = """
    import time
    path, seconds, stop = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    t0 = time.monotonic()
    while time.monotonic() < t0 + seconds and not os.path.exists(stop):
        try:
            m = kstore.LogManager(path, {"log.cleaner.enable": False, "log.segment.bytes": 64 * 1024,
                                         "log.index.size.max.bytes": 4096})
        except Exception as e:
            print("OPENFAIL", describe(e), flush=True)
            time.sleep(0.02)
            continue
        try:
            if "t" not in m.topics():
                m.create_topic("t", 1)
            lg = m.log("t", 0)
            for _ in range(20):
                o = lg.log_end_offset
                m.append_batch("t", 0, [(None, value(o))])
                print("ACK", o, flush=True)
            m.close()
        except Exception as e:
            print("FAIL", describe(e), flush=True)
            try:
                m.close()
            except Exception as e2:
                print("CLOSEFAIL", describe(e2), flush=True)
        time.sleep(0.005)
    print("STOP", flush=True)
"""


class _Lines:
    """A child's stdout read line by line with every wait bounded (select on the pipe)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.fd = proc.stdout.fileno()      # type: ignore[union-attr]
        self.lines: list[str] = []
        self._pending = b""

    def _read(self, left: float) -> bool:
        """One read of what is there (waiting at most left seconds); False at end of file."""
        import select
        if not select.select([self.fd], [], [], max(0.0, min(left, 1.0)))[0]:
            return True
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            return False
        *full, self._pending = (self._pending + chunk).split(b"\n")
        self.lines.extend(x.decode() for x in full)
        return True

    def until(self, tags: tuple[str, ...], timeout: float, after: int = 0) -> int:
        """Read until a line at index >= after starts with one of tags; its index."""
        deadline = time.monotonic() + timeout
        while True:
            for i in range(after, len(self.lines)):
                if self.lines[i].split(" ", 1)[0] in tags:
                    return i
            after = max(after, len(self.lines))
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"the writer printed no {tags} line in {timeout:.0f} s "
                                     f"(exit {self.proc.poll()}); output:\n" + "\n".join(self.lines[-20:]))

    def rest(self, timeout: float) -> str:
        """Everything up to end of file (bounded), as one string."""
        deadline = time.monotonic() + timeout
        while self._read(deadline - time.monotonic()):
            if time.monotonic() > deadline:
                raise AssertionError("HANG: the writer still wrote after the stop request")
        return "\n".join(self.lines) + "\n" + self._pending.decode()


def test_read_only_remount_under_a_running_writer(tmp_path):
    """A writer process opens the store, appends and closes it in a loop; the tmpfs is remounted
    read-only under it (Linux refuses while a file is open for writing, so the remount lands
    between two of its opens; it is retried until it does), then read-write again. The opens
    that meet the read-only filesystem fail with a kstore error naming EROFS, a StoreReader
    reads every acknowledged record meanwhile, and afterwards nothing acknowledged is lost.
    Each step waits on the writer's own output, never on time: the remount only after its first
    acknowledged append (the store exists), read-write again only after it failed on the
    read-only filesystem, and it is asked to stop (a file) only after it appended again."""
    mnt = str(tmp_path / "mnt")
    stop = str(tmp_path / "stop")
    with tmpfs(mnt, "64m"):     # room for every append of the run: only EROFS may stop it
        path = os.path.join(mnt, "store")
        code = textwrap.dedent(COMMON) + textwrap.dedent(CYCLING_WRITER)
        with open(tmp_path / "writer.err", "wb") as errf:
            w = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", code, path, "120", stop],
                                 stdout=subprocess.PIPE, stderr=errf, env=ENV)
        out = _Lines(w)
        remounted = False
        try:
            out.until(("ACK",), 60)                   # the store exists and took an append
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not remounted:
                remounted = subprocess.run(["mount", "-o", "remount,ro", mnt],
                                           capture_output=True).returncode == 0
            if remounted:
                mark = len(out.lines)
                out.until(("OPENFAIL", "FAIL", "CLOSEFAIL"), 30, mark)   # it met the read-only fs
                reader = run("""
                    import sys, json, kstore
                    with kstore.StoreReader(sys.argv[1]) as r:
                        print("RECS", json.dumps([[x.offset, x.value == value(x.offset)] for x in r.log("t", 0)]))
                """, path, pre=COMMON)
                mark = len(out.lines)
                subprocess.run(["mount", "-o", "remount,rw", mnt], check=True)
                out.until(("ACK",), 60, mark)             # it appended again
            open(stop, "w").close()
            text = out.rest(60)
            w.wait(timeout=60)
        finally:
            subprocess.run(["mount", "-o", "remount,rw", mnt], capture_output=True)
            if w.poll() is None:
                w.kill()
                w.wait()
        err = (tmp_path / "writer.err").read_text(errors="replace")
        if not remounted:
            pytest.skip("the writer always had a file open for writing: the remount never landed")
        assert w.returncode == 0, f"KILLED or failed: writer exit {w.returncode}\n{err[-4000:]}"
        lines = parse(text)
        acked = acked_of(lines)
        COUNTS["faults"] += 1
        COUNTS["records_acked"] += len(acked)
        fails = [p for p in lines if p[0] in ("OPENFAIL", "FAIL", "CLOSEFAIL")]
        assert fails, "the writer never met the read-only filesystem"
        for p in fails:
            assert p[1].startswith("kstore.errors."), \
                f"UNEXPECTED EXCEPTION: a read-only filesystem raised {p[1]} {p[2]} {json.loads(p[3])}"
            assert p[2] == str(errno.EROFS) or os.strerror(errno.EROFS) in json.loads(p[3]), p
        before = acked_of(lines[:lines.index(fails[0])])       # acknowledged before the remount
        assert before, "no append was acknowledged before the remount"
        check_all_acked(json.loads(failure_of(reader, "RECS")[1]), before)
        assert lines[-1] == ["STOP"]
        assert any(p[0] == "ACK" for p in lines[lines.index(fails[-1]):]), \
            "the writer never appended again once the filesystem was writable"
        lines = run(REOPEN_AND_CHECK, "manager", path, "10", pre=COMMON)
        check_all_acked(json.loads(failure_of(lines, "RECS")[1]), acked)


@pytest.fixture(scope="module", autouse=True)
def _file_counts(reliability_counts):
    yield
    reliability_counts["faults_real"] = dict(COUNTS)
