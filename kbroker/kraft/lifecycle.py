"""The broker's registration with the controller quorum and its heartbeats: Kafka's BrokerLifecycleManager.

At start the broker registers (BrokerRegistration: cluster id, node id, a fresh incarnation id, its listeners,
rack, log directory ids and the range of every feature it supports), which gives it a broker epoch. It then sends
BrokerHeartbeat every ``broker.heartbeat.interval.ms`` with the metadata offset it has applied, asking to stay
fenced until the metadata follower has caught up; the controller unfences it once that offset reaches its
registration, and from then on places leaders on it. A controlled shutdown asks (``want_shut_down``) until the
controller has moved leadership away and answers ``should_shut_down``.

A registration the controller refuses for good (another cluster, features it finalized outside the ranges this
broker supports) ends the broker with one line naming why; answers from a voter that is not the active controller,
a lost connection or a duplicate registration (the previous incarnation's session has not expired yet) are retried.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import trio

from kbroker.kraft import BrokerRoleError
from kbroker.kraft.channel import ChannelError
from kbroker.kraft.quorum import QuorumView
from protocol._codec import Message
from protocol.errors import ErrorCode
from protocol.messages.broker_heartbeat_request import BrokerHeartbeatRequest
from protocol.messages.broker_heartbeat_response import BrokerHeartbeatResponse
from protocol.messages.broker_registration_request import BrokerRegistrationRequest
from protocol.messages.broker_registration_response import BrokerRegistrationResponse

log = logging.getLogger("kbroker.kraft")

RETRY_SECONDS = 0.5


_REFUSED = {ErrorCode.INCONSISTENT_CLUSTER_ID, ErrorCode.UNSUPPORTED_VERSION, ErrorCode.INVALID_REGISTRATION}


class RegistrationRefused(BrokerRoleError):
    """The controller refused this broker for good; the message says why and what to change."""


@dataclass(frozen=True)
class BrokerListener:
    name: str
    host: str
    port: int
    security_protocol: int


class BrokerLifecycleManager:
    """Registers the broker, then heartbeats until the broker stops; ``unfenced`` is set once the controller
    lets it serve, ``shutdown_allowed`` once a controlled shutdown may proceed."""

    def __init__(
        self,
        quorum: QuorumView,
        *,
        node_id: int,
        cluster_id: str,
        listeners: Sequence[BrokerListener],
        features: Mapping[str, tuple[int, int]],
        log_dirs: Sequence[uuid.UUID],
        applied_offset: Callable[[], int],
        caught_up: Callable[[], bool],
        rack: str | None = None,
        heartbeat_interval_ms: int = 2000,
        previous_broker_epoch: int = -1,
    ) -> None:
        """``previous_broker_epoch``: the epoch this broker had when it last stopped cleanly (-1: not known), which
        lets the controller take a re-registration before the old session expired and trust its logs (KIP-966)."""
        self.quorum = quorum
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.listeners = list(listeners)
        self.features = dict(features)
        self.log_dirs = list(log_dirs)
        self.rack = rack
        self.heartbeat_interval = heartbeat_interval_ms / 1000
        self._applied_offset = applied_offset
        self._caught_up = caught_up
        self.incarnation_id = uuid.uuid4()  # a fresh one per start, as Kafka's broker
        self.broker_epoch = -1
        self.previous_broker_epoch = previous_broker_epoch
        self.fenced = True
        self.registered = trio.Event()
        self.unfenced = trio.Event()
        self.last_failure: str | None = None  # the last failed connection to the quorum, said if none registers it
        self.shutdown_allowed = trio.Event()
        self._want_shut_down = False
        self._wake = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        previous_epoch = self.previous_broker_epoch
        while True:
            await self._register(previous_epoch)
            previous_epoch = self.broker_epoch
            if not await self._heartbeats():
                return  # shut down as asked

    def begin_controlled_shutdown(self) -> None:
        """Ask the controller to move leadership away; ``shutdown_allowed`` is set when it has."""
        self._want_shut_down = True
        self._wake.set()

    # --- registration -----------------------------------------------------------------------------------

    async def _register(self, previous_epoch: int) -> None:
        request = BrokerRegistrationRequest(
            broker_id=self.node_id,
            cluster_id=self.cluster_id,
            incarnation_id=self.incarnation_id,
            listeners=[
                BrokerRegistrationRequest.Listener(
                    name=listener.name,
                    host=listener.host,
                    port=listener.port,
                    security_protocol=listener.security_protocol,
                )
                for listener in self.listeners
            ],
            features=[
                BrokerRegistrationRequest.Feature(name=name, min_supported_version=low, max_supported_version=high)
                for name, (low, high) in sorted(self.features.items())
            ],
            rack=self.rack,
            log_dirs=self.log_dirs,
            previous_broker_epoch=previous_epoch,
        )
        while True:
            address, answer = await self._send(request, "registration")
            if answer is None:
                continue
            assert isinstance(answer, BrokerRegistrationResponse)
            code = ErrorCode(answer.error_code)
            if code == ErrorCode.NONE:
                self.broker_epoch = answer.broker_epoch
                self.fenced = True
                log.info("registered with the quorum: broker %d, epoch %d", self.node_id, self.broker_epoch)
                self.registered.set()
                return
            if code in _REFUSED:
                finalized = self.quorum.channel(address, "lifecycle").finalized_features
                raise RegistrationRefused(self._refusal(code, finalized))
            if code == ErrorCode.NOT_CONTROLLER:
                self.quorum.forget_leader()
            log.info("registration answered %s (retrying)", code.name)
            await trio.sleep(RETRY_SECONDS)

    async def _send(self, request: Message, what: str) -> tuple[tuple[str, int], Message | None]:
        """``request`` to the active controller (or the next configured voter); None as the answer after a failed
        connection, which is logged and waited out before the caller tries again."""
        address = self.quorum.address()
        try:
            return address, await self.quorum.channel(address, "lifecycle").request(request)
        except ChannelError as exc:
            self.last_failure = str(exc)
            log.info("%s to the controller quorum failed (retrying): %s", what, exc)
            self.quorum.forget_leader()
            await trio.sleep(RETRY_SECONDS)
            return address, None

    def _refusal(self, code: ErrorCode, finalized: Mapping[str, int]) -> str:
        if code == ErrorCode.INCONSISTENT_CLUSTER_ID:
            return (
                f"the controller quorum refuses cluster id {self.cluster_id}: it belongs to another cluster "
                "(format the data directory with that cluster's id)"
            )
        if code == ErrorCode.UNSUPPORTED_VERSION:
            outside = [
                f"{name}={level} (kbroker supports {low}-{high})"
                for name, level in sorted(finalized.items())
                for low, high in [self.features.get(name, (0, 0))]
                if not low <= level <= high
            ]
            named = ", ".join(outside) if outside else "a feature level"
            return (
                f"the controller quorum finalized {named}, which this broker does not support: format the "
                "controllers with levels inside kbroker's ranges (kafka-storage format --feature NAME=LEVEL)"
            )
        return f"the controller quorum refused the registration: {code.name}"

    # --- heartbeats -------------------------------------------------------------------------------------

    async def _heartbeats(self) -> bool:
        """Heartbeat until the broker epoch goes stale (True: register again) or a shutdown is allowed (False)."""
        while True:
            request = BrokerHeartbeatRequest(
                broker_id=self.node_id,
                broker_epoch=self.broker_epoch,
                current_metadata_offset=max(self._applied_offset(), 0),
                want_fence=not self._caught_up(),
                want_shut_down=self._want_shut_down,
            )
            _, answer = await self._send(request, "heartbeat")
            if answer is None:
                continue
            assert isinstance(answer, BrokerHeartbeatResponse)
            code = ErrorCode(answer.error_code)
            if code == ErrorCode.STALE_BROKER_EPOCH:
                log.warning("the controller quorum dropped broker epoch %d: registering again", self.broker_epoch)
                self.fenced = True
                self.unfenced = trio.Event()
                return True
            if code == ErrorCode.NONE:
                self.fenced = answer.is_fenced
                if not answer.is_fenced:
                    self.unfenced.set()
                if answer.should_shut_down:
                    self.shutdown_allowed.set()
                    return False
            else:
                if code == ErrorCode.NOT_CONTROLLER:
                    self.quorum.forget_leader()
                log.info("heartbeat answered %s", code.name)
            self._wake = trio.Event()
            with trio.move_on_after(self.heartbeat_interval if self.unfenced.is_set() else RETRY_SECONDS / 5):
                await self._wake.wait()
