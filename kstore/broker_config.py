"""Broker-level configuration (Kafka's KafkaConfig, the parts an embedded engine uses).

Topic-level defaults come from their broker synonyms with Kafka's precedence (log.roll.ms over
log.roll.hours; log.retention.ms over .minutes over .hours). Keys that only make sense for a
networked, replicated broker are accepted and reported once as ignored; unknown keys are
logged as warnings (Kafka's AbstractConfig logs unused settings), on the `kstore.config` logger.
"""
from __future__ import annotations

import logging
import re
from typing import Any, Mapping, Optional

from kstore.config import (LONG_MAX, TOPIC_CONFIG_KEYS, LogConfig, Parser, double_parser,
                           int_parser, long_parser, parse_bool, parse_str)
from kstore.errors import InvalidConfigError

log = logging.getLogger("kstore.config")

# name: (default, parser)
BROKER_KEYS: dict[str, tuple[Any, Parser]] = {
    "log.dirs": (None, parse_str),
    "log.dir": ("/tmp/kafka-logs", parse_str),
    "num.recovery.threads.per.data.dir": (2, int_parser(1)),          # Kafka 4.0 default
    "background.threads": (10, int_parser(1)),
    "log.retention.check.interval.ms": (300000, long_parser(1)),
    "log.flush.scheduler.interval.ms": (LONG_MAX, long_parser(0)),
    "log.flush.offset.checkpoint.interval.ms": (60000, int_parser(0)),
    "log.flush.start.offset.checkpoint.interval.ms": (60000, int_parser(0)),
    "log.initial.task.delay.ms": (30000, long_parser(0)),
    "num.partitions": (1, int_parser(1)),
    "auto.create.topics.enable": (True, parse_bool),
    "log.cleaner.enable": (True, parse_bool),
    "log.cleaner.threads": (1, int_parser(0)),
    "log.cleaner.dedupe.buffer.size": (134217728, long_parser(0)),
    "log.cleaner.io.buffer.load.factor": (0.9, double_parser(0.0, 1.0)),
    "log.cleaner.io.buffer.size": (524288, int_parser(0)),
    "log.cleaner.io.max.bytes.per.second": (1.7976931348623157e308, double_parser(0.0, float("inf"))),
    "log.cleaner.backoff.ms": (15000, long_parser(0)),
    # the cleaner keeps each producer's last batch until it expires (TransactionLogConfig)
    "producer.id.expiration.ms": (86400000, int_parser(1)),
    # __consumer_offsets (group_coordinator.py), Kafka's GroupCoordinatorConfig defaults
    "offsets.topic.num.partitions": (50, int_parser(1)),
    "offsets.topic.segment.bytes": (104857600, int_parser(1)),
    "offsets.retention.minutes": (10080, int_parser(1)),
    "offsets.retention.check.interval.ms": (600000, long_parser(1)),
}

# Keys of a networked/replicated broker: accepted, listed once as ignored.
_IGNORED = re.compile(
    r"^(broker\.id|node\.id|broker\.rack|process\.roles|listeners|advertised\.listeners|"
    r"listener\..*|inter\.broker\..*|controller\..*|zookeeper\..*|num\.network\.threads|"
    r"num\.io\.threads|socket\..*|queued\.max\.requests|replica\..*|num\.replica\..*|"
    r"default\.replication\.factor|offsets\..*|transaction\..*|transactional\..*|group\..*|"
    r"security\..*|ssl\..*|sasl\..*|metric\..*|metrics\..*|auto\.leader\.rebalance\.enable|"
    r"leader\.imbalance\..*|delete\.topic\.enable|cluster\.id|log\.message\.downconversion\..*|"
    r"confluent\..*|authorizer\..*|principal\..*|connections\..*|max\.connections.*|"
    r"quota\..*|request\.timeout\.ms|log\.local\..*|remote\.log\..*|share\..*|"
    r"initial\.broker\.registration\.timeout\.ms|broker\.heartbeat\.interval\.ms|"
    r"broker\.session\.timeout\.ms|fetch\..*|producer\..*|consumer\..*|unstable\..*|"
    r"eligible\.leader\.replicas\..*|group\.coordinator\..*|sasl\..*)$")

# broker synonyms given in hours or minutes, and the smallest value each accepts
_UNIT_SYNONYMS = {
    "log.roll.hours": (3_600_000, 1),
    "log.roll.jitter.hours": (3_600_000, 0),
    "log.retention.hours": (3_600_000, -1),
    "log.retention.minutes": (60_000, -1),
}


def _synonym_value(spec, props: Mapping[str, Any]):
    """The topic default from the highest-priority broker synonym present, in ms where needed
    (a negative retention stays negative: it means unlimited)."""
    for name in spec.broker:
        if name not in props:
            continue
        value = props[name]
        if name in _UNIT_SYNONYMS:
            factor, lo = _UNIT_SYNONYMS[name]
            parsed = long_parser(lo)(name, value)
            return parsed * factor if parsed >= 0 else parsed
        if name == "log.flush.scheduler.interval.ms":
            return long_parser(0)(name, value)
        return value
    return None


class BrokerConfig:
    """Parsed broker settings plus the topic defaults they imply."""

    def __init__(self, props: Optional[Mapping[str, Any]] = None, *, warn: bool = True):
        props = dict(props or {})
        self.raw = props
        self.values: dict[str, Any] = {}
        for name, (default, parse) in BROKER_KEYS.items():
            self.values[name] = parse(name, props[name]) if name in props else default
        synonyms = {s for k in TOPIC_CONFIG_KEYS.values() for s in k.broker}
        self.topic_defaults: dict[str, Any] = {}
        for spec in TOPIC_CONFIG_KEYS.values():
            v = _synonym_value(spec, props)
            if v is not None:
                self.topic_defaults[spec.name] = v
        # validate the topic defaults now, naming the broker key at fault
        try:
            LogConfig(defaults=self.topic_defaults)
        except InvalidConfigError as e:
            raise InvalidConfigError(f"{e} (from the broker settings)") from None
        self.ignored = sorted(k for k in props if _IGNORED.match(k) and k not in BROKER_KEYS
                              and k not in synonyms)
        self.unknown = sorted(k for k in props if k not in BROKER_KEYS and k not in synonyms
                              and k not in self.ignored and k not in TOPIC_CONFIG_KEYS)
        if self.ignored:
            log.info("kstore ignores settings that apply only to a networked broker: %s",
                     ", ".join(self.ignored))
        if warn and self.unknown:
            log.warning("unknown broker settings ignored: %s", ", ".join(self.unknown))


    def default_log_dir_note(self) -> Optional[str]:
        """When the settings name no log dir (an empty server.properties): where the data goes,
        Kafka's default log.dir, said so that it does not land in /tmp/kafka-logs unannounced."""
        if "log.dirs" in self.raw or "log.dir" in self.raw:
            return None
        return (f"neither log.dirs nor log.dir is set: the data goes to {self.values['log.dir']} "
                f"(Kafka's default log.dir)")

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def log_dirs(self) -> list[str]:
        dirs = self.values["log.dirs"] or self.values["log.dir"]
        return [d.strip() for d in str(dirs).split(",") if d.strip()]

    def log_config(self, overrides: Optional[Mapping[str, Any]] = None) -> LogConfig:
        return LogConfig(overrides, defaults=self.topic_defaults)
