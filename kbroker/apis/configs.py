"""DescribeConfigs (32), AlterConfigs (33) and IncrementalAlterConfigs (44) for topics, the broker and groups.

Topic overrides, dynamic broker configs (this broker's, by its id, and the cluster-wide default, by "") and group
configs are ConfigRecords in the metadata image, changed through the controller (kbroker/dynamic_config.py has
what may change and how the layers make a broker's effective settings).

Authorization as Kafka's: describing needs DESCRIBE_CONFIGS, altering ALTER_CONFIGS, on the topic (else
TOPIC_AUTHORIZATION_FAILED, whether the topic exists or not), on the cluster for the broker and its loggers (else
CLUSTER_AUTHORIZATION_FAILED) or on the group (GROUP_AUTHORIZATION_FAILED), with Kafka's messages; DescribeConfigs
answers the refused resources after the others.

Under a KRaft quorum, AlterConfigs and IncrementalAlterConfigs are Kafka's broker's: what its ConfigAdminManager
answers itself (a repeated resource or key, a null value, another broker's id, broker loggers) and what kbroker
cannot apply are answered here, and the rest goes to the controller in one request with the client's header, in
an Envelope with the client's principal (kbroker/apis/forwarded.py): the controller authorizes and checks it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kbroker.apis.context import RequestContext
from kbroker.apis.turns import Turns
from kbroker.config_registry import BROKER_DEFS, DESCRIBED_BROKER_DEFS, ConfigDef, ConfigError, problem_with
from kbroker.dynamic_config import (
    APPLIED_DYNAMIC_KEYS,
    DYNAMIC_DEFAULT_BROKER_CONFIG,
    GROUP_CONFIG,
    GROUP_KEYS,
    BrokerConfigLayers,
    broker_configs_problem,
    group_configs_problem,
    warn_unapplied_broker,
)
from kbroker.metadata.image import ConfigResourceType
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from kbroker.storage import validate_topic_name
from kbroker.topic_config import TOPIC_CONFIG_DOCS, TOPIC_CONFIG_KEYS, validate_topic_configs, warn_unapplied
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.alter_configs_request import AlterConfigsRequest
from protocol.messages.alter_configs_response import AlterConfigsResponse
from protocol.messages.describe_configs_request import DescribeConfigsRequest
from protocol.messages.describe_configs_response import DescribeConfigsResponse
from protocol.messages.incremental_alter_configs_request import IncrementalAlterConfigsRequest
from protocol.messages.incremental_alter_configs_response import IncrementalAlterConfigsResponse

if TYPE_CHECKING:
    from kbroker.apis.context import Cluster
    from kbroker.broker import Endpoint

TOPIC = 2
BROKER = 4
BROKER_LOGGER = 8
GROUP = 32

# The ACL resource, and the error and message when it is refused, of each config resource type that has one.
_ACL_RESOURCES: dict[int, tuple[ResourceType, ErrorCode, str]] = {
    TOPIC: (ResourceType.TOPIC, ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed."),
    BROKER: (ResourceType.CLUSTER, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed."),
    BROKER_LOGGER: (ResourceType.CLUSTER, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed."),
    GROUP: (ResourceType.GROUP, ErrorCode.GROUP_AUTHORIZATION_FAILED, "Group authorization failed."),
}


def config_refusal(
    ctx: RequestContext, operation: AclOperation, resource_type: int, name: str
) -> tuple[ErrorCode, str] | None:
    """The error and message if the principal may not do ``operation`` (DESCRIBE_CONFIGS or ALTER_CONFIGS) on a
    config resource; None if it may, or if the type has no ACL resource (answered by the caller as before)."""
    acl = _ACL_RESOURCES.get(resource_type)
    if acl is None:
        return None
    acl_type, code, message = acl
    if ctx.authorize(operation, acl_type, CLUSTER_NAME if acl_type is ResourceType.CLUSTER else name):
        return None
    return code, message


# ConfigSource values (DescribeConfigs v1+).
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

# ConfigType values (DescribeConfigs v3+).
CONFIG_TYPES = {
    "BOOLEAN": 1,
    "STRING": 2,
    "INT": 3,
    "SHORT": 4,
    "LONG": 5,
    "DOUBLE": 6,
    "LIST": 7,
    "CLASS": 8,
    "PASSWORD": 9,
}

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


@dataclass
class ConfigEntry:
    name: str
    value: str | None
    config_source: int
    read_only: bool
    config_type: int
    synonyms: list[tuple[str, str | None, int]] = field(default_factory=list)
    documentation: str | None = None


def broker_layers(ctx: RequestContext) -> BrokerConfigLayers:
    """This broker's settings by source, as the newest metadata image has its dynamic configs."""
    return BrokerConfigLayers.of(ctx.config, ctx.topics.image, ctx.cluster.node_id)


