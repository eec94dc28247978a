"""``kbroker mirror``: copy topics and consumer group offsets between Kafka-compatible clusters, modelled on
MirrorMaker 2 (KIP-382, KIP-545, KIP-656). replicator.py is the copy loop, policy.py names and filters topics,
checkpoints.py translates offsets; kbroker/commands/mirror.py is the command line."""
