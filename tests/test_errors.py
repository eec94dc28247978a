"""The error table agrees with kafka-python's independent one on codes, names and retriability."""

from __future__ import annotations

import kafka.errors

from protocol.errors import ErrorCode, error_name, is_retriable


def test_codes_names_and_retriable_match_kafka_python() -> None:
    compared = 0
    for code in ErrorCode:
        theirs = kafka.errors.for_code(code)
        if theirs is kafka.errors.UnknownError and code != ErrorCode.UNKNOWN_SERVER_ERROR:
            continue  # a code newer than kafka-python's table
        compared += 1
        assert theirs.errno == code
        if code > 0:
            assert is_retriable(code) == theirs.retriable, code.name
    assert compared > 100


def test_well_known_entries() -> None:
    assert ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER == 45
    assert ErrorCode.UNKNOWN_TOPIC_ID == 100
    assert error_name(3) == "UNKNOWN_TOPIC_OR_PARTITION"
    assert is_retriable(ErrorCode.NOT_LEADER_OR_FOLLOWER) and not is_retriable(ErrorCode.MESSAGE_TOO_LARGE)