def describe_topic_configs(
    layers: BrokerConfigLayers,
    overrides: dict[str, str],
    include_synonyms: bool,
    keys: list[str] | None = None,
    include_documentation: bool = False,
) -> list[ConfigEntry]:
    """Each topic config as Kafka describes it: the topic's override, else the broker's setting of its synonym
    (dynamic for this broker, dynamic default, static), else the default (the broker's for a kbroker broker
    setting, Kafka's otherwise). Synonyms as Kafka lists them (``BrokerConfigLayers.synonyms``)."""
    entries = []
    for key in TOPIC_CONFIG_KEYS.values():
        if keys is not None and key.name not in keys:
            continue
        synonyms: list[tuple[str, str | None, int]] = []
        if key.name in overrides:
            synonyms.append((key.name, overrides[key.name], DYNAMIC_TOPIC_CONFIG))
        synonym = key.broker_synonym
        broker_key = BROKER_DEFS.get(synonym) if synonym is not None else None
        if broker_key is not None:
            synonyms += layers.synonyms(broker_key.name)
            default = layers.effective.describe_value(broker_key.name)  # derived (log.retention.hours) if unset
        else:
            default = key.default
        value, source = (synonyms[0][1], synonyms[0][2]) if synonyms else (default, DEFAULT_CONFIG)
        entries.append(
            ConfigEntry(
                name=key.name,
                value=value,
                config_source=source,
                read_only=False,
                config_type=CONFIG_TYPES.get(key.type_name, 0),
                synonyms=synonyms if include_synonyms else [],
                documentation=TOPIC_CONFIG_DOCS.get(key.name) if include_documentation else None,
            )
        )
    return entries


def _listener(endpoint: Endpoint) -> str:
    return f"PLAINTEXT://{endpoint.host}:{endpoint.port}"


def _listeners(endpoints: list[tuple[str, Endpoint]]) -> str:
    return ",".join(f"{name}://{endpoint.host}:{endpoint.port}" for name, endpoint in endpoints)


def _broker_entry(
    layers: BrokerConfigLayers, cluster: Cluster, key: ConfigDef
) -> tuple[str | None, int, list[tuple[str, str | None, int]]]:
    """(value, source, synonyms) of one broker setting. Where the broker listens, what it advertises and its
    data directory are reported as they are, however they were given (config file, command line, fixture)."""
    if key.name == "listeners":
        value = _listeners(cluster.listeners) if cluster.listeners else _listener(cluster.listen)
        if value == key.default:
            return value, DEFAULT_CONFIG, [(key.name, value, DEFAULT_CONFIG)]
        return (
            value,
            STATIC_BROKER_CONFIG,
            [(key.name, value, STATIC_BROKER_CONFIG), (key.name, key.default, DEFAULT_CONFIG)],
        )
    if key.name == "advertised.listeners":
        advertised = [(name, cluster.advertised_for(name)) for name, _ in cluster.listeners]
        value = _listeners(advertised) if advertised else _listener(cluster.advertised)
        return value, STATIC_BROKER_CONFIG, [(key.name, value, STATIC_BROKER_CONFIG)]
    if key.name == "log.dirs":
        value = str(cluster.data_dir)
        return value, STATIC_BROKER_CONFIG, [(key.name, value, STATIC_BROKER_CONFIG)]
    synonyms = layers.synonyms(key.name)
    effective = layers.effective
    described: str | None
    if effective.is_default(key.name):
        described = None if key.null_default else key.default
    else:
        described = effective.describe_value(key.name)
    return described, synonyms[0][2] if synonyms else DEFAULT_CONFIG, synonyms


