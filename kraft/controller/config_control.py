"""Dynamic configs (Kafka's ConfigurationControlManager): IncrementalAlterConfigs and the
effective configs DescribeConfigs shows.

Resources: a topic (must exist) or a broker (a registered id, or "" for the cluster-wide
default). Ops: SET, DELETE, APPEND and SUBTRACT (list-typed keys only). Each changed key becomes
one ConfigRecord (value None = deleted); keys whose value does not change write nothing. A
resource with any bad op changes nothing; the records of good resources form one batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kraft.controller.commands import Command, ControllerResult, error_fields
from kraft.controller.configs import (
    RESOURCE_TYPES,
    config_defs,
    join_list,
    lookup,
    split_list,
    static_default,
    validate_value,
)
from kraft.controller.settings import ControllerSettings
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.image import MetadataImage
from kraft.records import RESOURCE_BROKER, RESOURCE_TOPIC, ConfigRecord

OPS = ("SET", "DELETE", "APPEND", "SUBTRACT")


def resolve_resource(
    image: MetadataImage, resource_type: Any, resource_name: Any
) -> tuple[int, str]:
    """(record resource type, name) of an existing resource, or raise the Kafka error."""
    type_id = RESOURCE_TYPES.get(resource_type) if isinstance(resource_type, str) else None
    if type_id is None:
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            f"resource_type must be 'topic' or 'broker', got {resource_type!r}.",
        )
    if not isinstance(resource_name, str):
        raise KraftError(ErrorCode.INVALID_REQUEST, "resource_name must be a string.")
    if type_id == RESOURCE_TOPIC:
        if resource_name not in image.topics_by_name:
            raise KraftError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic '{resource_name}' does not exist."
            )
    elif resource_name != "":
        if not (resource_name.isdigit() and str(int(resource_name)) == resource_name):
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f'A broker resource name must be a broker id or "" (cluster default), got {resource_name!r}.',
            )
        if int(resource_name) not in image.brokers:
            raise KraftError(
                ErrorCode.BROKER_ID_NOT_REGISTERED, f"Broker {resource_name} is not registered."
            )
    return type_id, resource_name


def default_value(
    image: MetadataImage, settings: ControllerSettings, type_id: int, name: str, key: str
) -> str:
    """What a key is when the resource does not set it: a topic key's broker synonym set on the
    cluster default, a broker key set on the cluster default, else the built-in default."""
    d = config_defs(type_id)[key]
    cluster = image.config(RESOURCE_BROKER, "")
    if type_id == RESOURCE_TOPIC and d.synonym is not None and d.synonym in cluster:
        return cluster[d.synonym]
    if type_id == RESOURCE_BROKER and name != "" and key in cluster:
        return cluster[key]
    return static_default(d, settings.unclean_leader_election_enable)


def _new_value(
    image: MetadataImage,
    settings: ControllerSettings,
    type_id: int,
    name: str,
    current: Mapping[str, str],
    op: Mapping[str, Any],
) -> tuple[str, str | None]:
    """(key, new value or None to delete) for one op; raises INVALID_CONFIG / INVALID_REQUEST."""
    key, kind, value = op.get("name"), op.get("op"), op.get("value")
    if not isinstance(key, str):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"A config op needs a name, got {key!r}.")
    d = lookup(type_id, key)
    if kind not in OPS:
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            f"Unknown op {kind!r} for {key}: use one of {', '.join(OPS)}.",
        )
    if kind == "DELETE":
        return key, None
    if value is None:
        raise KraftError(ErrorCode.INVALID_CONFIG, f"A {kind} of {key} needs a value.")
    if kind == "SET":
        return key, validate_value(type_id, key, value)
    if not d.is_list:
        raise KraftError(
            ErrorCode.INVALID_CONFIG, f"Can't {kind} to key {key} because its type is not LIST."
        )
    if not isinstance(value, str):
        raise KraftError(
            ErrorCode.INVALID_CONFIG, f"The value of a {kind} of {key} must be a string."
        )
    base = current.get(key)
    items = split_list(
        base if base is not None else default_value(image, settings, type_id, name, key)
    )
    given = split_list(value)
    if kind == "APPEND":
        items += [i for i in given if i not in items]
    else:
        items = [i for i in items if i not in given]
    return key, validate_value(type_id, key, join_list(items))


def _alter_resource(
    image: MetadataImage, settings: ControllerSettings, resource: Any, replace: bool = False
) -> list[ConfigRecord]:
    if not isinstance(resource, dict):
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            "Each resource must be a map {resource_type, resource_name, ops}.",
        )
    type_id, name = resolve_resource(
        image, resource.get("resource_type"), resource.get("resource_name")
    )
    ops = resource.get("ops")
    if not isinstance(ops, (list, tuple)) or not all(isinstance(op, dict) for op in ops):
        raise KraftError(
            ErrorCode.INVALID_REQUEST, "ops must be a list of maps {name, op, value?}."
        )
    keys = [op.get("name") for op in ops]
    repeated = sorted({k for k in keys if isinstance(k, str) and keys.count(k) > 1})
    if repeated:
        raise KraftError(
            ErrorCode.INVALID_REQUEST, f"Error due to duplicate config keys: {', '.join(repeated)}."
        )
    current = image.config(type_id, name)
    if replace:  # legacy AlterConfigs: SETs only; every other dynamic key is deleted
        if any(op.get("op") != "SET" for op in ops):
            raise KraftError(ErrorCode.INVALID_REQUEST, "AlterConfigs takes SET ops only.")
        ops = [*ops, *({"name": k, "op": "DELETE"} for k in sorted(current) if k not in keys)]
    changes: dict[str, str | None] = {}
    for op in ops:
        key, value = _new_value(image, settings, type_id, name, current, op)
        changes[key] = value
    return [
        ConfigRecord(type_id, name, key, changes[key])
        for key in sorted(changes)
        if changes[key] != current.get(key)
    ]


def _resource_id(resource: Any) -> tuple[Any, Any]:
    if not isinstance(resource, dict):
        return None, None
    return resource.get("resource_type"), resource.get("resource_name")


def alter_configs(
    image: MetadataImage, cmd: Command, settings: ControllerSettings
) -> ControllerResult:
    """Legacy AlterConfigs (docs/kraft-notes.md, Alter configs): each resource's dynamic configs are replaced by the given
    set (keys not given are deleted); otherwise as IncrementalAlterConfigs."""
    return incremental_alter_configs(image, cmd, settings, replace=True)


def incremental_alter_configs(
    image: MetadataImage, cmd: Command, settings: ControllerSettings, replace: bool = False
) -> ControllerResult:
    """IncrementalAlterConfigs (docs/kraft-notes.md, Alter configs): per-resource results; one batch of ConfigRecords."""
    resources = list(cmd.body["resources"])
    ids = [_resource_id(r) for r in resources]
    records: list[ConfigRecord] = []
    results: list[dict[str, Any]] = []
    for resource, (rtype, rname) in zip(resources, ids):
        shown = {
            "resource_type": rtype if isinstance(rtype, str) else "",
            "resource_name": rname if isinstance(rname, str) else "",
        }
        try:
            if rtype is not None and ids.count((rtype, rname)) > 1:
                raise KraftError(
                    ErrorCode.INVALID_REQUEST,
                    f"Resource {rtype} {rname!r} is listed more than once.",
                )
            resource_records = _alter_resource(image, settings, resource, replace)
        except KraftError as e:
            results.append({**shown, **error_fields(e)})
            continue
        records.extend(resource_records)
        results.append({**shown, **error_fields()})
    if len(records) > settings.max_records_per_batch:
        error = KraftError(
            ErrorCode.POLICY_VIOLATION,
            f"The request needs {len(records)} records, more than the "
            f"{settings.max_records_per_batch} allowed in one atomic batch.",
        )
        records = []
        results = [r if r["error_code"] else {**r, **error_fields(error)} for r in results]
    if cmd.body.get("validate_only"):
        records = []
    return ControllerResult(list(records), {"resources": results}, "user-request")


def describe_resource(
    image: MetadataImage, settings: ControllerSettings, type_id: int, name: str
) -> list[dict[str, Any]]:
    """Every known key of a resource with its value and source ('dynamic' when set on the
    resource itself, else 'default'), sorted by key."""
    dynamic = image.config(type_id, name)
    out = []
    for key in sorted(config_defs(type_id)):
        if key in dynamic:
            value, source = dynamic[key], "dynamic"
        else:
            value, source = default_value(image, settings, type_id, name, key), "default"
        out.append(
            {"name": key, "value": value, "source": source, "read_only": False, "sensitive": False}
        )
    return out
