"""Multi-process soak (issue 12, "Tests that stay"): one writer process (a LogManager with the real
scheduler and cleaner, small segments, retention, delete_records, periodic truncate_to, topics
created and deleted) and reader processes beside it: a StoreReader polling with refresh (which
also scans the truncated topic from its start every third pass, so truncations and rolls land
under a lagging reader, and opens a read-only LogManager every tenth pass), and
`python -m kstore consume --follow`.
KSTORE_CONCURRENCY_SOAK_SECONDS sets the length (60 in CI).

Each record's value is b"<generation>:<offset>", the generation counting the writer's truncations
of that topic, so what a reader prints proves itself against what the writer printed. The writer
prints every acknowledged batch ("A topic first last generation"), every truncation
("T topic target generation") and the final log start and end ("E topic start end"). The readers
print every record they read and every position reset (OffsetOutOfRangeError, compacted gap).
Checked exactly: no reader dies by a signal or hangs, each exits 0; every record a reader printed
was acknowledged at that offset in that generation; a reader's offsets advance by exactly one,
except across a reset that a removal explains (retention or delete_records below the log start,
a truncation below the position, a compacted gap); each reader reaches the final log end."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

SECONDS = float(os.environ.get("KSTORE_CONCURRENCY_SOAK_SECONDS", "60"))
TOPICS = ("events", "trunc", "comp")
CFG = {"log.segment.bytes": 2048, "log.index.size.max.bytes": 4096, "log.index.interval.bytes": 256,
       "log.retention.check.interval.ms": 50, "log.flush.interval.ms": 30,
       "log.flush.scheduler.interval.ms": 20, "log.initial.task.delay.ms": 0,
       "log.flush.offset.checkpoint.interval.ms": 40, "log.flush.start.offset.checkpoint.interval.ms": 40,
       "log.cleaner.backoff.ms": 30, "log.cleaner.threads": 2, "log.segment.delete.delay.ms": 10,
       "file.delete.delay.ms": 10, "auto.create.topics.enable": False}

WRITER = textwrap.dedent("""
    import json, logging, random, sys, time, kstore
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    root, cfg, seconds, path = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    out = open(path, "w", buffering=1)
    m = kstore.LogManager(root, cfg)
    m.create_topic("events", 1, {"retention.bytes": 16384})
    m.create_topic("trunc", 1, {"segment.bytes": 16384})   # truncations cross pages
    m.create_topic("comp", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.05,
                               "segment.bytes": 1024})
    print("ready", file=out)
    rng = random.Random(12)
    gen = {"events": 0, "trunc": 0, "comp": 0}
    firsts = []
    churn = 0
    t0 = time.monotonic()
    last_trunc = last_del = last_churn = t0
    while time.monotonic() < t0 + seconds:
        for t in ("events", "trunc", "comp"):
            o = m.log(t, 0).log_end_offset
            n = rng.randint(1, 4)
            info = m.append_batch(t, 0, [(b"k%d" % ((o + j) % 13), b"%d:%d" % (gen[t], o + j))
                                         for j in range(n)])
            assert info.first_offset == o and info.last_offset == o + n - 1, (t, o, n, info)
            print("A", t, o, o + n - 1, gen[t], file=out)
            if t == "trunc":
                firsts.append(o)
                del firsts[:-200]
        now = time.monotonic()
        if now - last_trunc > 0.15 and len(firsts) > 12:
            target = firsts[-rng.randint(1, min(len(firsts), 150))]     # a batch boundary
            if m.log("trunc", 0).truncate_to(target):
                gen["trunc"] += 1
                print("T trunc", target, gen["trunc"], file=out)
            firsts = [f for f in firsts if f < target]
            last_trunc = now
        if now - last_del > 1.0:
            lg = m.log("events", 0)
            start = lg.delete_records(min(lg.log_end_offset, lg.log_start_offset + 25))
            print("S events", start, file=out)
            last_del = now
        if now - last_churn > 0.3:
            name = "tmp-%d" % churn
            churn += 1
            m.create_topic(name, 2, {"segment.bytes": 1024})
            for j in range(16):
                m.append_batch(name, j % 2, [(None, b"x" * 120)])
            print("C", name, file=out)
            if churn >= 3:
                m.delete_topic("tmp-%d" % (churn - 3))
                print("D", "tmp-%d" % (churn - 3), file=out)
            last_churn = now
        time.sleep(0.002)
    for t in ("events", "trunc", "comp"):
        lg = m.log(t, 0)
        print("E", t, lg.log_start_offset, lg.log_end_offset, file=out)
    assert m.offline_dirs == {}, m.offline_dirs
    m.close()
    print("closed", file=out)
