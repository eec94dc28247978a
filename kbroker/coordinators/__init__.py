"""Coordinators on logs: Kafka's CoordinatorRuntime (runtime.py) and the internal topics it writes."""
