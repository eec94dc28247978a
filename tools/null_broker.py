"""A broker that stores nothing: it acknowledges every produce at once, for the benchmark's client ceiling.

    python tools/null_broker.py --port 9099 [--partitions 2]

It answers ApiVersions, Metadata (every topic asked for exists, with --partitions partitions led by itself)
and Produce (every batch accepted, offsets counted, nothing validated or written), with one thread per
connection on blocking sockets. A producer pointed at it does all its own work (batching, compression,
sending, handling acknowledgements) while the broker side costs next to nothing: the rate it reaches is what
that client can do when the broker is not the limit. tools/bench_compare.py measures 100 B produce against
it beside the real brokers. Not a Kafka broker: no consume, no admin, no errors.
"""

from __future__ import annotations

import argparse
import socket
import struct
import threading
import uuid

from protocol.framing import FrameBuffer, decode_request, encode_response
from protocol.messages.api_versions_response import ApiVersion, ApiVersionsResponse
from protocol.messages.metadata_response import (
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
)
from protocol.messages.produce_response import PartitionProduceResponse, ProduceResponse, TopicProduceResponse

PRODUCE, FETCH, METADATA, API_VERSIONS = 0, 1, 3, 18
# Versions answered; Produce stops before v13 (topic ids), which a null broker has no use for. Fetch is
# advertised, never answered: librdkafka writes v2 record batches only to a broker with Fetch v4 or later.
VERSIONS = {PRODUCE: (3, 12), FETCH: (4, 12), METADATA: (0, 12), API_VERSIONS: (0, 3)}
_LAST_OFFSET_DELTA = struct.Struct(">i")  # at byte 23 of a record batch: records in the batch, minus one


class NullBroker:
    def __init__(self, host: str, port: int, partitions: int) -> None:
        self.host, self.port, self.partitions = host, port, partitions
        self.cluster_id = str(uuid.uuid4())
        self.next_offsets: dict[tuple[str, int], int] = {}
        self.lock = threading.Lock()

    def serve_forever(self) -> None:
        with socket.create_server((self.host, self.port), backlog=256) as server:
            while True:
                connection, _ = server.accept()
                connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                threading.Thread(target=self.serve_connection, args=(connection,), daemon=True).start()

    def serve_connection(self, connection: socket.socket) -> None:
        buffer = FrameBuffer()
        with connection:
            while True:
                while (frame := buffer.next_frame()) is None:
                    with buffer.read_buffer() as target:
                        count = connection.recv_into(target)
                    if not count:
                        return
                    buffer.commit(count)
                request = decode_request(frame)
                key, version = request.api_key, request.api_version
                if key == API_VERSIONS and request.body is None:
                    version = 0  # KIP-511: a version we do not know is answered in v0
                response = self.answer(key, version, request.body)
                if response is not None:
                    connection.sendall(encode_response(response, key, version, request.correlation_id))

    def answer(self, key: int, version: int, body: object) -> object | None:
        if key == API_VERSIONS:
            keys = [ApiVersion(api_key=k, min_version=low, max_version=high) for k, (low, high) in VERSIONS.items()]
            return ApiVersionsResponse(api_keys=keys)
        if key == METADATA:
            names = [topic.name for topic in body.topics or () if topic.name]
            return MetadataResponse(
                brokers=[MetadataResponseBroker(node_id=0, host=self.host, port=self.port)],
                cluster_id=self.cluster_id,
                controller_id=0,
                topics=[self.topic_metadata(name) for name in names],
            )
        if key == PRODUCE:
            return self.acknowledge(body)
        raise ValueError(f"the null broker does not answer api key {key}")

    def topic_metadata(self, name: str) -> MetadataResponseTopic:
        partitions = [
            MetadataResponsePartition(partition_index=index, leader_id=0, replica_nodes=[0], isr_nodes=[0])
            for index in range(self.partitions)
        ]
        return MetadataResponseTopic(name=name, partitions=partitions)

    def acknowledge(self, request: object) -> ProduceResponse | None:
        topics = []
        with self.lock:
            for topic in request.topic_data:
                answers = []
                for partition in topic.partition_data:
                    key = (topic.name, partition.index)
                    base_offset = self.next_offsets.get(key, 0)
                    records = partition.records or b""
                    count = 0
                    position = 0
                    while position + 61 <= len(records):  # every batch's header, nothing more
                        count += _LAST_OFFSET_DELTA.unpack_from(records, position + 23)[0] + 1
                        position += 12 + int.from_bytes(records[position + 8 : position + 12], "big")
                    self.next_offsets[key] = base_offset + count
                    answers.append(PartitionProduceResponse(index=partition.index, base_offset=base_offset))
                topics.append(TopicProduceResponse(name=topic.name, partition_responses=answers))
        return None if request.acks == 0 else ProduceResponse(responses=topics)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--partitions", type=int, default=2, help="partitions of every topic (default 2)")
    args = parser.parse_args()
    NullBroker(args.host, args.port, args.partitions).serve_forever()


if __name__ == "__main__":
    main()
