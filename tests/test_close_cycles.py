"""What close leaves for the cyclic GC: nothing. A closed LogManager, standalone Log and
StoreReader are freed by reference counting alone (a 1000-partition manager left ~81,000
objects in reference cycles, and one GC pass over them took 657 ms inside a later open): the
scheduler's tasks, the cleaner and the producer reach the manager through weak references, and a
scheduler that shuts down drops its queue. Each case runs once to warm caches (lazy imports),
then again with the collector off; gc.collect() must find nothing kstore made."""
import collections
import gc
import json

import kstore
from kstore.manager import LogManager

N = 40
COMPACT = {"cleanup.policy": "compact", "segment.bytes": 2000, "min.cleanable.dirty.ratio": 0.01}


def _cyclic_garbage(run):
    """run() twice (the first warms caches); returns the objects the second run left that only
    the cyclic GC frees (gc.DEBUG_SAVEALL keeps them for inspection)."""
    run()
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        run()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    return found


def _kinds(objs):
    """{type name: count} of objs (a short failure message)."""
    return dict(collections.Counter(type(o).__qualname__ for o in objs))


def _made_by(objs, prefix):
    """The objects among objs whose type or function belongs to a module starting with prefix."""
    def module(o):
        return getattr(o, "__module__", None) if callable(o) and hasattr(o, "__code__") \
            else type(o).__module__
    return [o for o in objs if (module(o) or "").startswith(prefix)]


def _store(tmp_path):
    d = str(tmp_path / "d")
    with LogManager([d]) as m:
        for i in range(N):
            m.create_topic("t%d" % i, 1)
        m.create_topic("c", 1, COMPACT)
    return d


def test_a_closed_manager_leaves_no_reference_cycles(tmp_path):
    """Open, append to every partition (rolling segments: flushes scheduled after the rolls),
    read, run retention and a compaction, close: nothing for the cyclic GC (before: ~108
    objects per partition, every Log, segment, index and bell reachable from the manager's
    cycles through its scheduler, cleaner and producer)."""
    d = _store(tmp_path)

    def run():
        with LogManager([d]) as m:
            for i in range(N):
                m.append_batch("t%d" % i, 0, [(b"k", b"v" * 50)] * 3)
                assert m.read("t%d" % i, 0, 0, 1)[0].value == b"v" * 50
            for j in range(60):
                m.append_batch("c", 0, [(b"k%d" % (j % 3), b"x" * 40)])
            assert len(m.log("c", 0).segments) > 2
            m.cleanup_logs()
            m.clean_now()
            m.append("auto", b"k", b"v")                 # auto-created through the producer
        r = LogManager([d], read_only=True)
        assert r.log("t0", 0).log_end_offset >= 3
        r.close()

    assert _kinds(_cyclic_garbage(run)) == {}


def test_a_closed_standalone_log_and_store_reader_leave_no_reference_cycles(tmp_path):
    """A Log with several segments (appended, read, truncated, closed) and a StoreReader with
    the logs it opened (read, refreshed, closed): nothing for the cyclic GC."""
    d = _store(tmp_path)
    part = str(tmp_path / "solo-0")

    def run():
        with kstore.Log.open(part, {"segment.bytes": 1000}) as lg:
            for _ in range(30):
                lg.append([(b"k", b"v" * 60)])
            assert len(lg.segments) > 3
            assert [r.offset for r in lg.read(5, max_records=3)] == [5, 6, 7]
            lg.truncate_to(lg.log_end_offset - 2)
        with kstore.StoreReader([d]) as r:
            for i in range(N):
                r.log("t%d" % i, 0, refresh=True)
                r.offsets("t%d" % i, 0)
            r.refresh()

    assert _kinds(_cyclic_garbage(run)) == {}


def test_deleted_topics_leave_only_the_json_encoders_cycles(tmp_path):
    """delete_topic closes and retires each log: no kstore object is left for the cyclic GC.
    What remains is CPython's: json.dumps(indent=1) (the topics file, written at each create
    and delete) runs the pure-Python encoder, whose nested closures form cycles (~30 objects
    a call: cells, functions, a JSONEncoder)."""
    d = str(tmp_path / "d")
    round_ = [0]

    def run():
        round_[0] += 1
        names = ["r%d_%d" % (round_[0], i) for i in range(N)]
        with LogManager([d]) as m:
            for t in names:
                m.create_topic(t, 1)
                m.append_batch(t, 0, [(b"k", b"v")] * 2)
        with LogManager([d]) as m:
            for t in names:
                m.delete_topic(t)
            assert not set(names) & set(m.topics())

    left = _cyclic_garbage(run)
    assert _kinds(_made_by(left, "kstore")) == {}
    assert any(isinstance(o, json.JSONEncoder) for o in left)
    assert {o.__module__ for o in left if callable(o) and hasattr(o, "__code__")} <= {"json.encoder"}
