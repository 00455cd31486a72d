"""cleaner_txn (the cleaner's transactions) against a model of Kafka's LogCleaner: random
transactional workloads (several producers' commits and aborts, plain records, tombstones,
markers with no data, rolls), cleaned several times at advancing times; after each clean the
log's batches (offsets, producer, marker type, records, delete horizon) must be those Kafka's
cleaner leaves, and a fresh read_committed and read_uncommitted read what Kafka's would.

The model is LogCleaner.doClean with CleanedTransactionMetadata over a `.txnindex` of aborted
transactions and the producers' state as appended (kstore keeps neither: it infers them from the
batches left), so each active producer's last batch stays (lastRecordsOfActiveProducers); the
dedupe map holds 3, 7 or 29491 keys, so passes also end where it fills. delete_records moves
the log start only to at most the last stable offset: kstore knows a transaction only from
batches still in the log, so it does not hold the last stable offset at the log start for a
transaction still open below it, as Kafka's producer state does."""
import struct

from hypothesis import HealthCheck, given, settings, strategies as st

import kstore
from broker_dirs import varint
from batch_helpers import CRC32C
from cleaner_helpers import NOW, mgr

RETENTION = 1000
EXPIRATION = 2500      # producer.id.expiration.ms: every batch's timestamp is NOW
KEYS = [b"k0", b"k1", b"k2", b"k3"]


# -- batches as a broker writes them ----------------------------------------------------------
def _blob(b):
    return varint(-1) if b is None else varint(len(b)) + b


def raw_batch(pid, recs, control=None, ts=NOW):
    """A v2 batch of pid (-1: plain) with records (key, value), or a marker (control 0/1)."""
    attrs = (0x10 if pid >= 0 else 0) | (0x20 if control is not None else 0)
    if control is not None:
        recs = [(struct.pack(">hh", 0, control), struct.pack(">hi", 0, 0))]
    body = b""
    for i, (k, v) in enumerate(recs):
        rec = b"\x00" + varint(0) + varint(i) + _blob(k) + _blob(v) + varint(0)
        body += varint(len(rec)) + rec
    tail = struct.pack(">hiqqqhii", attrs, len(recs) - 1, ts, ts, pid, 0 if pid >= 0 else -1,
                       0 if control is None and pid >= 0 else -1, len(recs)) + body
    head = struct.pack(">qiib", 0, 4 + 1 + 4 + len(tail), 0, 2)
    return head + struct.pack(">I", CRC32C(tail)) + tail


def _read_varint(b, p):
    u = shift = 0
    while True:
        c = b[p]
        p += 1
        u |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return (u >> 1) ^ -(u & 1), p


def _records(body, base, count):
    out, p = [], 0
    for _ in range(count):
        _n, p = _read_varint(body, p)
        p += 1
        _tsd, p = _read_varint(body, p)
        offd, p = _read_varint(body, p)
        vals = []
        for _j in range(2):
            n, p = _read_varint(body, p)
            vals.append(None if n < 0 else bytes(body[p:p + n]))
            p += max(n, 0)
        _h, p = _read_varint(body, p)
        out.append((base + offd, vals[0], vals[1]))
    return out


def log_batches(lg):
    """Every batch of the log: (base, last, pid, kind, records, horizon); kind "data", "plain",
    0 (ABORT), 1 (COMMIT) or "empty-control"."""
    out = []
    for s in lg.segments:
        with open(s.log_path, "rb") as f:
            data = f.read()[:s.size]
        p = 0
        while p + 61 <= len(data):
            base, length = struct.unpack_from(">qi", data, p)
            attrs, delta, base_ts = struct.unpack_from(">hiq", data, p + 21)
            pid = struct.unpack_from(">q", data, p + 43)[0]
            count = struct.unpack_from(">i", data, p + 57)[0]
            recs = _records(data[p + 61:p + 12 + length], base, count)
            if attrs & 0x20:
                kind = struct.unpack_from(">hh", recs[0][1])[1] if recs else "empty-control"
                recs = []
            else:
                kind = "data" if attrs & 0x10 else "plain"
            out.append((base, base + delta, pid if attrs & 0x10 else -1, kind, recs,
                        base_ts if attrs & 0x40 else None))
            p += 12 + length
    return out


