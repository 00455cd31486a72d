"""TopicPartition: a NamedTuple interchangeable with the engine's (topic, partition) keys."""
import kstore
from kstore.topic_partition import TopicPartition


def test_equals_and_hashes_as_the_plain_tuple():
    tp = TopicPartition("orders", 3)
    assert tp == ("orders", 3) and hash(tp) == hash(("orders", 3))
    assert {("orders", 3): 1}[tp] == 1
    assert (tp.topic, tp.partition) == ("orders", 3)
    assert str(tp) == "orders-3"
    assert kstore.TopicPartition is TopicPartition
