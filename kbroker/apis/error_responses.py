"""An API's answer to a request that failed as a whole: what Kafka's ``AbstractRequest.getErrorResponse`` gives.

The request pipeline (kbroker/server/connection.py) uses it when a handler raises instead of answering: a
``KafkaError`` is answered with its code, anything else with UNKNOWN_SERVER_ERROR. Where the response has
per-item error codes (a partition of a Produce, a topic of a CreateTopics, a group of a DescribeGroups), every
item the request named gets the error, as Kafka does; otherwise the top-level error code carries it. An API
version whose response has neither gives None: there is no way to say "failed" in it, and the caller closes
the connection instead.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from protocol.errors import ErrorCode
from protocol.messages import APIS

# (request, version, code, message) -> response
Builder = Callable[[Any, int, ErrorCode, str | None], Any]

_BUILDERS: dict[int, Builder] = {}


def error_response(api_key: int, version: int, request: Any, code: ErrorCode, message: str | None) -> Any | None:
    """The response to ``request`` that says it failed with ``code``; None if this version cannot say so."""
    builder = _BUILDERS.get(api_key)
    if builder is not None:
        return builder(request, version, code, message)
    if not has_top_level_error(api_key, version):
        return None
    response_type = APIS[api_key].response_type()
    response = response_type(error_code=code)
    if "error_message" in response_type.FIELDS:
        response.error_message = message
    return response


@cache
def has_top_level_error(api_key: int, version: int) -> bool:
    """Whether the response of ``version`` encodes its top-level error code (the field may exist in other
    versions only): told by encoding an answer with two different codes and comparing the bytes."""
    response_type = APIS[api_key].response_type()
    if "error_code" not in response_type.FIELDS:
        return False
    return bytes(response_type(error_code=0).encode(version)) != bytes(response_type(error_code=1).encode(version))


def _builder(api_key: int) -> Callable[[Builder], Builder]:
    def register(function: Builder) -> Builder:
        _BUILDERS[api_key] = function
        return function

    return register


def _response(api_key: int) -> Any:
    return APIS[api_key].response_type()


@_builder(0)
def _produce(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(0)
    return r(
        responses=[
            r.TopicProduceResponse(
                name=topic.name,
                topic_id=topic.topic_id,
                partition_responses=[
                    r.PartitionProduceResponse(
                        index=p.index, error_code=code, base_offset=-1, log_append_time_ms=-1, error_message=message
                    )
                    for p in topic.partition_data
                ],
            )
            for topic in request.topic_data
        ]
    )


@_builder(1)
def _fetch(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(1)
    # Kafka: from v13 only the top-level code; before, every partition as well (older clients look there).
    topics = []
    if version < 13:
        topics = [
            r.FetchableTopicResponse(
                topic=topic.topic,
                topic_id=topic.topic_id,
                partitions=[
                    r.PartitionData(
                        partition_index=p.partition,
                        error_code=code,
                        high_watermark=-1,
                        last_stable_offset=-1,
                        log_start_offset=-1,
                        records=b"",
                    )
                    for p in topic.partitions
                ],
            )
            for topic in request.topics
        ]
    return r(error_code=code, session_id=0, responses=topics)


@_builder(2)
def _list_offsets(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(2)
    return r(
        topics=[
            r.ListOffsetsTopicResponse(
                name=topic.name,
                partitions=[
                    r.ListOffsetsPartitionResponse(
                        partition_index=p.partition_index, error_code=code, timestamp=-1, offset=-1, leader_epoch=-1
                    )
                    for p in topic.partitions
                ],
            )
            for topic in request.topics
        ]
    )


@_builder(3)
def _metadata(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(3)
    topics = [
        r.MetadataResponseTopic(error_code=code, name=t.name if t.name is not None else "", topic_id=t.topic_id)
        for t in request.topics or []
    ]
    return r(topics=topics, error_code=code, controller_id=-1)


@_builder(8)
def _offset_commit(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(8)
    return r(
        topics=[
            r.OffsetCommitResponseTopic(
                name=topic.name,
                topic_id=topic.topic_id,
                partitions=[
                    r.OffsetCommitResponsePartition(partition_index=p.partition_index, error_code=code)
                    for p in topic.partitions
                ],
            )
            for topic in request.topics
        ]
    )


@_builder(9)
def _offset_fetch(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(9)
    if version >= 8:  # batched groups (KIP-709): each group gets the error
        return r(groups=[r.OffsetFetchResponseGroup(group_id=g.group_id, error_code=code) for g in request.groups])
    partitions = [
        r.OffsetFetchResponseTopic(
            name=topic.name,
            partitions=[
                r.OffsetFetchResponsePartition(partition_index=index, committed_offset=-1, metadata="", error_code=code)
                for index in topic.partition_indexes
            ],
        )
        for topic in request.topics or []
    ]
    return r(topics=partitions if version < 2 else [], error_code=code)


@_builder(10)
def _find_coordinator(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(10)
    if version >= 4:  # batched (KIP-699)
        return r(
            coordinators=[
                r.Coordinator(key=key, node_id=-1, host="", port=-1, error_code=code, error_message=message)
                for key in request.coordinator_keys
            ]
        )
    return r(error_code=code, error_message=message, node_id=-1, host="", port=-1)


@_builder(11)
def _join_group(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    # Kafka's JoinGroupRequest.getErrorResponse: the protocol name is null where it may be (v7+), else "".
    return _response(11)(error_code=code, protocol_name=None if version >= 7 else "", member_id="")


@_builder(15)
def _describe_groups(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(15)
    return r(
        groups=[
            r.DescribedGroup(error_code=code, error_message=message, group_id=g, group_state="", protocol_type="")
            for g in request.groups
        ]
    )


@_builder(19)
def _create_topics(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(19)
    return r(
        topics=[
            r.CreatableTopicResult(
                name=t.name, error_code=code, error_message=message, num_partitions=-1, replication_factor=-1
            )
            for t in request.topics
        ]
    )


@_builder(20)
def _delete_topics(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(20)
    if version >= 6:
        wanted = [(t.name, t.topic_id) for t in request.topics]
    else:
        wanted = [(name, None) for name in request.topic_names]
    results = []
    for name, topic_id in wanted:
        result = r.DeletableTopicResult(name=name, error_code=code, error_message=message)
        if topic_id is not None:
            result.topic_id = topic_id
        results.append(result)
    return r(responses=results)


@_builder(21)
def _delete_records(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(21)
    return r(
        topics=[
            r.DeleteRecordsTopicResult(
                name=topic.name,
                partitions=[
                    r.DeleteRecordsPartitionResult(partition_index=p.partition_index, low_watermark=-1, error_code=code)
                    for p in topic.partitions
                ],
            )
            for topic in request.topics
        ]
    )


@_builder(32)
def _describe_configs(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(32)
    return r(
        results=[
            r.DescribeConfigsResult(
                error_code=code,
                error_message=message,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
                configs=[],
            )
            for res in request.resources
        ]
    )


def _alter_configs(api_key: int) -> Builder:
    def build(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
        r = _response(api_key)
        return r(
            responses=[
                r.AlterConfigsResourceResponse(
                    error_code=code,
                    error_message=message,
                    resource_type=res.resource_type,
                    resource_name=res.resource_name,
                )
                for res in request.resources
            ]
        )

    return build


_BUILDERS[33] = _alter_configs(33)
_BUILDERS[44] = _alter_configs(44)


@_builder(37)
def _create_partitions(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(37)
    return r(
        results=[
            r.CreatePartitionsTopicResult(name=t.name, error_code=code, error_message=message) for t in request.topics
        ]
    )


@_builder(42)
def _delete_groups(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(42)
    return r(results=[r.DeletableGroupResult(group_id=g, error_code=code) for g in request.groups_names])


@_builder(69)
def _consumer_group_describe(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(69)
    return r(
        groups=[
            r.DescribedGroup(error_code=code, error_message=message, group_id=g, group_state="", assignor_name="")
            for g in request.group_ids
        ]
    )


@_builder(75)
def _describe_topic_partitions(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(75)
    return r(topics=[r.DescribeTopicPartitionsResponseTopic(error_code=code, name=t.name) for t in request.topics])


@_builder(23)
def _offset_for_leader_epoch(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(23)
    return r(
        topics=[
            r.OffsetForLeaderTopicResult(
                topic=topic.topic,
                partitions=[
                    r.EpochEndOffset(error_code=code, partition=p.partition, leader_epoch=-1, end_offset=-1)
                    for p in topic.partitions
                ],
            )
            for topic in request.topics
        ]
    )


@_builder(24)
def _add_partitions_to_txn(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(24)
    if version >= 4:  # batched transactions (KIP-890): the top-level code says it
        return r(error_code=code, results_by_transaction=[])
    return r(
        results_by_topic_v3_and_below=[
            r.AddPartitionsToTxnTopicResult(
                name=topic.name,
                results_by_partition=[
                    r.AddPartitionsToTxnPartitionResult(partition_index=p, partition_error_code=code)
                    for p in topic.partitions
                ],
            )
            for topic in request.v3_and_below_topics
        ]
    )


@_builder(28)
def _txn_offset_commit(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(28)
    return r(
        topics=[
            r.TxnOffsetCommitResponseTopic(
                name=topic.name,
                partitions=[
                    r.TxnOffsetCommitResponsePartition(partition_index=p.partition_index, error_code=code)
                    for p in topic.partitions
                ],
            )
            for topic in request.topics
        ]
    )


@_builder(27)
def _write_txn_markers(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    """Every partition of every marker gets the code, one result per producer id (as Kafka's getErrorResponse)."""
    r = _response(27)
    by_producer: dict[int, dict[str, list[int]]] = {}
    for marker in request.markers:
        topics = by_producer.setdefault(marker.producer_id, {})
        for topic in marker.topics:
            partitions = topics.setdefault(topic.name, [])
            partitions.extend(p for p in topic.partition_indexes if p not in partitions)
    return r(
        markers=[
            r.WritableTxnMarkerResult(
                producer_id=producer_id,
                topics=[
                    r.WritableTxnMarkerTopicResult(
                        name=name,
                        partitions=[
                            r.WritableTxnMarkerPartitionResult(partition_index=p, error_code=code) for p in partitions
                        ],
                    )
                    for name, partitions in topics.items()
                ],
            )
            for producer_id, topics in by_producer.items()
        ]
    )


@_builder(61)
def _describe_producers(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(61)
    return r(
        topics=[
            r.TopicResponse(
                name=topic.name,
                partitions=[
                    r.PartitionResponse(partition_index=p, error_code=code, error_message=message, active_producers=[])
                    for p in topic.partition_indexes
                ],
            )
            for topic in request.topics
        ]
    )


@_builder(65)
def _describe_transactions(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(65)
    return r(
        transaction_states=[
            r.TransactionState(error_code=code, transactional_id=tid, transaction_state="", topics=[])
            for tid in request.transactional_ids
        ]
    )


@_builder(34)
def _alter_replica_log_dirs(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(34)
    partitions: dict[str, dict[int, None]] = {}  # topic -> its partitions, each once, in request order
    for directory in request.dirs:
        for topic in directory.topics:
            partitions.setdefault(topic.name, {}).update(dict.fromkeys(topic.partitions))
    return r(
        results=[
            r.AlterReplicaLogDirTopicResult(
                topic_name=name,
                partitions=[r.AlterReplicaLogDirPartitionResult(partition_index=p, error_code=code) for p in indexes],
            )
            for name, indexes in partitions.items()
        ]
    )


@_builder(35)
def _describe_log_dirs(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    # Kafka: the top-level code (v3+) and no directories; before v3 the answer can only be empty.
    return _response(35)(error_code=code, results=[])


@_builder(43)
def _elect_leaders(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(43)
    return r(
        error_code=code,
        replica_election_results=[
            r.ReplicaElectionResult(
                topic=topic.topic,
                partition_result=[
                    r.PartitionResult(partition_id=p, error_code=code, error_message=message) for p in topic.partitions
                ],
            )
            for topic in request.topic_partitions or []
        ],
    )


@_builder(45)
def _alter_partition_reassignments(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(45)
    return r(
        allow_replication_factor_change=request.allow_replication_factor_change,
        error_code=code,
        error_message=message,
        responses=[
            r.ReassignableTopicResponse(
                name=topic.name,
                partitions=[
                    r.ReassignablePartitionResponse(
                        partition_index=p.partition_index, error_code=code, error_message=message
                    )
                    for p in topic.partitions
                ],
            )
            for topic in request.topics
        ],
    )


@_builder(29)
def _describe_acls(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    return _response(29)(error_code=code, error_message=message, resources=[])


@_builder(30)
def _create_acls(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(30)
    return r(results=[r.AclCreationResult(error_code=code, error_message=message) for _ in request.creations])


@_builder(31)
def _delete_acls(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(31)
    return r(
        filter_results=[
            r.DeleteAclsFilterResult(error_code=code, error_message=message, matching_acls=[]) for _ in request.filters
        ]
    )


@_builder(48)
def _describe_client_quotas(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    return _response(48)(error_code=code, error_message=message, entries=None)  # Kafka: no entries at all


@_builder(49)
def _alter_client_quotas(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(49)
    return r(
        entries=[
            r.EntryData(
                error_code=code,
                error_message=message,
                entity=[r.EntityData(entity_type=e.entity_type, entity_name=e.entity_name) for e in entry.entity],
            )
            for entry in request.entries
        ]
    )


@_builder(50)
def _describe_user_scram_credentials(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(50)  # Kafka: the error on top and once per user named, without the user's name
    named = request.users or []
    results = [r.DescribeUserScramCredentialsResult(error_code=code, error_message=message) for _ in named]
    return r(error_code=code, error_message=message, results=results)


@_builder(51)
def _alter_user_scram_credentials(request: Any, version: int, code: ErrorCode, message: str | None) -> Any:
    r = _response(51)  # Kafka: the error for each distinct user named, sorted
    users = sorted({d.name for d in request.deletions} | {u.name for u in request.upsertions})
    return r(results=[r.AlterUserScramCredentialsResult(user=u, error_code=code, error_message=message) for u in users])
