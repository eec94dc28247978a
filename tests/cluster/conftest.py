"""The ``cluster`` fixture: one Cluster (tests/cluster/harness.py) per test module, shared by its tests.

Processes are shared because starting them is most of what such a test costs; each test gets the brokers
running, resumed and healed (whatever the previous test did to them) and uses topics of its own. A module sets
the size and the brokers' settings with a marker:

    pytestmark = pytest.mark.cluster(size=3, overrides={"num.partitions": "3"})
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.harness import Cluster

MARKER = "cluster"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(size=1, overrides=None, overrides_for=None): the module's cluster (tests/cluster)"
    )


@pytest.fixture(scope="module")
def cluster_processes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    marker = request.node.get_closest_marker(MARKER)
    settings = dict(marker.kwargs) if marker is not None else {}
    with Cluster(tmp_path_factory.mktemp("cluster"), **settings) as cluster:
        yield cluster


@pytest.fixture
def cluster(cluster_processes: Cluster) -> Iterator[Cluster]:
    """The module's cluster, every broker running and reachable; put back so after the test."""
    cluster_processes.restore()
    yield cluster_processes
    cluster_processes.restore()
