"""The replica layer between the request handlers and the logs (Kafka's ReplicaManager and Partition).

registration.py is its one input (who leads each partition, who is in sync), partition.py a partition as a
replica (role, epochs, ISR, the followers' positions, the high watermark), manager.py the replicas this broker
holds, the acks=all waits and the high-watermark checkpoint, fetcher.py the followers' fetching from their leaders
(one fetcher task per source broker).
"""

from kbroker.replication.manager import HIGH_WATERMARK_FILE, ReplicaManager, read_high_watermarks
from kbroker.replication.partition import IsrProposal, Partition, ReplicaState, Role, leader_epoch_error
from kbroker.replication.registration import LeadershipSource, Registration, SingleNodeLeadership

__all__ = [
    "HIGH_WATERMARK_FILE",
    "IsrProposal",
    "LeadershipSource",
    "Partition",
    "Registration",
    "ReplicaManager",
    "ReplicaState",
    "Role",
    "SingleNodeLeadership",
    "StaticRegistration",
    "leader_epoch_error",
    "read_high_watermarks",
]