def describe_broker_configs(
    layers: BrokerConfigLayers,
    cluster: Cluster,
    include_synonyms: bool,
    keys: list[str] | None,
    include_documentation: bool = False,
) -> list[ConfigEntry]:
    """Every broker setting kbroker has; those kbroker changes at run time (dynamic broker configs) are not
    read-only. Kafka lists more (UNSUPPORTED.md)."""
    entries = []
    for key in DESCRIBED_BROKER_DEFS.values():
        if keys is not None and key.name not in keys:
            continue
        value, source, synonyms = _broker_entry(layers, cluster, key)
        entries.append(
            ConfigEntry(
                name=key.name,
                value=value,
                config_source=source,
                read_only=key.name not in APPLIED_DYNAMIC_KEYS,
                config_type=CONFIG_TYPES[key.type_name],
                synonyms=synonyms if include_synonyms else [],
                documentation=key.doc if include_documentation else None,
            )
        )
    return entries


def describe_default_broker_configs(
    layers: BrokerConfigLayers, include_synonyms: bool, keys: list[str] | None, include_documentation: bool = False
) -> list[ConfigEntry]:
    """The cluster-wide dynamic default (the BROKER resource ""): only what is set there, as Kafka lists it."""
    entries = []
    for name, value in layers.default.items():
        if keys is not None and name not in keys:
            continue
        key = BROKER_DEFS.get(name)
        entries.append(
            ConfigEntry(
                name=name,
                value=value,
                config_source=DYNAMIC_DEFAULT_BROKER_CONFIG,
                read_only=name not in APPLIED_DYNAMIC_KEYS,
                config_type=CONFIG_TYPES[key.type_name] if key is not None else 0,
                synonyms=layers.synonyms(name, per_broker=False) if include_synonyms else [],
                documentation=key.doc if include_documentation and key is not None else None,
            )
        )
    return entries


def describe_group_configs(
    layers: BrokerConfigLayers,
    configs: Mapping[str, str],
    include_synonyms: bool,
    keys: list[str] | None,
) -> list[ConfigEntry]:
    """The group configs kbroker's consumer group coordinator honours: the group's, else the broker's default."""
    entries = []
    for key in GROUP_KEYS.values():
        if keys is not None and key.name not in keys:
            continue
        synonyms: list[tuple[str, str | None, int]] = []
        if key.name in configs:
            synonyms.append((key.name, configs[key.name], GROUP_CONFIG))
        synonyms += layers.synonyms(key.broker_default)
        entries.append(
            ConfigEntry(
                name=key.name,
                value=synonyms[0][1] if synonyms else None,
                config_source=synonyms[0][2] if synonyms else DEFAULT_CONFIG,
                read_only=False,
                config_type=CONFIG_TYPES["INT"],
                synonyms=synonyms if include_synonyms else [],
            )
        )
    return entries