""")

READER = textwrap.dedent("""
    import faulthandler, json, os, signal, sys, time, traceback, kstore
    from kstore.errors import OffsetOutOfRangeError
    faulthandler.register(signal.SIGUSR1)
    root, path, stop = sys.argv[1], sys.argv[2], sys.argv[3]
    out = open(path, "w", buffering=1 << 16)
    store = kstore.StoreReader(root)
    pos = {}
    passes = 0
    while True:
        final = os.path.exists(stop)        # the writer has closed: one last pass to the end
        try:
            store.refresh()
        except Exception as e:
            print("EXC refresh -1", type(e).__module__ + "." + type(e).__name__, file=out)
            traceback.print_exc()
        names = store.topics()
        passes += 1
        if passes % 10 == 0:                # a read-only LogManager opened beside the writer
            try:
                with kstore.LogManager(root, read_only=True) as ro:
                    if ro.offline_dirs:
                        print("EXC ro-manager -1 offline:" + json.dumps(ro.offline_dirs).replace(" ", ""), file=out)
                    for t in ("events", "trunc", "comp"):
                        lg = ro.log(t, 0)
                        lg.read(lg.log_start_offset, max_bytes=300)
                print("M", passes, file=out)
            except OffsetOutOfRangeError:
                pass                        # its start moved between open and read
            except Exception as e:
                print("EXC ro-manager -1", type(e).__module__ + "." + type(e).__name__, file=out)
                traceback.print_exc()
        for t in names:
            if t.startswith("tmp-"):        # topics the writer creates and deletes
                try:
                    lg = store.log(t, 0, refresh=True)
                    lg.read(lg.log_start_offset, max_bytes=400)
                except kstore.KStoreError as e:
                    print("X", t, type(e).__name__, file=out)
                except Exception as e:
                    print("EXC", t, 0, type(e).__module__ + "." + type(e).__name__, file=out)
                    traceback.print_exc()
        if "trunc" in names and passes % 3 == 0:
            # a lagging reader: a scan of the truncated topic from its start, up to the end it
            # knew when it began, so truncations land under it (pages past the new end of file)
            try:
                lg = store.log("trunc", 0)
                p, end = lg.log_start_offset, lg.log_end_offset
                while p < end:
                    recs = lg.read(p, max_bytes=2000)
                    if not recs:
                        break
                    for r in recs:
                        if r.value.decode().partition(":")[2] != str(r.offset):
                            print("BAD trunc", r.offset, r.value.decode(), file=out)
                    p = recs[-1].offset + 1
                print("L", p, file=out)
            except OffsetOutOfRangeError:
                pass                        # a truncation went below the scan
            except Exception as e:
                print("EXC trunc-scan -1", type(e).__module__ + "." + type(e).__name__, file=out)
                traceback.print_exc()
        for t in ("events", "trunc", "comp"):
            if t not in names:
                continue
            try:
                lg = store.log(t, 0, refresh=True)
            except Exception as e:          # reported (the test fails on it); try again later
                print("EXC", t, pos.get(t, -1), type(e).__module__ + "." + type(e).__name__, file=out)
                traceback.print_exc()
                continue
            if t not in pos:
                pos[t] = lg.log_start_offset
                print("B", t, pos[t], file=out)
            p = pos[t]
            for _ in range(10 ** 6 if final else 200):
                try:
                    recs = lg.read(p, max_bytes=300)
                except OffsetOutOfRangeError:
                    s, e = lg.log_start_offset, lg.log_end_offset
                    np = s if p < s else e if p > e else p
                    print("O", t, p, np, s, e, file=out)
                    p = np
                    continue
                except Exception as e:      # reported (the test fails on it); try again later
                    print("EXC", t, p, type(e).__module__ + "." + type(e).__name__, file=out)
                    traceback.print_exc()
                    break
                if not recs:
                    end = lg.log_end_offset
                    if p < end and t == "comp":     # a gap compaction left: the next segment
                        np = next((s.base_offset for s in lg.segments if s.base_offset > p), end)
                        print("G", t, p, np, file=out)
                        p = np
                        continue
                    if p < end:
                        print("Z", t, p, end, file=out)
                    break
                for r in recs:
                    print(t, r.offset, r.value.decode(), file=out)
                p = recs[-1].offset + 1
            pos[t] = p
        if final:
            break
        time.sleep(0.01)
    print("done", json.dumps(pos), file=out)
    out.close()
    store.close()
