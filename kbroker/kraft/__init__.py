"""The broker role of KRaft: a kbroker broker under Apache Kafka's own controller quorum.

``quorum.py`` knows where the controllers are, ``channel.py`` talks to one, ``metadata_follower.py`` follows
``__cluster_metadata`` as an observer into the broker's MetadataCache, and ``lifecycle.py`` registers the broker
and heartbeats; ``forwarding.py`` sends admin operations to the active controller and ``role.py`` runs it all as
``kbroker serve`` with ``process.roles=broker``. No consensus is implemented here: the controllers are Kafka's.
"""


class BrokerRoleError(Exception):
    """The broker cannot go on under this controller quorum; the message is the one line that says why."""