async def handle_describe_configs(ctx: RequestContext, request: DescribeConfigsRequest) -> DescribeConfigsResponse:
    results = []
    refused = []
    turns = Turns()  # many resources: other connections run as it goes (kbroker/apis/turns.py)
    for resource in request.resources:
        await turns.step()
        result = DescribeConfigsResponse.DescribeConfigsResult(
            error_code=ErrorCode.NONE,
            error_message=None,
            resource_type=resource.resource_type,
            resource_name=resource.resource_name,
            configs=[],
        )
        refusal = config_refusal(ctx, AclOperation.DESCRIBE_CONFIGS, resource.resource_type, resource.resource_name)
        if refusal is not None:
            result.error_code, result.error_message = refusal
            refused.append(result)
            continue
        results.append(result)
        keys = resource.configuration_keys
        if resource.resource_type == TOPIC:
            info = ctx.topics.topic(resource.resource_name)
            name_problem = validate_topic_name(resource.resource_name) if info is None else None
            if name_problem is not None:
                result.error_code = ErrorCode.INVALID_TOPIC_EXCEPTION
                result.error_message = name_problem
                continue
            if info is None:
                result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                result.error_message = f"Topic {resource.resource_name} does not exist."
                continue
            entries = describe_topic_configs(
                broker_layers(ctx), info.configs, request.include_synonyms, keys, request.include_documentation
            )
        elif resource.resource_type == BROKER:
            if resource.resource_name not in ("", str(ctx.cluster.node_id)):
                result.error_code = ErrorCode.INVALID_REQUEST
                result.error_message = f"Unexpected broker id, expected {ctx.cluster.node_id} or empty string"
                continue
            if resource.resource_name == "":
                entries = describe_default_broker_configs(
                    broker_layers(ctx), request.include_synonyms, keys, request.include_documentation
                )
            else:
                entries = describe_broker_configs(
                    broker_layers(ctx), ctx.cluster, request.include_synonyms, keys, request.include_documentation
                )
        elif resource.resource_type == GROUP:
            group_configs = ctx.topics.image.config(ConfigResourceType.GROUP, resource.resource_name)
            entries = describe_group_configs(broker_layers(ctx), group_configs, request.include_synonyms, keys)
        elif resource.resource_type == BROKER_LOGGER:
            entries = []
        else:
            result.error_code = ErrorCode.INVALID_REQUEST
            result.error_message = f"Unsupported resource type {resource.resource_type}"
            continue
        result.configs = [
            DescribeConfigsResponse.DescribeConfigsResourceResult(
                name=e.name,
                value=e.value,
                read_only=e.read_only,
                config_source=e.config_source,
                is_sensitive=False,
                synonyms=[
                    DescribeConfigsResponse.DescribeConfigsSynonym(name=n, value=v, source=s) for n, v, s in e.synonyms
                ],
                config_type=e.config_type,
                documentation=e.documentation,
            )
            for e in entries
        ]
        await turns.step(len(result.configs))
    return DescribeConfigsResponse(throttle_time_ms=0, results=results + refused)


async def _apply_topic_configs(
    ctx: RequestContext, name: str, new_configs: dict[str, str], validate_only: bool
) -> tuple[ErrorCode, str | None]:
    if ctx.topics.topic(name) is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name} does not exist."
    problem = validate_topic_configs(new_configs)
    if problem is not None:
        return ErrorCode.INVALID_CONFIG, problem
    if not validate_only:
        try:
            await ctx.topics.alter_configs(name, new_configs)
        except KafkaError as exc:  # deleted by another request meanwhile
            return exc.code, exc.message
        warn_unapplied(name, new_configs)
    return ErrorCode.NONE, None


_BROKER_LOGGERS = "Broker loggers cannot be changed on kbroker (its logging is configured at start-up)."


def _broker_name_problem(ctx: RequestContext, name: str) -> tuple[ErrorCode, str] | None:
    """Kafka's ConfigAdminManager check of a BROKER resource name: empty (the cluster default) or this node."""
    if name == "":
        return None
    try:
        node = int(name)
    except ValueError:
        return ErrorCode.INVALID_REQUEST, f"Node id must be an integer, but it is: {name}"
    if node != ctx.cluster.node_id:
        return ErrorCode.INVALID_REQUEST, f"Unexpected broker id, expected {ctx.cluster.node_id}, but received {name}"
    return None


def _resource_type(resource_type: int) -> ConfigResourceType:
    return ConfigResourceType.BROKER if resource_type == BROKER else ConfigResourceType.GROUP