""")


def _wait(p: subprocess.Popen, name: str, timeout: float, err_path: str) -> None:
    """Wait for p; a hang is dumped (faulthandler on SIGUSR1) and killed; a signal is named."""
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        if name.startswith("reader"):
            p.send_signal(signal.SIGUSR1)
            time.sleep(1)
        p.kill()
        p.wait()
        raise AssertionError(f"HANG: {name} still running after {timeout:.0f} s; its stacks:\n"
                             + _tail(err_path)) from None
    if p.returncode < 0:
        raise AssertionError(f"KILLED: {name} died of signal {-p.returncode} "
                             f"({signal.Signals(-p.returncode).name}); stderr:\n{_tail(err_path)}")
    assert p.returncode == 0, f"{name} exited with {p.returncode}; stderr:\n{_tail(err_path)}"


def _stop_consume(p: subprocess.Popen, wout: str, cout: str, cerr: str) -> None:
    """SIGTERM the consume once its output holds the events log's last offset (the writer's
    "E events start end" line), then expect exit 143; it ending by itself first is a failure
    (its timeout ran out: a stall). Bounded: 120 s for the record, 120 s for the exit."""
    ends = [line.split() for line in open(wout) if line.startswith("E events ")]
    assert ends, "the writer printed no end of events"
    last = int(ends[0][3]) - 1
    deadline = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < deadline:
        with open(cout) as f:
            lines = f.read().splitlines()
        if lines and lines[-1].partition("\t")[0] == f"Offset:{last}":
            break
        time.sleep(0.05)
    assert p.poll() is None, (f"consume --follow ended (exit {p.returncode}) before offset {last}; "
                              f"stderr:\n{_tail(cerr)}")
    p.send_signal(signal.SIGTERM)
    try:
        code = p.wait(120)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGUSR1)
        time.sleep(1)
        p.kill()
        p.wait()
        raise AssertionError("HANG: consume --follow still running 120 s after SIGTERM:\n"
                             + _tail(cerr)) from None
    assert code == 143, f"consume --follow exited with {code} after SIGTERM; stderr:\n{_tail(cerr)}"


def _tail(path: str, n: int = 6000) -> str:
    with open(path, "rb") as f:
        return f.read()[-n:].decode(errors="replace")


def parse_writer(path: str):
    acked: dict[str, dict[int, set]] = {t: {} for t in TOPICS}
    truncs: list[int] = []
    ends: dict[str, tuple[int, int]] = {}
    n = 0
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines and lines[-1] == "closed", f"the writer did not close cleanly: {lines[-3:]}"
    for line in lines:
        p = line.split()
        if p[0] == "A":
            t, first, last, g = p[1], int(p[2]), int(p[3]), int(p[4])
            for o in range(first, last + 1):
                acked[t].setdefault(o, set()).add(g)
            n += last - first + 1
        elif p[0] == "T":
            truncs.append(int(p[2]))
        elif p[0] == "E":
            ends[p[1]] = (int(p[2]), int(p[3]))
    return acked, truncs, ends, n


def check_sequence(name: str, t: str, events: list, acked: dict, truncs: list, ends: dict) -> int:
    """events: ("R", offset, value) records and ("O"/"G"/"B", from, to) resets, in reading order."""
    start, end = ends[t]
    expect = None
    count = 0
    for ev in events:
        kind = ev[0]
        if kind == "B":
            expect = ev[2]
        elif kind == "O":
            p, np = ev[1], ev[2]
            if np > p:      # p fell below the log start: removed by retention / delete_records
                assert np <= start, f"SKIP: {name} {t}: reset from {p} to {np}, above the final log start {start}"
            elif np < p:
                assert t == "trunc" and any(x < p for x in truncs), \
                    f"REPEAT: {name} {t}: reset back from {p} to {np} with no truncation below {p}"
            expect = np
        elif kind == "G":
            assert t == "comp", f"SKIP: {name} {t}: gap from {ev[1]} to {ev[2]} in a non-compacted log"
            expect = ev[2]
        else:
            o, v = ev[1], ev[2]
            g, _, vo = v.partition(":")
            assert vo == str(o) and int(g) in acked[t].get(o, ()), \
                f"WRONG: {name} read {t} offset {o} = {v!r}; acknowledged generations there: {acked[t].get(o)}"
            if expect is not None and o != expect:
                if t == "comp" and o > expect:
                    pass                    # compacted away
                elif o > expect:
                    assert o <= start, (f"SKIP: {name} {t}: offset {expect} expected, {o} read "
                                        f"(final log start {start})")
                else:
                    raise AssertionError(f"REPEAT: {name} {t}: offset {o} read again (expected {expect})")
            expect = o + 1
            count += 1
    assert expect == end, f"LOST: {name} {t}: stopped at offset {expect}, the log ends at {end}"
    return count


def read_reader(path: str, err_path: str) -> dict[str, list]:
    ev: dict[str, list] = {t: [] for t in TOPICS}
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines and lines[-1].startswith("done"), f"the StoreReader did not finish: {lines[-3:]}"
    exc = [line for line in lines if line.startswith("EXC ")]
    if exc:
        kinds = sorted({line.split()[3] + " reading " + re.sub(r"^tmp-\d+$", "tmp-*", line.split()[1])
                        for line in exc})
        raise AssertionError(f"UNEXPECTED EXCEPTION: the StoreReader's reads raised {len(exc)} times: "
                             f"{kinds}; first traceback:\n{open(err_path).read()[:2500]}")
    for line in lines[:-1]:
        p = line.split()
        if p[0] in TOPICS:
            ev[p[0]].append(("R", int(p[1]), p[2]))
        elif p[0] in ("O", "G"):
            ev[p[1]].append((p[0], int(p[2]), int(p[3])))
        elif p[0] == "B":
            ev[p[1]].append(("B", None, int(p[2])))
        elif p[0] == "BAD":
            raise AssertionError(f"WRONG: the StoreReader's scan read {p[1]} offset {p[2]} = {p[3]!r}")
        elif p[0] == "Z" and p[1] == "events":       # (trunc: a truncation can race the read)
            raise AssertionError(f"EMPTY READ: StoreReader read {p[1]} at {p[2]} below the log end {p[3]}")
    return ev


def read_consume(out_path: str, err_path: str) -> list:
    ev = []
    with open(out_path) as f:
        lines = f.read().splitlines()
    for line in lines:
        off, _, v = line.partition("\t")
        assert off.startswith("Offset:"), f"consume printed {line!r}"
        ev.append(("R", int(off[7:]), v))
    err = open(err_path).read()
    assert "Traceback" not in err, f"consume printed a traceback:\n{err[-4000:]}"
    assert f"Processed a total of {len(ev)} messages" in err, err[-2000:]
    return ev


def test_writer_and_reader_processes(tmp_path, reliability_counts):
    root = str(tmp_path / "store")
    env = dict(os.environ, PYTHONSAFEPATH="1")
    wout, werr = str(tmp_path / "writer.out"), str(tmp_path / "writer.err")
    stop = str(tmp_path / "stop")
    t0 = time.monotonic()
    with open(werr, "w") as e:
        w = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", WRITER, root, json.dumps(CFG),
                              str(SECONDS), wout], stderr=e, env=env)
    procs = []
    failures: list[str] = []

    def check(fn, *args):
        try:
            return fn(*args)
        except AssertionError as e:
            failures.append(str(e))
            return 0
    try:
        deadline = time.monotonic() + 30
        while not (os.path.exists(wout) and open(wout).readline() == "ready\n"):
            assert w.poll() is None, f"the writer failed to start:\n{_tail(werr)}"
            assert time.monotonic() < deadline, "HANG: the writer did not start in 30 s"
            time.sleep(0.05)
        rout, rerr = str(tmp_path / "reader.out"), str(tmp_path / "reader.err")
        with open(rerr, "w") as e:
            r = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", READER, root, rout, stop],
                                 stderr=e, env=env)
        procs.append(r)
        cout, cerr = str(tmp_path / "consume.out"), str(tmp_path / "consume.err")
        with open(cout, "w") as o, open(cerr, "w") as e:
            c = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "kstore", "consume",
                                  "--log-dirs", root, "--topic", "events", "--from-beginning",
                                  "--follow", "--print-offset", "--timeout-ms", "60000", "--poll-ms", "20"],
                                 stdout=o, stderr=e, env=env)
        procs.append(c)
        # every check runs, so one defect does not hide another; the failures are reported together
        check(_wait, w, "writer", SECONDS + 120, werr)
        open(stop, "w").close()          # the readers make a last pass to the end and exit
        check(_wait, r, "reader StoreReader", 120, rerr)
        # consume --follow is stopped with SIGTERM once it printed the writer's last record
        # (exit 143, Kafka's console consumer's): its 60 s timeout is only a safety net, far
        # above the writer's pauses under load (as 9ee492e / 4b8498f for the race readers)
        check(_stop_consume, c, wout, cout, cerr)
    finally:
        for p in [w] + procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    errors = [line for line in open(werr).read().splitlines() if line.startswith(("ERROR", "CRITICAL"))]
    if errors and w.returncode == 0:
        failures.append("ERROR LOGGED by the writer:\n" + _tail(werr, 3000))
    ev = check(read_reader, rout, rerr)
    cev = check(read_consume, cout, cerr)
    if w.returncode != 0:
        raise AssertionError(f"{len(failures)} failure(s):\n" + "\n".join(failures))
    acked, truncs, ends, n_acked = parse_writer(wout)
    assert truncs, "the writer never truncated"
    assert ends["events"][0] > 0, "retention never moved the events log start"
    read = 0
    if ev:
        for t in TOPICS:
            read += check(check_sequence, "StoreReader", t, ev[t], acked, truncs, ends)
    if cev:
        read += check(check_sequence, "consume --follow", "events", cev, acked, truncs, ends)
    assert not failures, f"{len(failures)} failure(s):\n" + "\n".join(failures)
    reliability_counts["concurrent_soak"] = {
        "seconds": SECONDS, "processes": 1 + len(procs), "writer_threads": "scheduler + 2 cleaner",
        "records_acked": n_acked, "records_read": read, "truncations": len(truncs),
        "records_lost": 0, "hangs": 0, "reader_signals": 0, "elapsed": round(time.monotonic() - t0, 1)}
