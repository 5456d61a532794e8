"""``kraft topics delete-records``: move a partition's log start offset up (Kafka's
DeleteRecords), sent to the partition leader's Kafka listener.

The leader and its listener come from the controllers (DescribeTopics, DescribeCluster); the
request is Kafka's DeleteRecords v1 over a plain TCP connection (a PLAINTEXT listener).
"""

from __future__ import annotations

import argparse
import io
import socket
import struct
import sys
from datetime import timedelta
from typing import Any

from kio.schema.delete_records.v1.request import (
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
)
from kio.schema.delete_records.v1.response import DeleteRecordsResponse
from kio.schema.errors import ErrorCode as KafkaError
from kio.schema.types import TopicName
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32, i32Timedelta, i64

from kraft.errors import ErrorCode, KraftError
from tools import output
from tools.commands.common import ManualFormatter, add_client_options, call, print_json

API_DELETE_RECORDS, VERSION = 21, 1


def _leader_endpoint(args: argparse.Namespace) -> tuple[int, str, int]:
    """(leader id, host, port) of ``args.topic``-``args.partition``; KraftError if none."""
    (topic,) = call(args, "DescribeTopics", {"names": [args.topic]})["topics"]
    if topic.get("error_code"):
        raise KraftError(ErrorCode(topic["error_code"]), topic.get("error_message") or "")
    part = next((p for p in topic["partitions"] if p["partition"] == args.partition), None)
    if part is None:
        raise KraftError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"Topic '{args.topic}' has no partition {args.partition}.",
        )
    if part["leader"] < 0:
        raise KraftError(
            ErrorCode.LEADER_NOT_AVAILABLE, f"{args.topic}-{args.partition} has no leader."
        )
    brokers = call(args, "DescribeCluster", {})["brokers"]
    broker = next((b for b in brokers if b["broker_id"] == part["leader"]), None)
    if broker is None or not broker["listeners"]:
        raise KraftError(
            ErrorCode.LEADER_NOT_AVAILABLE, f"Leader {part['leader']} has no listener."
        )
    endpoint = broker["listeners"][0]
    return part["leader"], endpoint["host"], int(endpoint["port"])


def delete_records(
    host: str, port: int, topic: str, partition: int, offset: int, timeout: float
) -> tuple[int, int]:
    """Send DeleteRecords for one partition; (Kafka error code, low watermark)."""
    req = DeleteRecordsRequest(
        topics=(
            DeleteRecordsTopic(
                name=TopicName(topic),
                partitions=(
                    DeleteRecordsPartition(partition_index=i32(partition), offset=i64(offset)),
                ),
            ),
        ),
        timeout=i32Timedelta.parse(timedelta(seconds=timeout)),
    )
    body = io.BytesIO()
    entity_writer(DeleteRecordsRequest)(body, req)
    client = b"kraft-cli"
    head = struct.pack(">hhih", API_DELETE_RECORDS, VERSION, 1, len(client)) + client
    frame = head + body.getvalue()
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
            chunk = sock.recv(65536)
            if not chunk:
                raise KraftError(
                    ErrorCode.NETWORK_EXCEPTION, f"{host}:{port} closed the connection"
                )
            buf += chunk
    resp, _ = entity_reader(DeleteRecordsResponse)(buf, 8)
    result = resp.topics[0].partitions[0]
    return int(result.error_code.value), int(result.low_watermark)


def cmd_delete_records(args: argparse.Namespace) -> int:
    leader, host, port = _leader_endpoint(args)
    try:
        code, low = delete_records(
            host, port, args.topic, args.partition, args.offset, args.timeout
        )
    except OSError as e:
        raise KraftError(
            ErrorCode.NETWORK_EXCEPTION, f"broker {leader} at {host}:{port}: {e}"
        ) from None
    name = KafkaError(code).name.upper()
    if args.json:
        print_json(
            {
                "topic": args.topic,
                "partition": args.partition,
                "leader": leader,
                "low_watermark": low,
                "error_code": code,
                "error": name if code else None,
            }
        )
    elif code:
        print(f"Error: {name}: {args.topic}-{args.partition} offset {args.offset}", file=sys.stderr)
    else:
        print(f"{args.topic}-{args.partition}: log start offset is now {low}.")
    return output.EXIT_ERROR if code else output.EXIT_OK


def register(tsub: Any) -> None:
    """Add ``kraft topics delete-records``."""
    dr = tsub.add_parser(
        "delete-records",
        help="delete a partition's records below an offset",
        formatter_class=ManualFormatter,
        description="Move the log start offset of one partition up to OFFSET (Kafka's "
        "DeleteRecords, answered by the partition leader): records below it can no longer be "
        "read, and whole segments below it are deleted. OFFSET -1 means the high watermark; "
        "an offset above the high watermark fails with OFFSET_OUT_OF_RANGE.",
        epilog="example:\n  kraft topics delete-records --topic orders --partition 0 --offset 1000 "
        "--cluster ./c",
    )
    dr.add_argument("--topic", required=True, metavar="NAME", help="topic name")
    dr.add_argument("--partition", required=True, type=int, metavar="P", help="partition id")
    dr.add_argument("--offset", required=True, type=int, metavar="N", help="new log start offset")
    add_client_options(dr)
    dr.set_defaults(handler=cmd_delete_records)
