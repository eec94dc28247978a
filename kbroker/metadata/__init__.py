"""Cluster metadata as Kafka keeps it: records of Kafka's own metadata types in a local ``__cluster_metadata`` log.

- ``kbroker.metadata.log``: the log and its snapshots in Kafka's layout (append, snapshot, replay).
"""
