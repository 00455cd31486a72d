"""kstore.tools.console: `kstore produce` and `kstore consume` (Kafka's console tools over a store)."""
import contextlib
import io
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import kstore
from kstore.tools.cli import build_parser
from kstore.tools import console
from kstore.partitioner import partition_for_key


def args(*argv):
    return build_parser().parse_args(list(argv))


def produce(d, data: bytes, *extra):
    return console.produce(args("produce", "--log-dirs", d, *extra), stdin=io.BytesIO(data), err=io.StringIO())


def consume(d, *extra):
    out, err = io.BytesIO(), io.StringIO()
    rc = console.consume(args("consume", "--log-dirs", d, *extra), out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def contents(d, topic):
    with kstore.StoreReader(d) as s:
        return {p: [(r.offset, r.key, r.value) for r in s.log(topic, p).read(0)]
                for _t, p in s.partitions(topic)}


def test_produce_keyed_lines_go_to_the_murmur2_partition(tmp_path):
    d = str(tmp_path / "s")
    with kstore.LogManager(d, {"log.cleaner.enable": False}) as m:
        m.create_topic("T", 3)
    lines = [b"user%d:event %d" % (i % 7, i) for i in range(50)]
    assert produce(d, b"\n".join(lines) + b"\n", "--topic", "T", "--key-separator", ":") == 0
    got = contents(d, "T")
    expected = {0: [], 1: [], 2: []}
    for line in lines:
        k, v = line.split(b":", 1)
        p = partition_for_key(k, 3)
        expected[p].append((len(expected[p]), k, v))
    assert got == expected


def test_produce_unkeyed_crlf_no_trailing_newline_and_auto_create(tmp_path):
    d = str(tmp_path / "s")
    assert produce(d, b"a\r\nb\n\nc", "--topic", "new", "--partition", "0") == 0
    assert contents(d, "new")[0] == [(0, None, b"a"), (1, None, b"b"), (2, None, b""), (3, None, b"c")]


def test_produce_reads_lines_and_text_as_kafkas_console_producer(tmp_path, monkeypatch):
    """Kafka's LineMessageReader: BufferedReader.readLine over an InputStreamReader(UTF-8), and
    line.getBytes(UTF-8) as the record. So a lone \\r ends a line (before: one record 'a\\rb'),
    and malformed UTF-8 becomes U+FFFD, one per sequence as the JDK cuts them (the encoded
    surrogate ED A0 80 is one; before, its bytes went in as they were). The expected bytes are
    what Kafka 3.x's reader gives for this input (the JVM's InputStreamReader, checked here by
    tests/test_java_text.py). Small read chunks: a \\r\\n and a sequence split between reads."""
    monkeypatch.setattr(console, "READ_CHUNK", 3)
    d = str(tmp_path / "s")
    data = b"a\rb\r\nk\xc3\xa9:v\xed\xa0\x80w\n\xe2\x82\xac:\xe2\x82\n\xff:\xf0\x9f\x98\x80\r"
    assert produce(d, data, "--topic", "t", "--partition", "0") == 0
    assert contents(d, "t")[0] == [(0, None, b"a"), (1, None, b"b"),
                                   (2, None, b"k\xc3\xa9:v\xef\xbf\xbdw"),
                                   (3, None, b"\xe2\x82\xac:\xef\xbf\xbd"),
                                   (4, None, b"\xef\xbf\xbd:\xf0\x9f\x98\x80")]
    assert produce(d, b"k\x80:v\rz:\xe0\x80", "--topic", "u", "--partition", "0",
                   "--key-separator", ":") == 0
    assert contents(d, "u")[0] == [(0, b"k\xef\xbf\xbd", b"v"),
                                   (1, b"z", b"\xef\xbf\xbd\xef\xbf\xbd")]


def test_produce_splits_a_line_spanning_many_reads_once(tmp_path, monkeypatch):
    """A line longer than a read is split once its end comes: each byte goes through the
    splitter at most twice. Before, every read joined and rescanned everything read since the
    last line end (quadratic: 64 reads of 1 KiB passed ~2 MiB through the splitter)."""
    monkeypatch.setattr(console, "READ_CHUNK", 1024)
    scanned = []
    split = console._core.split_lines
    monkeypatch.setattr(console._core, "split_lines",
                        lambda data, *a: scanned.append(len(data)) or split(data, *a))
    d = str(tmp_path / "s")
    long_a, long_b = b"a" * (64 << 10), b"\xc3\xa9" * (20 << 10) + b"\xff"
    data = b"x\r" + long_a + b"\r\n" + long_b + b"\ny\rz"
    assert produce(d, data, "--topic", "t", "--partition", "0") == 0
    assert contents(d, "t")[0] == [(0, None, b"x"), (1, None, long_a),
                                   (2, None, long_b[:-1] + b"\xef\xbf\xbd"), (3, None, b"y"),
                                   (4, None, b"z")]
    assert sum(scanned) <= 2 * len(data)


def test_produce_batches_follow_batch_size(tmp_path):
    d = str(tmp_path / "s")
    data = b"".join(b"%099d\n" % i for i in range(1000))       # 99-byte values
    assert produce(d, data, "--topic", "t", "--partition", "0", "--batch-size", "16384") == 0
    from kstore.tools.dump import batches
    path = os.path.join(d, "t-0", "00000000000000000000.log")
    counts = [b["count"] for b in batches(open(path, "rb").read(), path)]
    assert sum(counts) == 1000
    # each record counts as 32 + 99 bytes (its encoded size's upper bound) against batch.size
    # 16384: a batch closes before the 126th
    assert counts == [125] * 8


def test_produce_missing_separator_names_the_line(tmp_path):
    d = str(tmp_path / "s")
    with pytest.raises(kstore.KStoreError, match=r"No key separator found on line number 2: 'oops'"):
        produce(d, b"k:v\noops\nk2:v2\n", "--topic", "t", "--key-separator", ":",
                "--partition", "0")
    # the lines before the bad one are appended, nothing from it on
    assert [(k, v) for _o, k, v in contents(d, "t")[0]] == [(b"k", b"v")]


def test_consume_formats_like_kafkas_default_formatter(tmp_path):
    d = str(tmp_path / "s")
    with kstore.LogManager(d, {"log.cleaner.enable": False}) as m:
        m.create_topic("T", 2)
        m.append("T", b"k1", b"v1", partition=0, timestamp=1000, headers=[("h1", b"x"), ("h2", None)])
        m.append("T", None, None, partition=0, timestamp=1001)
        m.append("T", b"k3", b"v3", partition=1, timestamp=1002)
    rc, out, err = consume(d, "--topic", "T", "--from-beginning")
    assert (rc, out, err) == (0, b"v1\nnull\nv3\n", "Processed a total of 3 messages\n")
    rc, out, _ = consume(d, "--topic", "T", "--from-beginning", "--print-key", "--print-timestamp",
                         "--print-partition", "--print-offset", "--print-headers")
    assert out == (b"CreateTime:1000\tPartition:0\tOffset:0\th1:x,h2:null\tk1\tv1\n"
                   b"CreateTime:1001\tPartition:0\tOffset:1\tNO_HEADERS\tnull\tnull\n"
                   b"CreateTime:1002\tPartition:1\tOffset:0\tNO_HEADERS\tk3\tv3\n")
    rc, out, _ = consume(d, "--topic", "T", "--from-beginning", "--print-key", "--key-separator", "=",
                         "--line-separator", "|")
    assert out == b"k1=v1|null=null|k3=v3|"


def test_consume_start_positions(tmp_path):
    d = str(tmp_path / "s")
    with kstore.LogManager(d, {"log.cleaner.enable": False}) as m:
        m.create_topic("T", 1)
        for i in range(10):
            m.append("T", None, b"v%d" % i, partition=0, timestamp=1000 + 10 * i)
    assert consume(d, "--topic", "T")[1:] == (b"", "Processed a total of 0 messages\n")   # latest
    assert consume(d, "--topic", "T", "--partition", "0", "--offset", "7")[1] == b"v7\nv8\nv9\n"
    assert consume(d, "--topic", "T", "--offset", "earliest", "--max-messages", "2")[1] == b"v0\nv1\n"
    assert consume(d, "--topic", "T", "--time", "1055")[1] == b"v6\nv7\nv8\nv9\n"
    assert consume(d, "--topic", "T", "--time", "99999")[1] == b""
    with pytest.raises(kstore.KStoreError, match="--offset with a number needs --partition"):
        consume(d, "--topic", "T", "--offset", "3")
    with pytest.raises(kstore.KStoreError, match="at most one of"):
        consume(d, "--topic", "T", "--offset", "earliest", "--from-beginning")
    with pytest.raises(kstore.UnknownTopicError):
        consume(d, "--topic", "nope", "--from-beginning")


WRITER = textwrap.dedent("""
    import sys, time, kstore
    with kstore.LogManager(sys.argv[1], {"log.cleaner.enable": False}) as m:
        m.create_topic("live", 1)
        print("ready", flush=True)
        for i in range(200):
            m.append("live", None, b"r%d" % i, partition=0)
            if i % 20 == 19:
                time.sleep(0.05)
        print("done", flush=True)
        sys.stdin.readline()          # hold the store (and its lock) until told to stop
""")


def test_consume_follow_tails_another_process(tmp_path):
    """--follow beside the owning process: read-only, sees every record as it is appended."""
    d = str(tmp_path / "s")
    env = dict(os.environ, PYTHONSAFEPATH="1")
    w = subprocess.Popen([sys.executable, "-c", WRITER, d], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env=env, text=True)
    try:
        assert w.stdout.readline().strip() == "ready"
        c = subprocess.Popen([sys.executable, "-m", "kstore", "consume", "--log-dirs", d, "--topic", "live",
                              "--from-beginning", "--follow", "--timeout-ms", "1500", "--poll-ms", "20"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        out, err = c.communicate(timeout=60)
        assert w.stdout.readline().strip() == "done"
    finally:
        w.stdin.write("\n")
        w.stdin.flush()
        w.wait(timeout=30)
    assert c.returncode == 0
    assert out.decode().splitlines() == [f"r{i}" for i in range(200)]
    assert err.decode().splitlines()[-1] == "Processed a total of 200 messages"



def test_consume_follow_at_a_transaction_marker_sleeps(tmp_path, watchdog):
    """--follow with the log ending in a transaction marker (a broker's, or append_batches'):
    the position passes the marker and the wait sleeps. Before, the read at the marker returned
    nothing, the position stayed on it and the wait (for the log end to pass the position) returned
    at once: 100% of a core until the next append (1.66 s of CPU in 1.5 s of --timeout-ms)."""
    from batch_helpers import txn_batch
    watchdog(60)
    d = str(tmp_path / "s")
    with kstore.LogManager(d) as m:
        m.create_topic("t", 1)
        m.log("t", 0).append([(b"a", b"plain0")])
        m.log("t", 0).append_batches(txn_batch(0, 4, [b"c1"]))
        m.log("t", 0).append_batches(txn_batch(0, 4, control=1))      # 2: COMMIT, the last batch
    cpu = time.process_time()
    rc, out, err = consume(d, "--topic", "t", "--from-beginning", "--follow", "--timeout-ms", "1000")
    assert (rc, out) == (0, b"plain0\nc1\n")
    assert err.splitlines()[-1] == "Processed a total of 2 messages"
    assert time.process_time() - cpu < 0.5

def _transactions(d):
    """t-0: pid 1's committed a1 a2, pid 2's aborted b1, a plain record, pid 3's open c1."""
    from batch_helpers import txn_batch
    with kstore.LogManager(d) as m:
        m.create_topic("t", 1)
        lg = m.log("t", 0)
        lg.append_batches(txn_batch(0, 1, [b"a1", b"a2"]))     # 0, 1
        lg.append_batches(txn_batch(0, 2, [b"b1"]))            # 2
        lg.append_batches(txn_batch(0, 1, control=1))          # 3 COMMIT pid 1
        lg.append_batches(txn_batch(0, 2, control=0))          # 4 ABORT pid 2
        lg.append([(None, b"plain")])                          # 5
        lg.append_batches(txn_batch(0, 3, [b"c1"]))            # 6, open: the LSO
        lg.append([(None, b"after")])                          # 7


def test_consume_isolation_level_read_committed(tmp_path, watchdog):
    """Kafka's console consumer's --isolation-level: read_committed prints committed
    transactions' records and plain ones, never an aborted one, and stops at the last stable
    offset (the first offset of a transaction still open) until its marker comes; then it goes
    on (the marker written by another process). read_uncommitted (the default) prints every
    data record. Markers never print. The same through a group (--group: a Consumer with
    isolation_level)."""
    from batch_helpers import txn_batch
    watchdog(60)
    d = str(tmp_path / "s")
    _transactions(d)
    assert consume(d, "--topic", "t", "--from-beginning")[:2] == (0, b"a1\na2\nb1\nplain\nc1\nafter\n")
    rc, out, err = consume(d, "--topic", "t", "--from-beginning", "--isolation-level", "read_committed",
                           "--print-offset")
    assert (rc, out) == (0, b"Offset:0\ta1\nOffset:1\ta2\nOffset:5\tplain\n")
    assert err.splitlines()[-1] == "Processed a total of 3 messages"
    rc, out, _err = consume(d, "--topic", "t", "--from-beginning", "--isolation-level", "read_committed",
                            "--group", "g")
    assert (rc, out) == (0, b"a1\na2\nplain\n")
    # --follow waits at the LSO (asleep: the position is below the log end) until pid 3 commits
    got = {}
    cpu = time.process_time()
    t = threading.Thread(target=lambda: got.update(r=consume(
        d, "--topic", "t", "--from-beginning", "--isolation-level", "read_committed", "--follow",
        "--max-messages", "5", "--timeout-ms", "20000")))
    t.start()
    time.sleep(1.0)
    assert t.is_alive() and time.process_time() - cpu < 0.5
    # pid 3's COMMIT (offset 8), appended by a writer in another process
    subprocess.run([sys.executable, "-c", "import sys, kstore\n"
                    "with kstore.LogManager(sys.argv[1]) as m:\n"
                    "    m.log('t', 0).append_batches(bytes.fromhex(sys.argv[2]))",
                    d, txn_batch(0, 3, control=1).hex()], cwd=str(tmp_path), check=True, timeout=60)
    t.join(30)
    assert got["r"][:2] == (0, b"a1\na2\nplain\nc1\nafter\n")


@pytest.mark.parametrize("iso", ["read_uncommitted", "read_committed"])
def test_consume_reads_past_a_segment_of_markers_only_to_the_record_after_a_gap(tmp_path, iso):
    """More markers than a read takes, then a marker, a gap and a record in the next segment:
    the record prints. Before, the position went past the markers (to the gap) and then on to
    the next segment's base, as for a compacted tail, and the record never printed."""
    from batch_helpers import markers_then_records
    d = str(tmp_path / "s")
    at = markers_then_records(d)
    rc, out, _err = consume(d, "--topic", "t", "--from-beginning", "--isolation-level", iso,
                            "--print-offset")
    assert (rc, out) == (0, b"Offset:%d\tplain\nOffset:%d\tnext\n" % (at, at + 1))


def test_cli_produce_consume_round_trip_in_a_shell(tmp_path):
    d = str(tmp_path / "s")
    env = dict(os.environ, PYTHONSAFEPATH="1")
    k = [sys.executable, "-m", "kstore"]
    r = subprocess.run(k + ["topics", "create", "--log-dirs", d, "--topic", "T", "--partitions", "1"],
                       capture_output=True, env=env)
    assert (r.returncode, r.stdout) == (0, b"Created topic T.\n")
    r = subprocess.run(k + ["produce", "--log-dirs", d, "--topic", "T", "--key-separator", "\\t"],
                       input=b"a\t1\nb\t2\n", capture_output=True, env=env)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"")     # nothing on stderr off a terminal
    r = subprocess.run(k + ["consume", "--log-dirs", d, "--topic", "T", "--from-beginning", "--print-key"],
                       capture_output=True, env=env)
    assert (r.returncode, r.stdout) == (0, b"a\t1\nb\t2\n")
    r = subprocess.run(k + ["consume", "--log-dirs", d, "--topic", "missing", "--from-beginning"],
                       capture_output=True, env=env)
    assert r.returncode == 1 and r.stderr.startswith(b"kstore: error: Topic 'missing' does not exist")


def test_consume_follow_goes_on_when_retention_deletes_what_it_was_reading(tmp_path, watchdog):
    """Defect 7: `consume --follow` listed segments, then the writer's retention deleted them
    before the read reached them: the consumer died of a raw FileNotFoundError. Now it says the
    offset is gone, resumes at the new log start and keeps following."""
    from kstore.fileio import FileOps, set_file_ops
    from writer_process import WriterProcess
    watchdog(60)
    d = str(tmp_path)
    w = WriterProcess(d, d)

    class Hook(FileOps):
        """The writer deletes segments below `cut` the moment the consumer first opens the
        .log of segment `at` (after it listed the partition)."""
        at = cut = None

        def open(self, path, flags, mode=0o644):
            if self.at is not None and path.endswith("%020d.log" % self.at):
                self.at = None
                w.run(f"lg.delete_records({self.cut})", "lg.delete_old_segments()")
            return super().open(path, flags, mode)

    try:
        w.run("m.create_topic('t', 1)", "lg = m.log('t', 0)",
              "for o in range(80): lg.append([(None, b'r%d' % o + b'.' * 40)])")
        bases = [int(n[:20]) for n in sorted(os.listdir(tmp_path / "t-0")) if n.endswith(".log")]
        assert len(bases) >= 6
        hook = Hook()
        hook.at, hook.cut = bases[2], bases[4]
        prev = set_file_ops(hook)
        try:
            rc, out, err = consume(d, "--topic", "t", "--from-beginning", "--follow",
                                   "--timeout-ms", "500", "--poll-ms", "20")
        finally:
            set_file_ops(prev)
        assert hook.at is None, "the consumer never opened the segment"
    finally:
        assert w.close() == 0
    assert rc == 0
    got = [int(v[1:].rstrip(".")) for v in out.decode().split()]
    # a run from the beginning that stops before the deleted segment, then the rest from the
    # new start, each record once, in order
    resumed = got.index(bases[4])
    assert got[:resumed] == list(range(resumed)) and resumed <= bases[2]
    assert got[resumed:] == list(range(bases[4], 80))
    assert err.splitlines() == [
        f"kstore consume: offset {got[resumed - 1] + 1 if resumed else 0} of t-0 is gone "
        f"(retention); resuming at the log start {bases[4]}",
        f"Processed a total of {len(got)} messages"]


PAST_END = "offset 50 of t-0 is past the log end 30 (OffsetOutOfRange)"


def test_consume_offset_past_the_log_end_says_so(tmp_path, capsys):
    """--offset N past the log end is Kafka's OffsetOutOfRange: said as such (not "gone by
    retention", not "truncated", not a restart from the log start), exit 1."""
    from kstore.tools import cli
    d = str(tmp_path / "s")
    produce(d, b"".join(b"r%d\n" % i for i in range(30)), "--topic", "t", "--partition", "0")
    with pytest.raises(kstore.OffsetOutOfRangeError) as ei:
        consume(d, "--topic", "t", "--partition", "0", "--offset", "50")
    assert str(ei.value) == PAST_END
    capsys.readouterr()
    assert cli.main(["consume", "--log-dirs", d, "--topic", "t", "--partition", "0", "--offset", "50"]) == 1
    assert capsys.readouterr() == ("", f"kstore: error: {PAST_END}\n")


def test_consume_follow_waits_at_an_offset_past_the_log_end(tmp_path, watchdog):
    """With --follow the consumer says so and waits at N: once another process appends up to
    it, it prints the records from N, none before."""
    watchdog(120)
    d = str(tmp_path / "s")
    msg = PAST_END
    produce(d, b"".join(b"r%d\n" % i for i in range(30)), "--topic", "t", "--partition", "0")
    env = dict(os.environ, PYTHONSAFEPATH="1")
    c = subprocess.Popen([sys.executable, "-m", "kstore", "consume", "--log-dirs", d, "--topic", "t",
                          "--partition", "0", "--offset", "50", "--follow", "--max-messages", "2",
                          "--timeout-ms", "60000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert c.stderr.readline().decode() == f"kstore consume: {msg}; waiting for it\n"
        produce(d, b"".join(b"r%d\n" % i for i in range(30, 52)), "--topic", "t", "--partition", "0")
        out, err = c.communicate(timeout=60)
    finally:
        if c.poll() is None:
            c.kill()
            c.wait(timeout=30)
    assert (c.returncode, out, err) == (0, b"r50\nr51\n", b"Processed a total of 2 messages\n")


def test_consume_usage_errors_exit_2_with_the_usage(tmp_path, capsys):
    """Options that do not make a consume (or produce) command exit 2 with the subcommand's
    usage, as argparse's own usage errors; errors of the data or the store exit 1."""
    from kstore.tools import cli
    d = str(tmp_path / "s")
    produce(d, b"a\n", "--topic", "t", "--partition", "0")
    capsys.readouterr()
    for argv, why in [
            (["--offset", "3"], "--offset with a number needs --partition (as Kafka's console consumer)"),
            (["--offset", "earliest", "--from-beginning"], "give at most one of --from-beginning, --offset and --time"),
            (["--partition", "0", "--offset", "-3"], "--offset -3: must not be negative"),
            (["--partition", "0", "--offset", "soon"], "--offset 'soon': expected earliest, latest or a number")]:
        with pytest.raises(SystemExit) as ei:
            cli.main(["consume", "--log-dirs", d, "--topic", "t", *argv])
        assert ei.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: kstore consume ") and err.endswith(f"kstore consume: error: {why}\n")
    with pytest.raises(SystemExit) as ei:
        cli.main(["produce", "--log-dirs", d, "--topic", "t", "--key-separator", ""])
    assert ei.value.code == 2
    assert capsys.readouterr().err.endswith("kstore produce: error: --key-separator must not be empty\n")
    assert cli.main(["consume", "--log-dirs", d, "--topic", "nope", "--from-beginning"]) == 1


def test_consume_follow_prints_a_record_appended_after_it_started(tmp_path, watchdog):
    """--follow waits on the partitions' notification words (no sleeping between polls): a
    record appended by another process after the consumer printed the first one shows up."""
    from writer_process import WriterProcess
    watchdog(120)
    d = str(tmp_path)
    w = WriterProcess(d, d)
    env = dict(os.environ, PYTHONSAFEPATH="1")
    try:
        w.run("m.create_topic('t', 3)", "m.append('t', None, b'first', partition=2)")
        c = subprocess.Popen([sys.executable, "-m", "kstore", "consume", "--log-dirs", d, "--topic", "t",
                              "--from-beginning", "--follow", "--max-messages", "3",
                              "--timeout-ms", "60000", "--print-partition"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            assert c.stdout.readline() == b"Partition:2\tfirst\n"
            w.run("m.append('t', None, b'second', partition=0)")
            assert c.stdout.readline() == b"Partition:0\tsecond\n"
            w.run("m.append('t', None, b'third', partition=1)")
            out, err = c.communicate(timeout=60)
        finally:
            if c.poll() is None:
                c.kill()
                c.wait(timeout=30)
        assert (c.returncode, out) == (0, b"Partition:1\tthird\n")
        assert err.decode().splitlines()[-1] == "Processed a total of 3 messages"
    finally:
        assert w.close() == 0


def _hundred(m) -> None:
    """Topic t, 1 partition, records b"0".."99" at offsets 0..99."""
    m.create_topic("t", 1)
    m.append_batch("t", 0, [(None, b"%d" % i) for i in range(100)])


def _committed(d: str, group: str) -> dict:
    """group's committed offsets in the store at d, {TopicPartition: offset}."""
    from kstore.group_coordinator import GroupCoordinator
    with GroupCoordinator([d]) as gc:
        return {tp: o.offset for tp, o in gc.fetch_offsets(group).items()}


@contextlib.contextmanager
def following(d, cwd, *args):
    """`kstore consume --follow --print-offset` of topic t from its beginning, in a child run
    with cwd outside the checkout (it imports the installed kstore; PYTHONPATH kept); yields
    the process and the list its stderr lines are collected into by a thread. Killed if still
    running at the end."""
    c = subprocess.Popen([sys.executable, "-m", "kstore", "consume", "--log-dirs", d, "--topic", "t",
                          "--from-beginning", "--follow", "--print-offset", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    errs: list = []
    t = threading.Thread(target=lambda: errs.extend(c.stderr), daemon=True)
    t.start()
    try:
        yield c, errs
    finally:
        if c.poll() is None:
            c.kill()
            c.wait(timeout=30)
        t.join(10)


@pytest.mark.parametrize("partition", [True, False])
def test_consume_follow_finds_its_topic_again_after_a_re_creation(tmp_path, watchdog, partition):
    """`consume --follow` (with --partition 0, and without) beside the writer process: after
    a0, a1 the topic is deleted (the consumer says so), then created again with b0: the
    consumer prints b0 at offset 0 of the new topic and stops at --max-messages 3. Before, with
    --partition the deleted partition was never looked for again: the consumer slept on,
    printing nothing more."""
    import time
    from writer_process import WriterProcess
    watchdog(90)
    d = str(tmp_path / "s")
    os.makedirs(d)
    cfg = "{'segment.bytes': 1200, 'file.delete.delay.ms': 0}"
    w = WriterProcess(d, d)
    try:
        w.run(f"m.create_topic('t', 1, {cfg})", "m.log('t', 0).append([(None, b'a0'), (None, b'a1')])")
        with following(d, str(tmp_path), "--max-messages", "3", "--timeout-ms", "60000",
                       *(["--partition", "0"] if partition else [])) as (c, errs):
            assert [c.stdout.readline() for _ in range(2)] == ["Offset:0\ta0\n", "Offset:1\ta1\n"]
            w.run("m.delete_topic('t')")
            deadline = time.monotonic() + 30
            while not errs and time.monotonic() < deadline:
                time.sleep(0.01)
            w.run(f"m.create_topic('t', 1, {cfg})", "m.log('t', 0).append([(None, b'b0')])")
            out = c.stdout.read()        # to its end: the consumer's exit (the watchdog bounds it)
            c.wait(timeout=60)
        assert (c.returncode, out) == (0, "Offset:0\tb0\n")
        assert errs == ["kstore consume: t-0 was deleted\n", "Processed a total of 3 messages\n"]
    finally:
        assert w.close() == 0


@pytest.mark.parametrize("n", [3, 1])
def test_consume_follow_reads_a_re_created_topic_from_its_start(tmp_path, watchdog, n):
    """The writer process deletes t and creates it again with n records in one step (between
    two reads of `consume --follow`): the consumer says so and prints the new topic from offset
    0. The old code went on at its position (2) in the new log: with 3 records it printed b2
    only, skipping b0 and b1; with 1 it took the new log for a truncated one and skipped b0."""
    from writer_process import WriterProcess
    watchdog(90)
    d = str(tmp_path / "s")
    os.makedirs(d)
    cfg = "{'file.delete.delay.ms': 0}"
    w = WriterProcess(d, d)
    try:
        w.run(f"m.create_topic('t', 1, {cfg})", "m.log('t', 0).append([(None, b'a0'), (None, b'a1')])")
        with following(d, str(tmp_path), "--max-messages", str(2 + n), "--timeout-ms", "5000") as (c, errs):
            assert [c.stdout.readline() for _ in range(2)] == ["Offset:0\ta0\n", "Offset:1\ta1\n"]
            w.run(f"m.delete_topic('t'); m.create_topic('t', 1, {cfg}); "
                  f"m.log('t', 0).append([(None, b'b%d' % i) for i in range({n})])")
            out = c.stdout.read()
            c.wait(timeout=60)
        assert (c.returncode, out) == (0, "".join(f"Offset:{i}\tb{i}\n" for i in range(n)))
        assert errs[-1] == f"Processed a total of {2 + n} messages\n"
        assert set(errs[:-1]) <= {"kstore consume: t-0 was deleted\n",
                                  "kstore consume: t-0 was deleted and re-created; reading it from its start\n"}
    finally:
        assert w.close() == 0


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_consume_group_stopped_by_a_signal_commits_what_it_printed(tmp_path, watchdog, sig):
    """`consume --group g --follow` in another process, stopped by SIGTERM (or SIGINT) after
    printing the 100 records there: it closes as Kafka's console consumer's shutdown hook does
    ("Processed a total of 100 messages", offset 100 committed, and the JVM's exit status
    128 + the signal: 143, 130), and run again it
    prints only the 5 records appended since. Before, SIGTERM killed it before any commit (the
    auto-commit comes every 5 s), so the restart printed all 105."""
    import signal
    import time
    watchdog(120)
    d = str(tmp_path / "data")
    with kstore.LogManager(d) as m:
        _hundred(m)
        with following(d, str(tmp_path), "--group", "g") as (c, errs):
            lines = [c.stdout.readline() for _ in range(100)]
            assert lines == ["Offset:%d\t%d\n" % (i, i) for i in range(100)]
            time.sleep(0.3)                       # asleep in its poll
            c.send_signal(getattr(signal, sig))
            assert c.wait(timeout=30) == 128 + getattr(signal, sig)
            assert c.stdout.read() == ""
        assert errs[-1] == "Processed a total of 100 messages\n"
        assert _committed(d, "g") == {kstore.TopicPartition("t", 0): 100}
        m.append_batch("t", 0, [(None, b"new%d" % i) for i in range(5)])
    again = subprocess.run([sys.executable, "-m", "kstore", "consume", "--log-dirs", d, "--topic", "t",
                            "--group", "g", "--print-offset"], capture_output=True, text=True,
                           cwd=str(tmp_path), timeout=60)
    assert (again.returncode, again.stdout) == (0, "".join("Offset:%d\tnew%d\n" % (100 + i, i) for i in range(5)))


def test_consume_group_signalled_again_during_its_closing_commit_still_commits(tmp_path, watchdog):
    """`consume --group g --follow` in another process, stopped by SIGTERM while a third
    process holds the flock of the group's __consumer_offsets partition: its close's commit
    waits for that flock; a second SIGTERM then (as from a supervisor, or a user's second
    Ctrl-C) does not kill it: once the flock is released it commits 100 and exits 143 with
    "Processed a total of 100 messages", as Kafka's console consumer, whose JVM ignores signals
    while its shutdown hook runs. Before, the handlers were restored before close, so the second
    SIGTERM killed it mid-close and the commit was lost (a restart printed all 100 again)."""
    import signal
    import time
    from kstore.group_coordinator import GroupCoordinator
    from kstore.group_records import OffsetAndMetadata
    watchdog(120)
    d = str(tmp_path / "data")
    t0 = kstore.TopicPartition("t", 0)
    with kstore.LogManager(d) as m:
        _hundred(m)
    with GroupCoordinator([d]) as gc:
        gc.commit_offsets("g", {t0: OffsetAndMetadata.coerce(0)})   # makes the offsets partition
        path = gc.topic.partition_path(gc.partition_for("g"))
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_FLOCK, path], cwd=str(tmp_path),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with following(d, str(tmp_path), "--group", "g") as (c, errs):
            lines = [c.stdout.readline() for _ in range(100)]
            assert lines == ["Offset:%d\t%d\n" % (i, i) for i in range(100)]
            c.send_signal(signal.SIGTERM)
            time.sleep(1.0)                       # in close's commit, waiting for the flock
            assert c.poll() is None
            c.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            assert c.poll() is None, "the second SIGTERM killed it during its close"
            assert holder.stdin is not None
            holder.stdin.close()
            assert holder.wait(timeout=30) == 0
            assert c.wait(timeout=30) == 143
        assert errs[-1] == "Processed a total of 100 messages\n"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)
    assert _committed(d, "g") == {t0: 100}


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_consume_follow_stopped_by_a_signal_reports_its_count(tmp_path, watchdog, sig):
    """Plain `consume --follow` (no group) in another process, stopped by SIGTERM, SIGINT or
    SIGHUP while it waits for data: as Kafka's console consumer (its shutdown hook wakes the
    consumer, the loop ends, then "Processed a total of N messages", and the JVM exits with
    128 + the signal's number), it prints the count of what it printed and exits 143, 130 or
    129. Before, SIGTERM and SIGHUP killed it with no count; SIGINT exited 0."""
    import signal
    import time
    watchdog(120)
    d = str(tmp_path / "data")
    with kstore.LogManager(d) as m:
        _hundred(m)
        with following(d, str(tmp_path)) as (c, errs):
            assert [c.stdout.readline() for _ in range(100)] == ["Offset:%d\t%d\n" % (i, i) for i in range(100)]
            time.sleep(0.3)                       # in its wait for more
            c.send_signal(getattr(signal, sig))
            assert c.wait(timeout=30) == 128 + getattr(signal, sig)
            assert c.stdout.read() == ""
        assert errs == ["Processed a total of 100 messages\n"]


@pytest.mark.parametrize("group", [True, False])
def test_consume_whose_reader_went_away_says_so_and_commits_only_what_went_out(tmp_path, watchdog, group):
    """`consume --follow` (with --group g, and without) in another process prints 100 records;
    then its stdout's reader goes away (as `| head` does) and 50 more are appended. As Kafka's
    console consumer: "Unable to write to standard out, closing consumer.", then "Processed a
    total of 100 messages", exit 0; and (resetUnconsumedOffsets) the group commits 100, the
    position after what went out, so run again it prints the 50. Before, it exited 0 quietly
    and its close committed 150: the 50 were never printed by anyone."""
    watchdog(120)
    d = str(tmp_path / "data")
    extra = ("--group", "g") if group else ()
    with kstore.LogManager(d) as m:
        _hundred(m)
        with following(d, str(tmp_path), *extra) as (c, errs):
            assert [c.stdout.readline() for _ in range(100)] == ["Offset:%d\t%d\n" % (i, i) for i in range(100)]
            c.stdout.close()
            m.append_batch("t", 0, [(None, b"new%d" % i) for i in range(50)])
            assert c.wait(timeout=30) == 0
        assert errs == ["Unable to write to standard out, closing consumer.\n",
                        "Processed a total of 100 messages\n"]
    if not group:
        return
    assert _committed(d, "g") == {kstore.TopicPartition("t", 0): 100}
    again = subprocess.run([sys.executable, "-m", "kstore", "consume", "--log-dirs", d, "--topic", "t",
                            "--group", "g", "--print-offset"], capture_output=True, text=True,
                           cwd=str(tmp_path), timeout=60)
    assert (again.returncode, again.stdout) == (0, "".join("Offset:%d\tnew%d\n" % (100 + i, i) for i in range(50)))


_HOLD_FLOCK = """import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a write there fails: ENOSPC)")
@pytest.mark.parametrize("group", [True, False])
def test_consume_whose_stdout_fails_to_write_says_so_and_commits_nothing_unwritten(tmp_path, watchdog, group):
    """`consume --from-beginning` (with --group g, and without) in another process whose stdout
    is /dev/full (every write fails, ENOSPC: a full disk). As Kafka's console consumer, for
    which any error of its PrintStream is checkError(): "Unable to write to standard out,
    closing consumer.", "Processed a total of 0 messages", exit 0; the group's close commits
    the position before the 100 records (resetUnconsumedOffsets), so run again it prints all
    100. Before, only a broken pipe counted: it said `kstore: error: No space left on device`,
    exit 1, no count, and the group committed 100, so the next run printed none of them."""
    watchdog(120)
    d = str(tmp_path / "data")
    extra = ["--group", "g"] if group else []
    with kstore.LogManager(d) as m:
        _hundred(m)
    cmd = [sys.executable, "-m", "kstore", "consume", "--log-dirs", d, "--topic", "t", "--from-beginning", *extra]
    with open("/dev/full", "wb") as full:
        r = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path), timeout=60)
    assert (r.returncode, r.stderr) == (0, "Unable to write to standard out, closing consumer.\n"
                                           "Processed a total of 0 messages\n")
    if not group:
        return
    assert _committed(d, "g") == {kstore.TopicPartition("t", 0): 0}
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp_path), timeout=60)
    assert (again.returncode, again.stdout) == (0, "".join("%d\n" % i for i in range(100)))


@pytest.mark.parametrize("group", [True, False])
def test_consume_on_a_terminal_that_went_away_exits_129_on_sighup(tmp_path, watchdog, group):
    """`consume --follow` (with --group g, and without) in another process, its stdout and
    stderr a terminal (a pty): it prints 100 records there, then the terminal goes away (its
    master closed: every write now fails, EIO) and SIGHUP comes, as when an ssh session drops.
    As Kafka's console consumer (its System.err swallows the write errors), it exits 129, the
    JVM's 128 + SIGHUP, and the group's close commits 100, so run again it prints nothing
    more. Before, its last words to the gone stderr raised: exit 1."""
    import pty
    import signal
    import time
    watchdog(120)
    d = str(tmp_path / "data")
    extra = ["--group", "g"] if group else []
    with kstore.LogManager(d) as m:
        _hundred(m)
    master, slave = pty.openpty()
    c = subprocess.Popen([sys.executable, "-m", "kstore", "consume", "--log-dirs", d, "--topic", "t",
                          "--from-beginning", "--follow", *extra], stdout=slave, stderr=slave, cwd=str(tmp_path))
    try:
        os.close(slave)
        seen = b""
        while seen.count(b"\n") < 100:
            chunk = os.read(master, 65536)
            assert chunk, seen
            seen += chunk
        assert seen.replace(b"\r\n", b"\n") == b"".join(b"%d\n" % i for i in range(100))
        time.sleep(0.3)                       # in its wait for more
        os.close(master)
        master = -1
        c.send_signal(signal.SIGHUP)
        assert c.wait(timeout=30) == 128 + signal.SIGHUP
    finally:
        if master >= 0:
            os.close(master)
        if c.poll() is None:
            c.kill()
            c.wait(30)
    if not group:
        return
    assert _committed(d, "g") == {kstore.TopicPartition("t", 0): 100}


@pytest.mark.parametrize("group", [True, False])
def test_consume_signalled_while_blocked_on_a_full_pipe_prints_every_record_it_counts(tmp_path, watchdog, group):
    """`consume --follow` (with --group g, and without) in another process writes 20000
    records (120-byte values) into a pipe nobody reads yet, so its write blocks on the full pipe; SIGTERM then
    interrupts that write after part of it went out, and Python's BufferedWriter.write returns
    the short count. Every record counted must still be printed whole: the lines read after are
    exactly offsets 0..N-1 with "Processed a total of N messages", and the group commits N.
    Before, the rest of the interrupted write was dropped: a line cut in the middle, thousands
    of records counted (and committed: the next run skipped them) but never printed."""
    import fcntl
    import signal
    import termios
    import time
    watchdog(120)
    d = str(tmp_path / "data")
    extra = ("--group", "g") if group else ()
    with kstore.LogManager(d) as m:
        m.create_topic("t", 1)
        for k in range(0, 20000, 5000):
            m.append_batch("t", 0, [(None, b"%06d" % i * 20) for i in range(k, k + 5000)])
    with following(d, str(tmp_path), *extra) as (c, errs):
        buf = bytearray(4)
        deadline = time.monotonic() + 60
        seen = []
        while True:                                # the pipe full: its write is blocked
            fcntl.ioctl(c.stdout.fileno(), termios.FIONREAD, buf)
            seen = (seen + [int.from_bytes(buf, sys.byteorder)])[-6:]
            if len(seen) == 6 and seen[0] > 32768 and len(set(seen)) == 1:
                break                              # unchanged for 0.5 s
            assert time.monotonic() < deadline, "the consumer never filled its stdout pipe"
            assert c.poll() is None
            time.sleep(0.1)
        c.send_signal(signal.SIGTERM)
        lines = c.stdout.read().splitlines()
        assert c.wait(timeout=30) == 143
    n = len(lines)
    assert n > 0 and lines == ["Offset:%d\t%s" % (i, "%06d" % i * 20) for i in range(n)]
    assert errs[-1] == "Processed a total of %d messages\n" % n
    if group:
        assert _committed(d, "g") == {kstore.TopicPartition("t", 0): n}


def test_a_non_ascii_separator_is_its_utf8_bytes(tmp_path):
    """--key-separator / --line-separator are Kafka's key.separator / line.separator, sent and
    printed as getBytes(UTF_8). Before, the escape decoding read the UTF-8 bytes as Latin-1:
    'é' became C3 83 C2 A9, so produce --key-separator é found no separator ('No key separator
    found on line number 1', exit 1) and consume printed mojibake between key and value.
    Escapes still work beside them (\\t, \\u2192)."""
    d = str(tmp_path / "s")
    assert produce(d, "kéy→v1\nk2é→v2\n".encode(), "--topic", "t", "--partition", "0",
                   "--key-separator", "→") == 0
    assert contents(d, "t")[0] == [(0, "kéy".encode(), b"v1"), (1, "k2é".encode(), b"v2")]
    rc, out, _ = consume(d, "--topic", "t", "--from-beginning", "--print-key",
                         "--key-separator", "é\\t", "--line-separator", "\\u2192|")
    assert (rc, out) == (0, "kéyé\tv1→|k2éé\tv2→|".encode())
    assert console._unescape("\udcff:") == b"\xff:"        # an argv byte that is no UTF-8