# -- Kafka's cleaner ------------------------------------------------------------------------------
class KafkaModel:
    """A partition as Kafka keeps it: segments of batches, the .txnindex's aborted
    transactions (pid, first, last), the producers' open transactions, the cleaner checkpoint."""

    def __init__(self, map_capacity):
        self.map_capacity = map_capacity     # keys the dedupe map holds (slots * load factor)
        self.segments = [[]]                 # lists of batches; the last is active
        self.bases = [0]
        self.leo = 0
        self.txnindex = []                   # (first, pid, marker offset)
        self.open = {}                       # pid -> first offset
        self.first_dirty = 0
        self.start = 0                       # the log start offset
        self.last_data = {}                  # pid -> its last data batch's last offset, or None

    def append(self, pid, recs, control=None):
        n = 1 if control is not None else len(recs)
        base, last = self.leo, self.leo + n - 1
        if control is None:
            batch = (base, last, pid, "data" if pid >= 0 else "plain",
                     [(base + i, k, v) for i, (k, v) in enumerate(recs)], None)
            if pid >= 0:
                self.open.setdefault(pid, base)
                self.last_data[pid] = last
        else:
            self.last_data.setdefault(pid, None)
            batch = (base, last, pid, control, [], None)
            first = self.open.pop(pid, None)
            if control == 0 and first is not None:
                self.txnindex.append((first, pid, base))
        self.segments[-1].append(batch)
        self.leo = last + 1

    def roll(self):
        if self.segments[-1]:
            self.segments.append([])
            self.bases.append(self.leo)

    def lso(self):
        """The first unstable offset, never below the log start (maybeIncrementFirstUnstableOffset)."""
        return max(min(self.open.values(), default=self.leo), self.start)

    def resegment(self, bases):
        """Kafka's segments are kstore's (rolls by size, cleaned groups merged): the same
        batches, split at those bases."""
        flat = self.batches()
        self.bases = list(bases)
        self.segments = [[b for b in flat if lo <= b[0] < hi]
                         for lo, hi in zip(self.bases, self.bases[1:] + [1 << 62])]

    def delete_records(self, offset):
        """DeleteRecords: the log start moves; the segments wholly below it go."""
        self.start = max(self.start, offset)
        while len(self.bases) > 1 and self.bases[1] <= self.start:
            del self.bases[0], self.segments[0]

    def clean(self, now):
        """doClean; returns whether the log was cleanable (dirty bytes below the LSO segment)."""
        lso = self.lso()
        self.first_dirty = max(self.first_dirty, self.start)
        fu = max(b for b in self.bases if b <= min(lso, self.bases[-1]))
        idx = [i for i, b in enumerate(self.bases) if b < fu]
        nxt = self.bases[1:] + [None]
        dirty = [i for i in idx if nxt[i] > self.first_dirty and self.segments[i]]
        if not dirty:
            return False
        # buildOffsetMap over [first_dirty, fu): aborted batches stay out (collectAbortedTransactions:
        # the .txnindex entries whose marker is at or past the log start)
        aborted = sorted(e for e in self.txnindex if e[2] >= self.start)
        latest, omap, full = -1, {}, False
        first = max(j for j in idx if self.bases[j] <= self.first_dirty)
        meta = TxnMeta([e for e in aborted if e[2] >= self.bases[first]])
        for i in idx[first:]:
            for b in self.segments[i]:
                if b[3] in ("data", "plain") and not meta.on_batch(b):
                    for off, k, _v in b[4]:
                        if k is not None and off >= self.first_dirty:
                            if len(omap) >= self.map_capacity:
                                full = True         # before a put it has no room for
                                break
                            omap[k] = latest = off
                    if full:
                        break
                elif b[3] not in ("data", "plain"):
                    meta.on_control(b)
                if b[1] >= self.first_dirty:
                    latest = b[1]                   # updateLatestOffset
            if full:
                break
            latest = min(nxt[i], fu) - 1            # a segment read whole: fast-forward
        end = latest + 1
        self.first_dirty = end
        idx = [i for i in idx if self.bases[i] < end]
        # cleanSegments over [0, fu), one CleanedTransactionMetadata
        meta = TxnMeta(aborted)
        active = {p: d for p, d in self.last_data.items() if p in self.open or now - NOW < EXPIRATION}

        def producers_last(b):
            if b[2] not in active:
                return False
            d = active[b[2]]
            return b[1] == d if d is not None else b[3] not in ("data", "plain")
        kept_index = []
        for i in idx:
            out = []
            for b in self.segments[i]:
                base, last, pid, kind, recs, horizon = b
                control = kind not in ("data", "plain")
                if control:
                    discard = meta.on_control(b)
                    if kind == 0 and not discard:
                        kept_index.append(meta.kept_entry)
                    drop_recs = discard and horizon is not None and horizon <= now
                else:
                    discard = drop_recs = meta.on_batch(b)
                if drop_recs:
                    kept = []
                elif control:
                    kept = recs
                else:
                    kept = [r for r in recs if r[0] > latest or (
                        r[1] is not None and r[0] >= omap.get(r[1], -1)
                        and (r[2] is not None or horizon is None or now < horizon))]
                final = last + 1 == fu or (pid >= 0 and producers_last(b))
                if control and kind != "empty-control":
                    if drop_recs:
                        if final:
                            out.append((base, last, pid, "empty-control", [], None))
                        continue
                    if discard and horizon is None:
                        horizon = now + RETENTION
                    out.append((base, last, pid, kind, [], horizon))
                    continue
                if control:                     # an emptied marker
                    if final:
                        out.append(b)
                    continue
                if not kept and not final:
                    continue
                if not kept:
                    horizon = None              # DefaultRecordBatch.writeEmptyHeader
                if kept and horizon is None and any(r[2] is None for r in kept):
                    horizon = now + RETENTION
                out.append((base, last, pid, kind, kept, horizon))
            self.segments[i] = out
        # the .txnindex of the cleaned segments keeps the ABORTs retained with data
        rest = self.bases[idx[-1] + 1] if idx else 0
        self.txnindex = sorted([e for e in self.txnindex if e[2] >= rest] + kept_index)
        return True

    def batches(self):
        return [b for seg in self.segments for b in seg]

    def uncommitted(self):
        return [r for b in self.batches() if b[3] in ("data", "plain") for r in b[4]
                if r[0] >= self.start]

    def committed(self):
        """A read_committed consumer from the start (Kafka's CompletedFetch): up to the LSO,
        skipping aborted batches by the .txnindex, an ABORT marker ending its producer's skip."""
        lso = self.lso()
        pending = sorted(e for e in self.txnindex if e[2] >= self.start)
        aborted_pids, out = set(), []
        for b in self.batches():
            if b[1] < self.start:
                continue
            if b[0] >= lso:
                break
            while pending and pending[0][0] <= b[1]:
                aborted_pids.add(pending.pop(0)[1])
            if b[3] == 0:
                aborted_pids.discard(b[2])
            elif b[3] == "data" and b[2] in aborted_pids:
                continue
            elif b[3] in ("data", "plain"):
                out += [r for r in b[4] if self.start <= r[0] < lso]
        return out


