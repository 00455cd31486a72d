"""kstore/_mapping.pyx's SIGBUS guard (_sigbus.h): a file that another process truncates under a
kstore mapping gives a clean kstore error, never a process killed by SIGBUS; a SIGBUS anywhere
else still kills the process as before. Each case runs in a child process (cwd outside the
checkout, PYTHONPATH passed through), so a guard that failed kills the child, not the run."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the guard is Linux's")


def run(tmp_path, code, *args, timeout=120):
    """(exit status, stdout, stderr) of `code` run as a child process in tmp_path."""
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                       cwd=str(tmp_path), capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def test_a_read_past_a_truncated_end_raises_instead_of_dying(tmp_path):
    """Before the guard, touching a mapped page past the file's new end killed the process
    (SIGBUS, exit -7). Now the page reads as zeros, the mapping says it is no longer intact,
    and kstore's reads of it raise CorruptRecordError; the first page, still in the file,
    reads as it is. Other mappings, made before and after, are unaffected."""
    rc, out, err = run(tmp_path, """
        import os, sys
        from kstore import _core
        from kstore.errors import CorruptRecordError
        def mapped(name, data):
            with open(name, "wb") as f:
                f.write(data)
            fd = os.open(name, os.O_RDONLY)
            try:
                return _core.Mapping(fd, len(data), False)
            finally:
                os.close(fd)
        other = mapped("other", b"o" * 20000)
        m = mapped("victim", bytes(range(256)) * 80)       # 20480 bytes: five pages
        os.truncate("victim", 4096)
        try:
            m.read(8192, 16)
            print("read: no error")
        except CorruptRecordError as e:
            print("read:", e)
        print("intact:", m.intact, other.intact)
        print("view:", bytes(memoryview(m)[8192:8196]), bytes(memoryview(m)[:4]))
        later = mapped("later", b"l" * 9000)
        print("others:", other.read(19990, 10), later.read(8990, 10), later.intact)
        m.close()
    """)
    assert rc == 0, err
    assert out.splitlines() == [
        "read: the file shrank under its mapping (another process truncated it); what was "
        "read from past its new end is not data",
        "intact: False True",
        "view: b'\\x00\\x00\\x00\\x00' b'\\x00\\x01\\x02\\x03'",
        "others: b'oooooooooo' b'llllllllll' True"]


READER = """
    import sys, kstore
    d = sys.argv[1]
    with kstore.StoreReader(d) as r:
        lg = r.log("t", 0)
        print("before", len(lg.read(0, max_bytes=1 << 30)), flush=True)
        sys.stdin.readline()                    # the parent truncates the first segment
        for what, call in (("read", lambda: lg.read(0, max_bytes=1 << 30)),
                           ("time", lambda: lg.offset_for_timestamp(1000)),
                           ("later", lambda: [r.offset for r in lg.read(1400, max_records=3)])):
            try:
                print(what, call(), flush=True)
            except kstore.KStoreError as e:
                print(what, type(e).__name__, e, flush=True)
