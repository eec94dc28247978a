"""Consumer groups (the classic protocol every client here speaks): assignment, rebalance when a member
leaves and when one crashes, resuming from committed offsets, fan-out to several groups.

Which partitions a member gets depends on the client's assignor (range, round-robin, sticky), so the
scenarios assert what all of them guarantee: every partition to exactly one member, an even split, every
record delivered. How long a rebalance takes is a matter of timing and differs between brokers; the
scenarios wait for the outcome. The crashed member is a client process killed with SIGKILL, so it never
sends LeaveGroup and the coordinator notices only when its session times out."""

from __future__ import annotations

import time
from collections.abc import Callable

from compat.clients.remote import RemoteClient
from compat.helpers import Member, poll_until
from compat.reference import Reference
from compat.targets import Target

PARTITIONS = 4


def seed(reference: Reference, topic: str, round_: int, per_partition: int = 2) -> list[tuple[int, int, str]]:
    """``per_partition`` records into every partition; (partition, offset, value) of each."""
    out = []
    for partition in range(PARTITIONS):
        values = [f"r{round_}-p{partition}-{i}" for i in range(per_partition)]
        base = reference.produce(topic, partition, [(None, v, int(time.time() * 1000)) for v in values])
        out += [(partition, base + i, v) for i, v in enumerate(values)]
    return sorted(out)


def assigned_apart(members: list[Member]) -> bool:
    """Every partition to exactly one member, spread evenly."""
    everything = sorted(p for m in members for p in m.partitions())
    sizes = {len(m.partitions()) for m in members}
    return everything == list(range(PARTITIONS)) and max(sizes) - min(sizes) <= 1


def test_assignment_and_rebalance_on_leave(
    client: RemoteClient, new_member: Callable[[], RemoteClient], target: Target, reference: Reference, names
) -> None:
    topic, group = names("topic"), names("group")
    reference.create_topic(topic, PARTITIONS)
    first_round = seed(reference, topic, 1)
    alone = Member.join(client, group, [topic], target.session_timeout_ms)
    poll_until([alone], lambda: alone.partitions() == [0, 1, 2, 3] and len(alone.records) == 8, "one member")
    assert alone.seen() == first_round

    other = Member.join(new_member(), group, [topic], target.session_timeout_ms)
    poll_until([alone, other], lambda: assigned_apart([alone, other]) and other.partitions(), "two members")
    assert len(alone.partitions()) == len(other.partitions()) == 2

    # Records sent now go to the member that owns their partition, once. (Records of the first round may be
    # delivered again: nothing was committed, so a partition's new owner starts from the earliest offset.)
    second_round = seed(reference, topic, 2, per_partition=1)

    def second(member: Member) -> list[tuple[int, int, str]]:
        return [(r["partition"], r["offset"], r["value"]) for r in member.records if r["value"].startswith("r2-")]

    poll_until([alone, other], lambda: len(second(alone)) + len(second(other)) == PARTITIONS, "the second round")
    assert sorted(second(alone) + second(other)) == second_round
    for member in (alone, other):
        assert {p for p, _, _ in second(member)} <= set(member.partitions())

    # A member that leaves (LeaveGroup on close) hands its partitions back at once.
    other.client.consumer_close(handle=other.handle)
    poll_until([alone], lambda: alone.partitions() == [0, 1, 2, 3], "the group after a member left")
    alone.client.consumer_close(handle=alone.handle)


def test_rebalance_when_a_member_crashes(
    client: RemoteClient, new_member: Callable[[], RemoteClient], target: Target, reference: Reference, names
) -> None:
    topic, group = names("topic"), names("group")
    reference.create_topic(topic, PARTITIONS)
    survivor = Member.join(client, group, [topic], target.session_timeout_ms)
    doomed = Member.join(new_member(), group, [topic], target.session_timeout_ms)
    poll_until([survivor, doomed], lambda: assigned_apart([survivor, doomed]) and doomed.partitions(), "two members")
    orphaned = doomed.partitions()

    doomed.client.crash()  # no LeaveGroup: the coordinator waits for the session timeout
    poll_until([survivor], lambda: survivor.partitions() == [0, 1, 2, 3], "the group after a crash", timeout=90)
    # The crashed member's partitions are consumed by the survivor from the start (nothing was committed).
    records = seed(reference, topic, 1, per_partition=1)
    poll_until([survivor], lambda: len(survivor.records) >= PARTITIONS, "records after the rebalance")
    assert survivor.seen() == records
    assert {r["partition"] for r in survivor.records} >= set(orphaned)
    survivor.client.consumer_close(handle=survivor.handle)


def test_resume_from_committed_offsets(client: RemoteClient, target: Target, reference: Reference, names) -> None:
    """A group's next member starts where the group committed, not from the beginning."""
    topic, group = names("topic"), names("group")
    reference.create_topic(topic, PARTITIONS)
    first_round = seed(reference, topic, 1)
    member = Member.join(client, group, [topic], target.session_timeout_ms)
    poll_until([member], lambda: len(member.records) == 8, "the first round")
    assert member.seen() == first_round
    client.consumer_commit(handle=member.handle)
    assert reference.committed(group, topic, PARTITIONS) == {p: 2 for p in range(PARTITIONS)}
    client.consumer_close(handle=member.handle)

    second_round = seed(reference, topic, 2, per_partition=1)
    successor = Member.join(client, group, [topic], target.session_timeout_ms)
    poll_until([successor], lambda: len(successor.records) >= PARTITIONS, "the second round")
    assert successor.seen() == second_round  # nothing of the first round again
    client.consumer_commit(handle=successor.handle)
    assert reference.committed(group, topic, PARTITIONS) == {p: 3 for p in range(PARTITIONS)}
    client.consumer_close(handle=successor.handle)


def test_fan_out_to_two_groups(client: RemoteClient, target: Target, reference: Reference, names) -> None:
    """Each group gets every record: groups do not share work, members of one group do."""
    topic = names("topic")
    reference.create_topic(topic, PARTITIONS)
    records = seed(reference, topic, 1)
    members = [Member.join(client, names(f"group{i}"), [topic], target.session_timeout_ms) for i in range(2)]
    poll_until(members, lambda: all(len(m.records) >= 8 for m in members), "both groups")
    for member in members:
        assert member.seen() == records
        assert member.partitions() == [0, 1, 2, 3]
        client.consumer_close(handle=member.handle)
