"""The README's first two examples, as they should read there (issue 16 item 12): each runs
again in the same directory with the same outcome (a second run appends to the log it finds and
reuses the topic it created), where the README's LogManager example failed with TopicExistsError.

    python examples/readme_examples.py [DIR]       (runs in DIR, default the current directory)
"""
from __future__ import annotations

import os
import sys

import kstore


def log_example() -> None:
    with kstore.Log.open("data/clicks-0", {"segment.bytes": 1 << 20}) as log:
        info = log.append([(b"k", b"v"), (b"k2", b"v2", 1_700_000_000_000),
                           (None, b"v3", 1_700_000_000_001, [("h", b"x")])])
        for r in log.read(info.first_offset, max_records=100):
            print(r.key, r.value, r.headers)       # also r.offset, r.timestamp
        log.offset_for_timestamp(1_700_000_000_000)     # first offset with timestamp >= ts
        log.read_batches(log.log_start_offset)          # raw batches, zero-copy memoryview
        log.flush(); log.roll()                         # noqa: E702
        extra = log.append([(b"k3", b"later")])
        log.truncate_to(extra.first_offset)   # drops that batch (whole batches, as Kafka)
        log.delete_records(info.first_offset + 1)       # the log now starts at "v2"


def manager_example() -> None:
    with kstore.LogManager(["data/d1", "data/d2"], {"log.retention.hours": 24}) as m:
        if "clicks" not in m.topics():               # a second run finds it
            m.create_topic("clicks", partitions=3, config={"segment.bytes": 1 << 24})
        md = m.append("clicks", b"user-7", b"/home")  # partition by murmur2(key), as Kafka clients
        print(md.partition, [r.value for r in m.log("clicks", md.partition).read(md.offset)])


if __name__ == "__main__":
    if len(sys.argv) > 1:
        os.makedirs(sys.argv[1], exist_ok=True)
        os.chdir(sys.argv[1])
    log_example()
    manager_example()