"""


def test_a_reader_in_another_process_survives_a_segment_truncated_under_it(tmp_path):
    """A StoreReader that has read a rolled segment keeps it mapped; another process truncates
    the segment to 0 bytes (an operator's `truncate`, a broken tool). The reader's next reads
    of it raise CorruptRecordError naming the file (before: the reader died of SIGBUS); the
    segments after it read as before."""
    import kstore
    d = str(tmp_path / "s")
    with kstore.LogManager(d, {"log.segment.bytes": "20000", "log.cleaner.enable": False}) as m:
        m.create_topic("t", 1)
        for i in range(30):
            m.log("t", 0).append([(b"k%d" % j, b"v" * 100, 1000 + i * 100 + j) for j in range(50)])
    first = os.path.join(d, "t-0", "00000000000000000000.log")
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(READER), d], cwd=str(tmp_path),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline() == "before 1500\n"
        os.truncate(first, 0)
        p.stdin.write("\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 0, err
    why = ("the file shrank under its mapping (another process truncated it); what was read "
           f"from past its new end is not data ({first})")
    assert out.splitlines() == [f"read CorruptRecordError {why}", f"time CorruptRecordError {why}",
                                "later [1400, 1401, 1402]"]


def test_the_writer_refuses_an_append_to_a_segment_truncated_under_it(tmp_path):
    """The active segment truncated under its writer: the append's copy into the mapping would
    have died of SIGBUS. Now the append fails with KafkaStorageError naming the log, nothing of
    it is acknowledged, and the log refuses writes from then on (its file is not what it
    wrote); the process goes on."""
    rc, out, err = run(tmp_path, """
        import os, kstore
        lg = kstore.Log.open("t-0")
        lg.append([(b"k", b"v" * 100)] * 10)
        lg.flush()
        os.truncate(os.path.join("t-0", "00000000000000000000.log"), 0)
        for i in range(2):
            try:
                print(lg.append([(b"k", b"w" * 5000)]))
            except kstore.KafkaStorageError as e:
                print(type(e).__name__, e.errno, e)
        print("end", lg.log_end_offset)
    """)
    assert rc == 0, err
    why = ("[Errno 5] the file was truncated under the writer's mapping by another process: the "
           "append is not in it writing 5071 bytes at 1161 of t-0/00000000000000000000.log "
           "(nothing of the append was kept)")
    assert out.splitlines() == [
        f"KafkaStorageError 5 {why}",
        f"KafkaStorageError 5 [Errno 5] log t-0 failed after an I/O error ({why}); reopen it "
        "once the disk is fixed",
        "end 10"]


def test_a_large_append_is_refused_once_its_segment_read_zeros(tmp_path):
    """A large append (a pwrite, past the mapping) to an active segment whose mapping has read
    zeros where another process truncated the file: refused as a small one (KafkaStorageError,
    its bytes zeroed again, the log refusing writes). Before, it was acknowledged (offset 100)
    into a file whose first 11 KB were now a hole, while every read of the segment in the
    process raised CorruptRecordError, and a restart's recovery dropped it."""
    rc, out, err = run(tmp_path, """
        import os, kstore
        from kstore.errors import CorruptRecordError
        lg = kstore.Log.open("t-0")
        lg.append([(b"k", b"v" * 100)] * 100)
        lg.flush()
        os.truncate(os.path.join("t-0", "00000000000000000000.log"), 0)
        try:
            lg.read(0)
        except CorruptRecordError as e:
            print("read:", type(e).__name__)
        try:
            print(lg.append([(b"k", b"w" * 40000)]))
        except kstore.KafkaStorageError as e:
            print(type(e).__name__, e.errno, e)
        with open(os.path.join("t-0", "00000000000000000000.log"), "rb") as f:
            print("end", lg.log_end_offset, f.read().strip(b"\\0"))
    """)
    assert rc == 0, err
    assert out.splitlines() == [
        "read: CorruptRecordError",
        "KafkaStorageError 5 [Errno 5] the file was truncated under the writer's mapping by "
        "another process: the append is not in it writing 40073 bytes at 11097 of "
        "t-0/00000000000000000000.log (nothing of the append was kept)",
        "end 100 b''"]


@pytest.mark.parametrize("faulthandler_first", [True, False])
def test_a_sigbus_outside_kstore_still_kills_the_process(tmp_path, faulthandler_first):
    """The guard only answers for kstore's own mappings: a SIGBUS in another mapping (Python's
    mmap module here) kills the process as before, and faulthandler, enabled before or after
    kstore's first mapping, still prints its report. Enabled after, faulthandler takes SIGBUS
    over; kstore takes it back (chaining to faulthandler) within its next 64 mappings."""
    rc, out, err = run(tmp_path, """
        import faulthandler, mmap, os, sys
        first = sys.argv[1] == "True"
        if first:
            faulthandler.enable()
        from kstore import _core
        from kstore.errors import CorruptRecordError
        for name in ("k", "f"):
            with open(name, "wb") as f:
                f.write(b"x" * 8192)
        kd, fd = os.open("k", os.O_RDONLY), os.open("f", os.O_RDONLY)
        ours = _core.Mapping(kd, 8192, False)
        if not first:
            faulthandler.enable()
        for _ in range(64):
            _core.Mapping(kd, 8192, False)
        os.truncate("k", 0)
        try:
            ours.read(5000, 1)
        except CorruptRecordError:
            print("kstore", ours.intact, flush=True)
        theirs = mmap.mmap(fd, 8192, prot=mmap.PROT_READ)
        os.truncate("f", 0)
        theirs[5000]
        print("survived", flush=True)
    """, faulthandler_first)
    assert rc == -signal.SIGBUS
    assert out == "kstore False\n"
    assert "Fatal Python error: Bus error" in err


def test_many_mappings_are_guarded_and_their_slots_reused(tmp_path):
    """The guard's registry grows past one chunk (1024 ranges) and reuses the slots of closed
    mappings: with 3000 made and 2000 closed, a truncation under any live one is caught, and
    only that one stops being intact."""
    rc, out, err = run(tmp_path, """
        import os
        from kstore import _core
        from kstore.errors import CorruptRecordError
        with open("f", "wb") as f:
            f.write(b"z" * 12288)
        with open("g", "wb") as f:
            f.write(b"g" * 12288)
        fd, gd = os.open("f", os.O_RDONLY), os.open("g", os.O_RDONLY)
        maps = [_core.Mapping(fd, 12288, False) for _ in range(3000)]
        for m in maps[:2000]:
            m.close()
        again = [_core.Mapping(fd, 12288, False) for _ in range(500)]
        victim = _core.Mapping(gd, 12288, False)
        os.truncate("g", 100)
        try:
            victim.read(9000, 4)
        except CorruptRecordError:
            print("caught")
        live = maps[2000:] + again
        print(sum(m.read(12280, 4) == b"zzzz" for m in live), sum(m.intact for m in live))
    """)
    assert rc == 0, err
    assert out.splitlines() == ["caught", "1500 1500"]


def test_a_sigbus_outside_kstore_kills_after_faulthandler_is_disabled(tmp_path):
    """faulthandler enabled after kstore's first mapping, taken back by kstore (64 mappings
    later), then disabled: a SIGBUS outside kstore still kills the process, with no report.
    Before, kstore passed it on by installing faulthandler's handler, which returns at once once
    disabled: the faulting access ran again and again and the process spun forever."""
    rc, out, err = run(tmp_path, """
        import faulthandler, mmap, os
        from kstore import _core
        with open("k", "wb") as f:
            f.write(b"x" * 8192)
        with open("f", "wb") as f:
            f.write(b"y" * 8192)
        kd, fd = os.open("k", os.O_RDONLY), os.open("f", os.O_RDONLY)
        ours = _core.Mapping(kd, 8192, False)
        faulthandler.enable()
        for _ in range(64):
            _core.Mapping(kd, 8192, False)
        faulthandler.disable()
        os.truncate("k", 0)
        print("kstore", bytes(memoryview(ours)[5000:5001]), ours.intact, flush=True)
        theirs = mmap.mmap(fd, 8192, prot=mmap.PROT_READ)
        os.truncate("f", 0)
        theirs[5000]
        print("survived", flush=True)
    """, timeout=30)
    assert rc == -signal.SIGBUS
    assert out.splitlines() == ["kstore b'\\x00' False"]
    assert "Fatal Python error" not in err


def test_a_python_sigbus_handler_gets_a_sent_sigbus_and_the_guard_stays(tmp_path):
    """A SIGBUS sent by kill() to a process whose Python code handles SIGBUS reaches that handler
    (kstore passes it on), and kstore's guard stays: a segment truncated afterwards still gives
    CorruptRecordError. Before, passing it on took the guard out for good, and the process died
    of the truncation (exit -7)."""
    rc, out, err = run(tmp_path, """
        import os, signal
        from kstore import _core
        from kstore.errors import CorruptRecordError
        with open("k", "wb") as f:
            f.write(b"x" * 8192)
        kd = os.open("k", os.O_RDONLY)
        first = _core.Mapping(kd, 8192, False)
        got = []
        signal.signal(signal.SIGBUS, lambda sig, frame: got.append(sig))
        for _ in range(64):
            _core.Mapping(kd, 8192, False)
        os.kill(os.getpid(), signal.SIGBUS)
        print("handled", got == [signal.SIGBUS], flush=True)
        for _ in range(64):
            _core.Mapping(kd, 8192, False)
        m = _core.Mapping(kd, 8192, False)
        os.truncate("k", 0)
        try:
            m.read(5000, 1)
        except CorruptRecordError:
            print("caught", m.intact, flush=True)
    """, timeout=30)
    assert (rc, out.splitlines()) == (0, ["handled True", "caught False"]), err


def test_faults_in_scans_without_the_gil_beside_a_thread_making_and_closing_mappings(tmp_path):
    """A segment truncated under recover_scan (two threads hashing without the GIL) 200 times,
    at a different length each time, while another thread makes and closes mappings (the
    registry changing under the handler): every scan raises CorruptRecordError with its mapping
    marked, and every mapping of the other thread stays intact and reads its bytes. (Before the
    guard the first scan killed the process, exit -7.)"""
    rc, out, err = run(tmp_path, """
        import os, threading, kstore
        from kstore import _core
        from kstore.errors import CorruptRecordError
        lg = kstore.Log.open("t-0")
        for _ in range(40):
            lg.append([(b"k", b"v" * 100)] * 100)
        lg.flush()
        with open(os.path.join("t-0", "00000000000000000000.log"), "rb") as f:
            seg = f.read()
        lg.close()
        with open("other", "wb") as f:
            f.write(b"o" * 8192)
        od = os.open("other", os.O_RDONLY)
        stop, made, good = [], [0], [0]
        def churn():
            while not stop:
                ms = [_core.Mapping(od, 8192, False) for _ in range(50)]
                good[0] += sum(m.read(8190, 2) == b"oo" and m.intact for m in ms)
                for m in ms[::2]:
                    m.close()
                made[0] += len(ms)
        t = threading.Thread(target=churn)
        t.start()
        caught = 0
        for i in range(200):
            with open("seg", "wb") as f:
                f.write(seg)
            fd = os.open("seg", os.O_RDONLY)
            m = _core.Mapping(fd, len(seg), False)
            os.close(fd)
            os.truncate("seg", 4096 * (1 + i % 50))
            try:
                _core.recover_scan(m, len(seg), 0, 4096, 100000, 100000, True, threads=2)
            except CorruptRecordError:
                caught += not m.intact
            m.close()
        stop.append(1)
        t.join(60)
        print(len(seg) > 4096 * 51, caught, made[0] == good[0] > 0, flush=True)
    """, timeout=120)
    assert (rc, out) == (0, "True 200 True\n"), err


def test_a_fault_a_python_sigbus_handler_cannot_fix_kills_instead_of_spinning(tmp_path):
    """A Python SIGBUS handler (installed before kstore's first mapping, so kstore passes other
    SIGBUS on to it) cannot fix a fault: its C part returns and the access would fault again
    forever. kstore sees the same fault come back where that handler returned to and gives it
    the default action: the process dies (exit -7). Before, it spun, never running the Python
    handler. A sent SIGBUS still reaches the handler."""
    rc, out, err = run(tmp_path, """
        import mmap, os, signal
        got = []
        signal.signal(signal.SIGBUS, lambda sig, frame: got.append(sig))
        from kstore import _core
        with open("k", "wb") as f:
            f.write(b"x" * 8192)
        kd = os.open("k", os.O_RDONLY)
        ours = _core.Mapping(kd, 8192, False)
        os.kill(os.getpid(), signal.SIGBUS)
        print("sent", got, flush=True)
        theirs = mmap.mmap(kd, 8192, prot=mmap.PROT_READ)
        os.truncate("k", 0)
        theirs[5000]
        print("survived", flush=True)
    """, timeout=30)
    assert (rc, out) == (-signal.SIGBUS, "sent [7]\n"), err
