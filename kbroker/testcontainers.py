"""kbroker in Docker for tests, started the way testcontainers starts Kafka (``pip install 'kbroker[docker]'``).

    from kbroker.testcontainers import KBrokerContainer

    with KBrokerContainer("kbroker:latest").with_config("num.partitions", 3) as kafka:
        producer = KafkaProducer(bootstrap_servers=kafka.get_bootstrap_server())

The image is the one docker/Dockerfile builds (``docker build -f docker/Dockerfile -t kbroker .``, or
``KBrokerContainer.build_image(repository_root)``). As with testcontainers' KafkaContainer, the container's
address on the host is known only once Docker has mapped the port, so the container waits for it: its
entrypoint waits for KBROKER_ADVERTISED_LISTENER_FILE, which ``start()`` writes, and ``start()`` returns
once the broker answers ApiVersions and Metadata on that address (kbroker.health), not on a log line.

For tests without Docker, the pytest plugin's ``kafka_broker`` fixture starts kbroker in-process.
"""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path
from typing import Any, Self

from kbroker.health import wait_until_ready

try:
    from testcontainers.core.container import DockerContainer
except ImportError as exc:  # the optional dependency
    raise ImportError("kbroker.testcontainers needs testcontainers: pip install 'kbroker[docker]'") from exc

DEFAULT_IMAGE = "kbroker:latest"
ADVERTISED_LISTENER_FILE = "/tmp/kbroker-advertised-listener"


def docker_engine_problem(timeout: float = 3.0) -> str | None:
    """Why no Docker engine can be used from here (None when one answers a ping)."""
    try:
        import docker
    except ImportError:
        return "the docker package is not installed (pip install 'kbroker[docker]')"
    try:
        client = docker.from_env(timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # docker-py raises DockerException, requests' and urllib3's errors alike
        return f"no Docker engine: {type(exc).__name__}: {exc}"
    return None


class KBrokerContainer(DockerContainer):
    """A kbroker container; ``get_bootstrap_server()`` is its ``host:port`` on the Docker host."""

    def __init__(self, image: str = DEFAULT_IMAGE, port: int = 9092, **kwargs: Any) -> None:
        super().__init__(image, **kwargs)
        self.port = port
        self.startup_timeout = 60.0
        self.with_exposed_ports(port)
        self.with_env("KBROKER_LISTENER", f"0.0.0.0:{port}")
        self.with_env("KBROKER_ADVERTISED_LISTENER_FILE", ADVERTISED_LISTENER_FILE)
        # As testcontainers' KafkaContainer: a group forms at its first join, not 3 s later (with_config wins).
        self.with_config("group.initial.rebalance.delay.ms", 0)

    def with_config(self, key: str, value: object) -> Self:
        """A server.properties setting, e.g. ``with_config("log.retention.ms", 3600000)``."""
        text = str(value).lower() if isinstance(value, bool) else str(value)
        self.with_env("KBROKER_CONFIG_" + key.replace(".", "_").upper(), text)
        return self

    def with_startup_timeout(self, seconds: float) -> Self:
        self.startup_timeout = seconds
        return self

    def get_bootstrap_server(self) -> str:
        return f"{self.get_container_host_ip()}:{self.get_exposed_port(self.port)}"

    def start(self) -> Self:
        super().start()
        self._put_file(ADVERTISED_LISTENER_FILE, self.get_bootstrap_server() + "\n")
        try:
            wait_until_ready(self.get_bootstrap_server(), timeout=self.startup_timeout)
        except TimeoutError as exc:
            logs = b"".join(self.get_logs()).decode(errors="replace")[-4000:]
            raise TimeoutError(f"{exc}\ncontainer log:\n{logs}") from None
        return self

    def _put_file(self, path: str, text: str) -> None:
        data = text.encode()
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        if not self.get_wrapped_container().put_archive("/", archive.getvalue()):
            raise OSError(f"could not write {path} into the container")

    @staticmethod
    def build_image(source: Path | str, tag: str = DEFAULT_IMAGE) -> str:
        """Build docker/Dockerfile of a kbroker source tree as ``tag`` (what ``docker build`` would); returns it.

        Only the files the image needs are sent to the engine, whatever else the tree holds.
        """
        import docker

        root = Path(source)
        wanted = ["pyproject.toml", "README.md", "kbroker", "protocol", "docker/Dockerfile", "docker/entrypoint.sh"]
        context = io.BytesIO()
        with tarfile.open(fileobj=context, mode="w") as tar:
            for name in wanted:
                tar.add(root / name, arcname=name, filter=_without_caches)
        context.seek(0)
        client = docker.from_env()
        try:
            client.images.build(fileobj=context, custom_context=True, dockerfile="docker/Dockerfile", tag=tag, rm=True)
        finally:
            client.close()
        return tag


def _without_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in info.name or info.name.endswith(".pyc") else info
