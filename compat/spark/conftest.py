"""Spark in the compat suite: the pipeline's scenarios against each target, as the matrix's "spark" client."""

from __future__ import annotations

from pathlib import Path

import pytest

from compat.spark.fixtures import kafka_spark, spark, spark_for_tests  # noqa: F401

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # compat/conftest.py puts a test in the matrix when it has a client_spec parameter; these have none
    # (Spark is not a compat/clients adapter), so they name their cell themselves.
    for item in items:
        params = getattr(item, "callspec", None) and item.callspec.params
        if params and "target" in params and Path(item.path).resolve().parent == HERE:
            scenario = getattr(item, "originalname", item.name).removeprefix("test_")
            item.user_properties.append(("compat", (params["target"], scenario, "spark")))
