"""The broker role of KRaft: a kbroker broker under Apache Kafka's own controller quorum.

``quorum.py`` knows where the controllers are, ``channel.py`` talks to one, ``metadata_follower.py`` follows
``__cluster_metadata`` as an observer into the broker's MetadataCache, and ``lifecycle.py`` registers the broker
and heartbeats. No consensus is implemented here: the controllers are Kafka's.
"""
