"""Kafka's message specs of the `__consumer_offsets` records, verbatim from apache/kafka
(group-coordinator/src/main/resources/common/message/, commit 1eb7644349cb, Apache License 2.0):
test_group_records.py builds kafka-python's generic (JSON-schema driven) encoders from them, an
implementation independent of kstore's, to check kstore's bytes against."""
