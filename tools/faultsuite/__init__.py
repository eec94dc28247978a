"""The fault suite of issue #30: a randomized, seeded fault run in Jepsen's manner against a kbroker cluster and,
as the control, an Apache Kafka cluster. ``history`` records what clients and the nemesis did, ``checker`` says
what the cluster did wrong."""