async def _replace_dynamic_configs(
    ctx: RequestContext, resource_type: int, name: str, configs: dict[str, str], validate_only: bool
) -> tuple[ErrorCode, str | None]:
    """Validate a BROKER or GROUP resource's configs as they would be and, unless ``validate_only``, make them
    so through the controller (ConfigRecords: set what changed, remove what is gone)."""
    if resource_type == BROKER:
        problem = _broker_name_problem(ctx, name) or broker_configs_problem(configs)
    elif name == "":
        problem = ErrorCode.INVALID_REQUEST, "Default group resources are not allowed."
    else:
        problem = group_configs_problem(ctx.config, configs)
    if problem is not None:
        return problem
    if validate_only:
        return ErrorCode.NONE, None
    kind = _resource_type(resource_type)
    current = ctx.topics.image.config(kind, name)
    changes: dict[str, str | None] = {key: None for key in current if key not in configs}
    changes.update(configs)
    try:
        await ctx.topics.admin.alter_configs(kind, name, changes)
    except KafkaError as exc:
        return exc.code, exc.message
    if resource_type == BROKER:
        warn_unapplied_broker(f"broker {name}" if name else "cluster default", configs)
    return ErrorCode.NONE, None


def _list_changed(current: str, value: str | None, *, append: bool) -> str:
    """A list config after IncrementalAlterConfigs' APPEND (the new items not there yet) or SUBTRACT."""
    items = [v for v in current.split(",") if v]
    changes = [v for v in (value or "").split(",") if v]
    if append:
        return ",".join(items + [v for v in changes if v not in items])
    return ",".join(v for v in items if v not in changes)


def _list_type(resource_type: int, name: str) -> bool | None:
    """Whether a BROKER or GROUP config is a list (APPEND and SUBTRACT apply); None if unknown."""
    if resource_type == BROKER:
        key = BROKER_DEFS.get(name)
        return None if key is None else key.type_name == "LIST"
    return False if name in GROUP_KEYS else None


def _incremental_dynamic(
    current: Mapping[str, str], resource_type: int, ops: list[IncrementalAlterConfigsRequest.AlterableConfig]
) -> tuple[dict[str, str] | None, tuple[ErrorCode, str] | None]:
    """A BROKER or GROUP resource's configs after ``ops``, as Kafka's ConfigAdminManager.prepareIncrementalConfigs
    works them out; or the error refusing them."""
    result = dict(current)
    nulls = [op.name for op in ops if op.config_operation != DELETE and op.value is None]
    if nulls:
        return None, (ErrorCode.INVALID_REQUEST, f"Null value not supported for : {', '.join(nulls)}")
    for op in ops:
        if op.config_operation == SET:
            result[op.name] = op.value or ""
        elif op.config_operation == DELETE:
            result.pop(op.name, None)
        elif op.config_operation in (APPEND, SUBTRACT):
            is_list = _list_type(resource_type, op.name)
            verb = "append" if op.config_operation == APPEND else "subtract"
            if is_list is None:
                return None, (ErrorCode.INVALID_CONFIG, f"Unknown config name: {op.name}")
            if not is_list:
                return None, (ErrorCode.INVALID_CONFIG, f"Config value {verb} is not allowed for config key: {op.name}")
            result[op.name] = _list_changed(result.get(op.name, ""), op.value, append=op.config_operation == APPEND)
        else:
            return None, (ErrorCode.INVALID_REQUEST, f"Unknown operations type {op.config_operation}")
    return result, None


def _alter_refusal(refusal: tuple[ErrorCode, str]) -> tuple[ErrorCode, str | None]:
    """A refused alteration's answer. Kafka 4.4 refuses a broker's configs with an exception carrying the error's
    default message, which its ApiError.fromThrowable now leaves out; a topic's refusal keeps its message."""
    code, message = refusal
    return (code, None) if code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED else (code, message)


REPEATED_RESOURCE = "Each resource must appear at most once."


def _repeated(resources: list[Any]) -> set[tuple[int, str]]:
    """The (type, name) of resources named more than once in one alteration: each of those is refused whole
    (Kafka's ConfigAdminManager.preprocess), before anything else is checked."""
    counts = Counter((resource.resource_type, resource.resource_name) for resource in resources)
    return {key for key, count in counts.items() if count > 1}


