"""The compat suite's machinery: targets, client processes, and the scenario × client × target matrix.

    python -m pytest compat                               (both kbroker and Apache Kafka: the default)
    python -m pytest compat --target kbroker              (one target)
    python -m pytest compat --clients java-4.4,kcat       (a subset of the clients)
    python -m pytest compat --compat-json matrix.json     (the matrix as JSON as well)

Each scenario is a test taking ``client`` (a process of one client, kept for the session) and ``target``;
it is run once per client per target. A client that cannot do what a scenario needs raises Unsupported,
and the cell reads "n/a"; a client or target that cannot run here is skipped with the reason. The matrix
(a row per scenario and client, a column per target, "differs" where one target passed and another failed)
is printed at the end of the run.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from compat.clients import ClientSpec, ClientUnavailable, all_client_specs
from compat.clients.api import Unsupported
from compat.clients.remote import RemoteClient
from compat.reference import Reference
from compat.targets import TARGETS, Target, TargetUnavailable, start_target

SPECS = {spec.name: spec for spec in all_client_specs()}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("compat", "kbroker compatibility suite (compat/)")
    group.addoption("--target", default="kbroker,kafka", help=f"comma-separated targets: {', '.join(TARGETS)}")
    group.addoption("--clients", default="", help=f"comma-separated clients (default all): {', '.join(SPECS)}")
    group.addoption("--compat-json", default=None, metavar="PATH", help="also write the matrix as JSON")


def _listed(config: pytest.Config, option: str, known: list[str] | tuple[str, ...]) -> list[str]:
    names = [n.strip() for n in (config.getoption(option) or "").split(",") if n.strip()] or list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise pytest.UsageError(f"--{option}: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    return names


SELECTED: dict[str, list[str]] = {}


def pytest_configure(config: pytest.Config) -> None:
    SELECTED["target"] = _listed(config, "target", TARGETS)  # a mistake stops the run before collection
    SELECTED["clients"] = _listed(config, "clients", list(SPECS))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" in metafunc.fixturenames:
        metafunc.parametrize("target", SELECTED["target"], indirect=True, scope="session")
    if "secured_target" in metafunc.fixturenames:  # compat/test_security.py starts its own secured brokers
        secured = [t for t in SELECTED["target"] if t != "external"]
        metafunc.parametrize("secured_target", secured, scope="session")
    if "client" in metafunc.fixturenames:
        metafunc.parametrize("client_spec", SELECTED["clients"], indirect=True)


# --- targets and clients -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    try:
        running = start_target(request.param, tmp_path_factory.mktemp(f"compat-{request.param}"))
    except TargetUnavailable as exc:
        pytest.skip(f"target {request.param}: {exc}")
    yield running
    running.stop()


@pytest.fixture(scope="session")
def reference(target: Target) -> Iterator[Reference]:
    ref = Reference(target.bootstrap)
    yield ref
    ref.close()


@pytest.fixture
def client_spec(request: pytest.FixtureRequest) -> ClientSpec:
    return SPECS[request.param]


class ClientPool:
    """One long-lived process per (target, client); extra ones (group members) live for one test."""

    def __init__(self) -> None:
        self.processes: dict[tuple[str, str], RemoteClient] = {}
        self.unavailable: dict[str, str] = {}
        self.versions: dict[str, str] = {}

    def start(self, spec: ClientSpec, target: Target) -> RemoteClient:
        if spec.name in self.unavailable:
            pytest.skip(self.unavailable[spec.name])
        try:
            process = spec.start(target.bootstrap)
        except ClientUnavailable as exc:
            self.unavailable[spec.name] = f"client {spec.name}: {exc}"
            pytest.skip(self.unavailable[spec.name])
        self.versions[spec.name] = process.version
        return process

    def get(self, spec: ClientSpec, target: Target) -> RemoteClient:
        key = (target.name, spec.name)
        running = self.processes.get(key)
        if running is None or running.process.poll() is not None:
            self.processes[key] = self.start(spec, target)
        return self.processes[key]

    def close(self) -> None:
        for process in self.processes.values():
            process.close()


@pytest.fixture(scope="session")
def client_pool() -> Iterator[ClientPool]:
    pool = ClientPool()
    pool.versions = MATRIX.versions
    yield pool
    pool.close()


@pytest.fixture
def client(client_pool: ClientPool, client_spec: ClientSpec, target: Target) -> RemoteClient:
    """The client under test, connected to the target (its process is kept for the whole session)."""
    return client_pool.get(client_spec, target)


@pytest.fixture
def new_member(
    client_pool: ClientPool, client_spec: ClientSpec, target: Target
) -> Iterator[Callable[[], RemoteClient]]:
    """``new_member()``: another process of the same client, e.g. a group member to crash; ended after the test."""
    started: list[RemoteClient] = []

    def start() -> RemoteClient:
        started.append(client_pool.start(client_spec, target))
        return started[-1]

    yield start
    for process in started:
        process.close()


@pytest.fixture
def names(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``names("topic")``: a name unique to this test run (topics and groups are never reused)."""
    run = uuid.uuid4().hex[:8]
    scenario = request.node.originalname.removeprefix("test_").replace("_", "-")[:40]
    return lambda what: f"{scenario}-{what}-{run}"


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Iterator[None]:
    """A client without the operation a scenario needs: the cell is "n/a", not a failure."""
    try:
        return (yield)
    except Unsupported as exc:
        pytest.skip(f"n/a: {exc}")


