"""Stores the Spark source tests read: topic t, n records per partition."""
import kstore


def make_store(path, topic="t", partitions=2, n=100, ts0=0):
    """n records per partition; record i of a partition has key k<i>, value p<p>-<i>, timestamp
    ts0 + 1000*i."""
    with kstore.LogManager(path, {"log.segment.bytes": 2048}) as m:
        m.create_topic(topic, partitions)
        for p in range(partitions):
            lg = m.log(topic, p)
            for i in range(n):
                lg.append([(b"k%d" % i, b"p%d-%d" % (p, i), ts0 + 1000 * i)])
    return path