async def handle_alter_configs(ctx: RequestContext, request: AlterConfigsRequest) -> AlterConfigsResponse:
    if ctx.topics.controller.forwards_requests:
        return await _replace_through_the_controller(ctx, request)
    responses = []
    message: str | None
    repeated = _repeated(request.resources)
    for resource in request.resources:
        refusal = config_refusal(ctx, AclOperation.ALTER_CONFIGS, resource.resource_type, resource.resource_name)
        if (resource.resource_type, resource.resource_name) in repeated:
            code, message = ErrorCode.INVALID_REQUEST, REPEATED_RESOURCE
        elif refusal is not None and resource.resource_type != BROKER_LOGGER:  # AlterConfigs has no loggers
            code, message = _alter_refusal(refusal)
        elif resource.resource_type == TOPIC:
            # AlterConfigs replaces the whole set of overrides with the given one.
            if any(c.value is None for c in resource.configs):  # a repeated name's earlier null too
                code, message = ErrorCode.INVALID_REQUEST, "Null value not supported"
            else:
                configs = {c.name: c.value for c in resource.configs if c.value is not None}
                code, message = await _apply_topic_configs(ctx, resource.resource_name, configs, request.validate_only)
        elif resource.resource_type in (BROKER, GROUP):
            names = [c.name for c in resource.configs]
            nulls = [c.name for c in resource.configs if c.value is None]
            if len(names) != len(set(names)):
                code, message = ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys"
            elif nulls:
                code, message = ErrorCode.INVALID_REQUEST, f"Null value not supported for : {', '.join(nulls)}"
            else:
                configs = {c.name: c.value for c in resource.configs if c.value is not None}
                code, message = await _replace_dynamic_configs(
                    ctx, resource.resource_type, resource.resource_name, configs, request.validate_only
                )
        elif resource.resource_type == BROKER_LOGGER:
            code, message = ErrorCode.INVALID_REQUEST, f"Unknown resource type {resource.resource_type}"
        else:
            code, message = ErrorCode.INVALID_REQUEST, f"Unsupported resource type {resource.resource_type}"
        responses.append(
            AlterConfigsResponse.AlterConfigsResourceResponse(
                error_code=code,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )
        )
    return AlterConfigsResponse(throttle_time_ms=0, responses=responses)


def _incremental(
    current: dict[str, str], ops: list[IncrementalAlterConfigsRequest.AlterableConfig]
) -> tuple[dict[str, str] | None, str | None]:
    result = dict(current)
    for op in ops:
        key = TOPIC_CONFIG_KEYS.get(op.name)
        if key is None:
            return None, f"Unknown topic config name: {op.name}"
        if op.config_operation == SET:
            if op.value is None:
                return None, f"Null value not supported for {op.name}"
            result[op.name] = op.value
        elif op.config_operation == DELETE:
            result.pop(op.name, None)
        elif op.config_operation in (APPEND, SUBTRACT):
            if key.type_name != "LIST":
                return None, f"Config value append is not allowed for config key: {op.name}"
            result[op.name] = _list_changed(result.get(op.name, ""), op.value, append=op.config_operation == APPEND)
        else:
            return None, f"Unknown config operation {op.config_operation}"
    return result, None


Answer = tuple[ErrorCode, str | None]
CLIENT_METRICS = 16  # a resource type kbroker's controller does not keep, but Kafka's does: forwarded as is


def _preprocessed(
    ctx: RequestContext,
    resource_type: int,
    name: str,
    config_names: list[str],
    nulls: list[str],
    settings: list[tuple[str, str | None]],
    repeated: bool,
) -> Answer | None:
    """What the broker answers itself about one resource before the rest goes to the controller, as Kafka's
    ConfigAdminManager.preprocess (None: forward it): a repeated resource or config, a null value, a BROKER name that
    is not this broker's id; and here also a value kbroker does not have (``settings``: the values being set)."""
    if repeated:
        return ErrorCode.INVALID_REQUEST, REPEATED_RESOURCE
    if len(config_names) != len(set(config_names)):
        return ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys"
    if nulls:
        return ErrorCode.INVALID_REQUEST, f"Null value not supported for : {', '.join(nulls)}"
    if resource_type == BROKER:
        refused = _broker_name_problem(ctx, name)
        if refused is not None:
            return refused
    elif resource_type not in (TOPIC, GROUP, CLIENT_METRICS):
        return ErrorCode.INVALID_REQUEST, f"Unknown resource type {resource_type}"
    return _kbroker_refusal(resource_type, settings)


