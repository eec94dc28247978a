"""Where the controller quorum is: the addresses a broker is configured with and the leader it last learned of.

A broker is given ``controller.quorum.bootstrap.servers`` (host:port, ...) or ``controller.quorum.voters``
(id@host:port, ...). The active controller is the KRaft leader of ``__cluster_metadata``: a Fetch answers its id
and epoch, and (Fetch v17+) its endpoint, so both the metadata follower and the lifecycle manager send to the
node this view names, and go round the configured addresses while no leader is known.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kbroker.kraft.channel import NodeChannel
from kbroker.kraft.node_security import PLAINTEXT_NODE, NodeSecurity


class QuorumConfigError(ValueError):
    """controller.quorum.* settings that cannot be used; the message names the setting."""


def parse_voters(text: str) -> dict[int, tuple[str, int]]:
    """``controller.quorum.voters``: ``id@host:port`` entries separated by commas."""
    voters: dict[int, tuple[str, int]] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        node, at, address = entry.partition("@")
        host, colon, port = address.rpartition(":")
        if not at or not colon or not node.isdigit() or not port.isdigit() or not host:
            raise QuorumConfigError(f"controller.quorum.voters: {entry!r} is not id@host:port")
        voters[int(node)] = (host.strip("[]"), int(port))
    return voters


def parse_bootstrap(text: str) -> list[tuple[str, int]]:
    """``controller.quorum.bootstrap.servers``: ``host:port`` entries separated by commas."""
    servers = []
    for entry in filter(None, (part.strip() for part in text.split(","))):
        host, colon, port = entry.rpartition(":")
        if not colon or not port.isdigit() or not host:
            raise QuorumConfigError(f"controller.quorum.bootstrap.servers: {entry!r} is not host:port")
        servers.append((host.strip("[]"), int(port)))
    return servers


@dataclass
class QuorumView:
    """The configured controller addresses and the leader last learned of (id, epoch, address)."""

    bootstrap: list[tuple[str, int]]
    client_id: str
    security: NodeSecurity = PLAINTEXT_NODE  # the controller listener's TLS and SASL
    leader_id: int = -1
    leader_epoch: int = -1
    leader_address: tuple[str, int] | None = None
    _next_bootstrap: int = 0
    _channels: dict[tuple[str, int], NodeChannel] = field(default_factory=dict)

    def learn_leader(self, leader_id: int, epoch: int, address: tuple[str, int] | None) -> None:
        """A Fetch answer named the leader: newer epochs win; an address is kept once known."""
        if epoch < self.leader_epoch:
            return
        if epoch > self.leader_epoch or leader_id != self.leader_id:
            self.leader_address = None
        self.leader_id, self.leader_epoch = leader_id, epoch
        if address is not None:
            self.leader_address = address

    def forget_leader(self) -> None:
        """The leader stopped answering: go round the configured addresses again."""
        self.leader_address = None

    def address(self) -> tuple[str, int]:
        """Where to send the next request: the leader's address, else the next configured one."""
        if self.leader_address is not None:
            return self.leader_address
        address = self.bootstrap[self._next_bootstrap % len(self.bootstrap)]
        self._next_bootstrap += 1
        return address

    def channel(self, address: tuple[str, int], purpose: str) -> NodeChannel:
        """A channel to ``address`` for one purpose (heartbeats and fetches do not queue behind each other)."""
        key = (f"{address[0]}#{purpose}", address[1])
        channel = self._channels.get(key)
        if channel is None:
            channel = self._channels[key] = NodeChannel(*address, client_id=self.client_id, security=self.security)
        return channel

    def leader_api_versions(self) -> dict[int, tuple[int, int]] | None:
        """What the active controller answered ApiVersions with on a channel to it (None: none connected yet)."""
        if self.leader_address is None:
            return None
        host, port = self.leader_address
        for (key, channel_port), channel in self._channels.items():
            if channel_port == port and key.partition("#")[0] == host and channel.versions:
                return channel.versions
        return None

    async def aclose(self) -> None:
        for channel in self._channels.values():
            await channel.aclose()
        self._channels.clear()