# --- the matrix --------------------------------------------------------------------------------------------


@dataclass
class Matrix:
    cells: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (target, scenario, client) -> result
    reasons: dict[tuple[str, str, str], str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)

    def record(self, where: tuple[str, str, str], result: str, reason: str = "") -> None:
        if self.cells.get(where) in ("FAIL", "error"):
            return  # a teardown pass does not undo a failed call
        self.cells[where] = result
        if reason:
            self.reasons[where] = reason


MATRIX = Matrix()  # one pytest session per process


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        params = getattr(item, "callspec", None) and item.callspec.params
        target = params and (params.get("target") or params.get("secured_target"))
        if target and "client_spec" in params:
            scenario = item.originalname.removeprefix("test_")
            item.user_properties.append(("compat", (target, scenario, params["client_spec"])))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    where = next((value for name, value in report.user_properties if name == "compat"), None)
    if where is None:
        return
    matrix = MATRIX
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        matrix.record(where, "n/a" if reason.startswith("n/a") else "skip", reason)
    elif report.failed:
        matrix.record(where, "FAIL" if report.when == "call" else "error")
    elif report.when == "call":
        matrix.record(where, "pass")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    matrix = MATRIX
    if not matrix.cells:
        return
    targets = sorted({t for t, _, _ in matrix.cells}, key=list(TARGETS).index)
    scenarios = list(dict.fromkeys(s for _, s, _ in matrix.cells))
    clients = [c for c in SPECS if any(c == client for _, _, client in matrix.cells)]
    clients += sorted({client for _, _, client in matrix.cells} - set(SPECS))  # plug-ins such as spark
    rows = [
        (scenario, client, [matrix.cells.get((t, scenario, client), "-") for t in targets])
        for scenario in scenarios
        for client in clients
        if any((t, scenario, client) in matrix.cells for t in targets)
    ]
    terminalreporter.write_sep("=", f"compat matrix: {' | '.join(targets)}")
    widths = [max(len(s) for s in scenarios) + 2, max(len(c) for c in clients) + 2]
    widths += [max(len(t), 5) + 2 for t in targets]
    header = ["scenario", "client", *targets]
    terminalreporter.write_line("".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    for scenario, client, results in rows:
        ran = {r for r in results if r not in ("-", "skip", "n/a")}
        note = "  differs" if len(ran) > 1 else ""  # one target passed where another failed
        cells = [scenario, client, *results]
        terminalreporter.write_line("".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip() + note)
    versions = ", ".join(f"{c} {matrix.versions[c]}" for c in clients if c in matrix.versions)
    if versions:
        terminalreporter.write_line(f"client versions: {versions}")
    skipped = {(t, reason) for (t, _, _), reason in matrix.reasons.items() if not reason.startswith("n/a")}
    for target_name, reason in sorted(skipped):
        terminalreporter.write_line(f"skipped on {target_name}: {reason}")
    path = config.getoption("compat_json", None)
    if path:
        rows = [
            {"target": t, "scenario": s, "client": c, "result": r, "reason": matrix.reasons.get((t, s, c), "")}
            for (t, s, c), r in matrix.cells.items()
        ]
        with open(path, "w") as out:
            json.dump({"cells": rows, "versions": matrix.versions}, out, indent=1)