async def _forward_rest(
    ctx: RequestContext, keys: list[tuple[int, str]], answers: list[Answer | None], rest: Any
) -> list[Answer]:
    """Every resource's answer: the broker's own (``answers``), else the controller's to ``rest``, the request
    made of the others, forwarded with the client's header (Kafka's reassembly matches them by type and name)."""
    from kbroker.apis.forwarded import forward_to_controller

    forwarded: dict[tuple[int, str], Answer] = {}
    if rest.resources:
        answer = await forward_to_controller(ctx, rest)
        forwarded = {
            (r.resource_type, r.resource_name): (ErrorCode(r.error_code), r.error_message) for r in answer.responses
        }
    missing: Answer = (ErrorCode.UNKNOWN_SERVER_ERROR, None)  # a controller that left one out
    return [
        local if local is not None else forwarded.get(key, missing) for key, local in zip(keys, answers, strict=True)
    ]


async def _incremental_through_the_controller(
    ctx: RequestContext, request: IncrementalAlterConfigsRequest
) -> IncrementalAlterConfigsResponse:
    """IncrementalAlterConfigs under a KRaft quorum, as Kafka's broker handles it: what ``_preprocessed`` (and a
    broker logger) answers here, the rest forwarded in one request with the client's header, the answers in the
    request's order."""
    keys = [(resource.resource_type, resource.resource_name) for resource in request.resources]
    repeated = _repeated(request.resources)
    answers: list[Answer | None] = []
    for resource, key in zip(request.resources, keys, strict=True):
        ops = resource.configs
        if resource.resource_type == BROKER_LOGGER and key not in repeated:
            refusal = config_refusal(ctx, AclOperation.ALTER_CONFIGS, BROKER_LOGGER, resource.resource_name)
            answers.append(_alter_refusal(refusal) if refusal else (ErrorCode.INVALID_REQUEST, _BROKER_LOGGERS))
            continue
        nulls = [op.name for op in ops if op.config_operation != DELETE and op.value is None]
        settings = [(op.name, op.value) for op in ops if op.config_operation in (SET, APPEND)]
        names = [op.name for op in ops]
        answers.append(_preprocessed(ctx, *key, names, nulls, settings, key in repeated))
    rest = [resource for resource, answer in zip(request.resources, answers, strict=True) if answer is None]
    final = await _forward_rest(
        ctx, keys, answers, IncrementalAlterConfigsRequest(resources=rest, validate_only=request.validate_only)
    )
    responses = []
    for resource, local, (code, message) in zip(request.resources, answers, final, strict=True):
        if local is None and code == ErrorCode.NONE and resource.resource_type == TOPIC and not request.validate_only:
            warn_unapplied(
                resource.resource_name, {op.name: op.value for op in resource.configs if op.value is not None}
            )
        responses.append(
            IncrementalAlterConfigsResponse.AlterConfigsResourceResponse(
                error_code=code,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )
        )
    return IncrementalAlterConfigsResponse(throttle_time_ms=0, responses=responses)


async def _replace_through_the_controller(ctx: RequestContext, request: AlterConfigsRequest) -> AlterConfigsResponse:
    """AlterConfigs under a KRaft quorum, as ``_incremental_through_the_controller`` (AlterConfigs has no broker
    loggers: Kafka answers that type as unknown)."""
    keys = [(resource.resource_type, resource.resource_name) for resource in request.resources]
    repeated = _repeated(request.resources)
    answers: list[Answer | None] = []
    for resource, key in zip(request.resources, keys, strict=True):
        settings = [(config.name, config.value) for config in resource.configs]
        nulls = [name for name, value in settings if value is None]
        answers.append(_preprocessed(ctx, *key, [name for name, _ in settings], nulls, settings, key in repeated))
    rest = [resource for resource, answer in zip(request.resources, answers, strict=True) if answer is None]
    final = await _forward_rest(
        ctx, keys, answers, AlterConfigsRequest(resources=rest, validate_only=request.validate_only)
    )
    responses = []
    for resource, local, (code, message) in zip(request.resources, answers, final, strict=True):
        if local is None and code == ErrorCode.NONE and resource.resource_type == TOPIC and not request.validate_only:
            warn_unapplied(resource.resource_name, {c.name: c.value for c in resource.configs if c.value is not None})
        responses.append(
            AlterConfigsResponse.AlterConfigsResourceResponse(
                error_code=code,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )
        )
    return AlterConfigsResponse(throttle_time_ms=0, responses=responses)


