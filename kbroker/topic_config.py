"""Topic-level configuration: Kafka's topic config names, their broker-level synonyms and validation.

Used by CreateTopics, AlterConfigs, IncrementalAlterConfigs and DescribeConfigs. A topic's effective
value is its own override, else the broker's setting of the synonym, else Kafka's default. The keys, their
validators and what kbroker does with each are in kbroker/config_registry.py.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from kbroker import config_registry as registry
from kbroker.config_registry import ConfigDef, ConfigError

log = logging.getLogger("kbroker.topic_config")

TopicConfigKey = ConfigDef
TOPIC_CONFIG_KEYS: dict[str, ConfigDef] = registry.TOPIC_DEFS
# What DescribeConfigs answers when documentation is requested (kbroker's own words).
TOPIC_CONFIG_DOCS = {name: key.doc for name, key in TOPIC_CONFIG_KEYS.items()}


def validate_topic_configs(configs: Mapping[str, str | None]) -> str | None:
    """An error message for the first unknown key, bad value or refused value, or None when all are valid."""
    for name, value in configs.items():
        key = TOPIC_CONFIG_KEYS.get(name)
        if key is None:
            return f"Unknown topic config name: {name}"
        if value is None:
            return f"Null value not supported for topic config {name}"
        try:
            parsed = key.parse(value)
        except ConfigError as exc:
            return f"Invalid value {value} for configuration {name}: {exc}"
        refused = registry.problem_with(key, parsed)
        if refused is not None:
            return f"Invalid value {value} for configuration {name}: {refused}"
    return None


def warn_unapplied(topic: str, configs: Mapping[str, str]) -> list[str]:
    """Log (and return) a warning for each valid setting kbroker accepts but does not apply."""
    warnings = []
    for name, value in configs.items():
        key = TOPIC_CONFIG_KEYS.get(name)
        if key is None:
            continue
        try:
            reason = registry.warning_for(key, key.parse(value))
        except ConfigError:
            continue
        if reason is not None:
            warnings.append(f"topic {topic}: {name}={value} is accepted but not applied: {reason}")
    for warning in warnings:
        log.warning("%s", warning)
    return warnings
