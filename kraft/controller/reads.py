"""Read-only APIs answered from an image: ListTopics, DescribeTopics, DescribeConfigs,
DescribeCluster. Every response carries ``offset``, the image offset it reflects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kraft.controller.commands import error_fields
from kraft.controller.config_control import describe_resource, resolve_resource
from kraft.controller.settings import ControllerSettings
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.image import MetadataImage, TopicImage
from kraft.records import RESOURCE_TOPIC


def list_topics(
    image: MetadataImage, body: dict[str, Any], settings: ControllerSettings
) -> dict[str, Any]:
    topics = []
    for name in sorted(image.topics_by_name):
        topic = image.topics_by_id[image.topics_by_name[name]]
        topics.append(
            {"name": name, "topic_id": topic.topic_id, "partitions": len(topic.partitions)}
        )
    return {"offset": image.offset, "topics": topics}


def describe_topic(image: MetadataImage, topic: TopicImage) -> dict[str, Any]:
    """One topic: id, dynamic configs and every partition's registration."""
    partitions = []
    for pid in sorted(topic.partitions):
        p = topic.partitions[pid]
        partitions.append(
            {
                "partition": pid,
                "leader": p.leader,
                "leader_epoch": p.leader_epoch,
                "partition_epoch": p.partition_epoch,
                "replicas": list(p.replicas),
                "isr": list(p.isr),
                "removing_replicas": list(p.removing_replicas),
                "adding_replicas": list(p.adding_replicas),
                "leader_recovery_state": p.leader_recovery_state,
            }
        )
    configs = image.config(RESOURCE_TOPIC, topic.name)
    return {
        "name": topic.name,
        "topic_id": topic.topic_id,
        **error_fields(),
        "configs": {k: configs[k] for k in sorted(configs)},
        "partitions": partitions,
    }


def describe_topics(
    image: MetadataImage, body: dict[str, Any], settings: ControllerSettings
) -> dict[str, Any]:
    names = body.get("names")
    if names is None:
        names = sorted(image.topics_by_name)
    out = []
    for name in names:
        topic = image.topic(name) if isinstance(name, str) else None
        if topic is None:
            error = KraftError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic '{name}' does not exist."
            )
            out.append(
                {
                    "name": name if isinstance(name, str) else "",
                    "topic_id": "",
                    **error_fields(error),
                    "configs": {},
                    "partitions": [],
                }
            )
        else:
            out.append(describe_topic(image, topic))
    return {"offset": image.offset, "topics": out}


def describe_configs(
    image: MetadataImage, body: dict[str, Any], settings: ControllerSettings
) -> dict[str, Any]:
    out = []
    for resource in body["resources"]:
        rtype = resource.get("resource_type") if isinstance(resource, dict) else None
        rname = resource.get("resource_name") if isinstance(resource, dict) else None
        shown = {
            "resource_type": rtype if isinstance(rtype, str) else "",
            "resource_name": rname if isinstance(rname, str) else "",
        }
        try:
            type_id, name = resolve_resource(image, rtype, rname)
        except KraftError as e:
            out.append({**shown, **error_fields(e), "configs": []})
            continue
        out.append(
            {
                **shown,
                **error_fields(),
                "configs": describe_resource(image, settings, type_id, name),
            }
        )
    return {"offset": image.offset, "resources": out}


def _broker_state(fenced: bool, in_controlled_shutdown: bool) -> str:
    if fenced:
        return "fenced"
    return "controlled-shutdown" if in_controlled_shutdown else "unfenced"


def describe_cluster(
    image: MetadataImage, body: dict[str, Any], settings: ControllerSettings
) -> dict[str, Any]:
    brokers = []
    for broker_id in sorted(image.brokers):
        b = image.brokers[broker_id]
        brokers.append(
            {
                "broker_id": broker_id,
                "epoch": b.epoch,
                "incarnation_id": b.incarnation_id,
                "rack": b.rack,
                "fenced": b.fenced,
                "in_controlled_shutdown": b.in_controlled_shutdown,
                "listeners": [dict(e) for e in b.endpoints],
                "state": _broker_state(b.fenced, b.in_controlled_shutdown),
            }
        )
    return {
        "offset": image.offset,
        "cluster_id": settings.cluster_id,
        "controller_id": image.controller_id,
        "brokers": brokers,
    }


READS: dict[str, Callable[[MetadataImage, dict[str, Any], ControllerSettings], dict[str, Any]]] = {
    "ListTopics": list_topics,
    "DescribeTopics": describe_topics,
    "DescribeConfigs": describe_configs,
    "DescribeCluster": describe_cluster,
}