class TxnMeta:
    """Kafka's CleanedTransactionMetadata."""

    def __init__(self, aborted):
        self.pending = list(aborted)
        self.ongoing_aborted = {}           # pid -> [entry, data seen]
        self.ongoing_committed = set()
        self.kept_entry = None

    def _consume(self, offset):
        while self.pending and self.pending[0][0] <= offset:
            e = self.pending.pop(0)
            self.ongoing_aborted.setdefault(e[1], [e, False])

    def on_batch(self, b):
        self._consume(b[1])
        if b[3] != "data":
            return False
        if b[2] in self.ongoing_aborted:
            self.ongoing_aborted[b[2]][1] = True
            return True
        self.ongoing_committed.add(b[2])
        return False

    def on_control(self, b):
        self._consume(b[1])
        if b[3] == "empty-control":
            return True
        if b[3] == 0:
            e = self.ongoing_aborted.pop(b[2], None)
            if e is not None and e[1]:
                self.kept_entry = e[0]
                return False
            return True
        if b[2] in self.ongoing_committed:
            self.ongoing_committed.discard(b[2])
            return False
        return True


# -- the workload ---------------------------------------------------------------------------------
op = st.one_of(
    st.tuples(st.just("data"), st.integers(1, 3),
              st.lists(st.tuples(st.sampled_from(KEYS), st.booleans()), min_size=1, max_size=3)),
    st.tuples(st.just("end"), st.integers(1, 3), st.sampled_from([0, 1])),
    st.tuples(st.just("plain"), st.sampled_from(KEYS), st.integers(0, 5)),
    st.tuples(st.just("roll")),
    st.tuples(st.just("clean"), st.integers(0, 1500)),
    st.tuples(st.just("delete"), st.floats(0, 1)),
)


def committed_read(d):
    out = []
    tp = kstore.TopicPartition("c", 0)
    with kstore.Consumer(d, auto_offset_reset="earliest", isolation_level="read_committed") as c:
        c.assign([tp])
        while True:
            got = c.poll(100).get(tp, [])
            if not got:
                return out
            out += [(r.offset, r.key, r.value) for r in got]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(op, min_size=5, max_size=45), slots=st.sampled_from([1 << 15, 8, 4]))