def _kbroker_refusal(resource_type: int, settings: list[tuple[str, str | None]]) -> tuple[ErrorCode, str] | None:
    """A value kbroker refuses (a feature it does not have) among configs being set; Kafka's own checks of names
    and values are the controller's."""
    keys = TOPIC_CONFIG_KEYS if resource_type == TOPIC else BROKER_DEFS
    for name, value in settings:
        key = keys.get(name)
        if key is None or value is None:
            continue
        try:
            refused = problem_with(key, key.parse(value))
        except ConfigError:
            continue  # the controller words its own refusal
        if refused is not None:
            return ErrorCode.INVALID_CONFIG, f"Invalid value {value} for configuration {name}: {refused}"
    return None


async def _incremental_dynamic_resource(
    ctx: RequestContext, resource: IncrementalAlterConfigsRequest.AlterConfigsResource, validate_only: bool
) -> tuple[ErrorCode, str | None]:
    """IncrementalAlterConfigs of one BROKER or GROUP resource."""
    name = resource.resource_name
    if resource.resource_type == BROKER:
        refused = _broker_name_problem(ctx, name)
        if refused is not None:
            return refused
    current = ctx.topics.image.config(_resource_type(resource.resource_type), name)
    merged, problem = _incremental_dynamic(current, resource.resource_type, resource.configs)
    if merged is None:
        assert problem is not None
        return problem
    return await _replace_dynamic_configs(ctx, resource.resource_type, name, merged, validate_only)


async def handle_incremental_alter_configs(
    ctx: RequestContext, request: IncrementalAlterConfigsRequest
) -> IncrementalAlterConfigsResponse:
    if ctx.topics.controller.forwards_requests:
        return await _incremental_through_the_controller(ctx, request)
    responses = []
    message: str | None
    repeated = _repeated(request.resources)
    for resource in request.resources:
        names = [op.name for op in resource.configs]
        refusal = config_refusal(ctx, AclOperation.ALTER_CONFIGS, resource.resource_type, resource.resource_name)
        if (resource.resource_type, resource.resource_name) in repeated:
            code, message = ErrorCode.INVALID_REQUEST, REPEATED_RESOURCE
        elif len(names) != len(set(names)):
            code, message = ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys"
        elif refusal is not None:
            code, message = _alter_refusal(refusal)
        elif resource.resource_type == TOPIC:
            info = ctx.topics.topic(resource.resource_name)
            if info is None:
                code, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {resource.resource_name} does not exist."
            else:
                merged, problem = _incremental(info.configs, resource.configs)
                if merged is None:
                    code, message = ErrorCode.INVALID_CONFIG, problem
                else:
                    code, message = await _apply_topic_configs(
                        ctx, resource.resource_name, merged, request.validate_only
                    )
        elif resource.resource_type in (BROKER, GROUP):
            code, message = await _incremental_dynamic_resource(ctx, resource, request.validate_only)
        elif resource.resource_type == BROKER_LOGGER:
            code, message = ErrorCode.INVALID_REQUEST, _BROKER_LOGGERS
        else:
            code, message = ErrorCode.INVALID_REQUEST, f"Unsupported resource type {resource.resource_type}"
        responses.append(
            IncrementalAlterConfigsResponse.AlterConfigsResourceResponse(
                error_code=code,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )
        )
    return IncrementalAlterConfigsResponse(throttle_time_ms=0, responses=responses)
