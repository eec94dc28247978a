"""The compatibility suite: scenarios written once, run with every client against a target.

    python -m pytest compat --target kbroker            # kbroker, started by the suite
    python -m pytest compat --target kafka              # Apache Kafka 4.x in Docker (testcontainers)
    KBROKER_COMPAT_BOOTSTRAP=host:9092 python -m pytest compat --target external

Assertions are Kafka's documented behaviour, checked through each client and through the suite's own
protocol-level view (compat/reference.py). What may legitimately differ between targets is never asserted:
cluster and node ids, producer ids, how long a rebalance or a metadata change takes (scenarios wait for the
outcome instead). See compat/conftest.py for the options and compat/clients/__init__.py for adding a client.
"""