def test_cleans_of_random_transactional_workloads_match_kafkas_cleaner(tmp_path_factory, ops, slots):
    d = tmp_path_factory.mktemp("c")
    m, t = mgr(d, {"log.segment.bytes": "700", "log.cleaner.dedupe.buffer.size": str(24 * slots),
                   "producer.id.expiration.ms": str(EXPIRATION)})
    model = KafkaModel(int(slots * 0.9))
    n = 0
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0",
                                "delete.retention.ms": str(RETENTION)})
        lg = m.log("c", 0)
        for o in ops + [("end", p, 1) for p in (1, 2, 3)] + [("roll",), ("clean", 0)] * 3 + [
                ("clean", 0)] * 20:
            n += 1
            if o[0] == "data":
                recs = [(k, None if tomb and n % 3 == 0 else b"v%d" % n) for k, tomb in o[2]]
                lg.append_batches(raw_batch(o[1], recs))
                model.append(o[1], recs)
            elif o[0] == "end":
                if o[1] not in model.open and n % 4:
                    continue                  # mostly markers of transactions with data
                lg.append_batches(raw_batch(o[1], [], control=o[2]))
                model.append(o[1], [], control=o[2])
            elif o[0] == "plain":
                v = None if o[2] == 0 else b"p%d" % n
                lg.append([(o[1], v)])
                model.append(-1, [(o[1], v)])
            elif o[0] == "delete":
                # at or below every open transaction's first offset (see the module doc); a
                # closed transaction may straddle it
                off = model.start + int(o[1] * (model.lso() - model.start))
                lg.delete_records(off)
                model.delete_records(off)
            elif o[0] == "roll":
                lg.roll()
                model.roll()
            else:
                t.sleep(o[1])
                model.resegment(s.base_offset for s in lg.segments)
                cleaned = m.clean_now()
                assert bool(cleaned) == model.clean(t.milliseconds()), model.batches()
                assert m.uncleanable_partitions() == {}
                assert [b for b in log_batches(lg) if b[1] >= model.start] == [
                    b for b in model.batches() if b[1] >= model.start]
            model.resegment(s.base_offset for s in lg.segments)
        assert [(r.offset, r.key, r.value) for r in lg] == model.uncommitted()
        assert committed_read(str(d)) == model.committed()


def test_an_abort_below_the_log_start_stays_while_its_data_does(tmp_path):
    # Kafka's cleaner takes an ABORT below the log start for no abort: it keeps the data (here
    # its producer's last data batch) and drops the marker. A fresh read_committed reader then
    # found producer 1's data with no marker after it: a transaction open below the log start,
    # holding the last stable offset at the log start for good (no record read). The marker
    # stays while the data does; once the data goes, it goes as any marker (horizon, then gone).
    m, t = mgr(tmp_path, {"log.segment.bytes": "100000", "producer.id.expiration.ms": "2500"})
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0",
                                "delete.retention.ms": "100"})
        lg = m.log("c", 0)
        lg.append_batches(raw_batch(1, [(b"k1", b"aborted")]))      # 0
        lg.append_batches(raw_batch(1, [], control=0))              # 1: ABORT
        lg.append([(b"k2", b"p2")])                                  # 2
        lg.append_batches(raw_batch(2, [(b"k3", b"c")]))           # 3
        lg.append_batches(raw_batch(2, [], control=1))              # 4: COMMIT
        lg.delete_records(2)
        kept = [(0, 0, 1, "data", [(0, b"k1", b"aborted")], None), (1, 1, 1, 0, [], None),
                (2, 2, -1, "plain", [(2, b"k2", b"p2")], None),
                (3, 3, 2, "data", [(3, b"k3", b"c")], None), (4, 4, 2, 1, [], None)]
        for n, k in enumerate([b"k4", b"k5"]):       # a marker going: a horizon, then gone
            lg.roll()
            lg.append([(k, b"x")])
            assert m.clean_now()
            kept.append((5 + n, 5 + n, -1, "plain", [(5 + n, k, b"x")], None))
            assert log_batches(lg) == kept
            t.sleep(1000)
        assert committed_read(str(tmp_path)) == [(2, b"k2", b"p2"), (3, b"k3", b"c"),
                                                 (5, b"k4", b"x"), (6, b"k5", b"x")]
        t.sleep(2000)                                # producer 1 expired: its data may go
        lg.roll()
        lg.append([(b"k1", b"new")])                 # 7: k1's latest
        kept = kept[1:] + [(7, 7, -1, "plain", [(7, b"k1", b"new")], None)]
        horizons = [None, NOW + 4300, "gone"]
        for n, horizon in enumerate(horizons):
            lg.roll()
            lg.append([(b"k%d" % (6 + n), b"x")])
            assert m.clean_now()
            kept.append((8 + n, 8 + n, -1, "plain", [(8 + n, b"k%d" % (6 + n), b"x")], None))
            abort = [] if horizon == "gone" else [(1, 1, 1, 0, [], horizon)]
            assert log_batches(lg) == abort + kept[1:]
            t.sleep(200)
