"""Cost curves (issue 24 item 5): what one commit costs the controller's state machine and what
one record costs a broker's replay, at images of 10k, 100k, 1M and 2M partitions. They must be
flat (within 20% of the smallest image's figure); growth points at work proportional to the
image where it should be proportional to the change.

Measured in CPU seconds of this process (``time.process_time``), so the figures hold on a loaded
machine. For each image (``hotpaths_bench.build_image``: N topics x 100 partitions, RF 3 over 60
brokers):

* ``create_topic_us``: ``QuorumStateMachine.propose`` of a CreateTopics of one 10-partition
  topic (placement, validation, records, encoding, the replay into the speculative image), per
  commit, over ``--commits`` commits;
* ``alter_config_us``: the same for an IncrementalAlterConfigs of one topic's retention.ms;
* ``replay_us_per_record``: a broker's replay of ``--batches`` batches of 100 ISR changes, one
  delta per batch (decode, hash check, replay, apply), per record; the batches visit every
  topic round-robin, so at 1M-2M partitions each touches topics the CPU caches no longer hold;
* ``replay_hot_us_per_record``: the same replay with every change on the first 100 topics (a
  working set that stays in the caches at any size): the replay's own work, without the
  memory latency of a large image. Not a target; it tells the two causes of growth apart.

The Raft round and the network are not in these figures: they do not depend on the image
(``controller_bench`` measures them). ``python -m bench.cost_curves_bench`` prints a markdown
table and, as the last line, a JSON document.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable
from typing import Any

from bench.common import logger
from bench.hotpaths_bench import build_image, change_batches, replay_one_delta_per_batch

log = logger("cost curves")

SIZES = (100, 1_000, 10_000, 20_000)  # topics of 100 partitions: 10k, 100k, 1M, 2M partitions
FLAT = 1.2  # the largest image's cost at most 20% above the smallest's


def _cpu(fn: Callable[[], Any]) -> float:
    gc.collect()
    start = time.process_time()
    fn()
    return time.process_time() - start


def measure(topics: int, commits: int, batches: int) -> dict[str, Any]:
    from kraft.controller.commands import Command
    from kraft.controller.settings import ControllerSettings
    from kraft.controller.state_machine import QuorumStateMachine

    log(f"building an image of {topics} x 100 partitions")
    image = build_image(topics, 100, 60)
    gc.freeze()  # as controllers and brokers keep their images (kraft/heap.py): out of GC's reach
    sm = QuorumStateMachine(ControllerSettings(cluster_id="bench"), image)
    n = 0

    def propose(api: str, body: dict[str, Any]) -> None:
        nonlocal n
        n += 1
        command = Command(api=api, body=body, request_id=f"b{n}", timestamp_ms=n, seed=n)
        batch, response, _ = sm.propose(command, 1)
        if batch is None:
            raise RuntimeError(f"{api} wrote nothing: {response}")

    def creates() -> None:
        for i in range(commits):
            topic = {"name": f"curve-{i:05d}", "num_partitions": 10, "replication_factor": 3}
            propose("CreateTopics", {"topics": [topic]})

    def alters() -> None:
        for i in range(commits):
            op = {"name": "retention.ms", "op": "SET", "value": str(60_000 + i)}
            resource = {"resource_type": "topic", "resource_name": f"topic-{i % topics:05d}"}
            propose("IncrementalAlterConfigs", {"resources": [{**resource, "ops": [op]}]})

    create_s = _cpu(creates)
    alter_s = _cpu(alters)
    encoded = change_batches(image, batches)

    replay_s = _cpu(lambda: replay_one_delta_per_batch(image, encoded))
    hot = change_batches(image, batches, topic_ids=sorted(image.topics_by_id)[:100])
    replay_hot_s = _cpu(lambda: replay_one_delta_per_batch(image, hot))
    row = {
        "partitions": topics * 100,
        "create_topic_us": round(create_s / commits * 1e6, 1),
        "alter_config_us": round(alter_s / commits * 1e6, 1),
        "replay_us_per_record": round(replay_s / (100 * batches) * 1e6, 2),
        "replay_hot_us_per_record": round(replay_hot_s / (100 * batches) * 1e6, 2),
    }
    log(f"  {row}")
    gc.unfreeze()
    return row


METRICS = ("create_topic_us", "alter_config_us", "replay_us_per_record")


def flatness(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per metric: the largest image's figure over the smallest's, and whether it is flat."""
    out = {}
    for m in METRICS:
        ratio = rows[-1][m] / rows[0][m] if rows[0][m] else None
        out[m] = {
            "ratio": round(ratio, 2) if ratio else None,
            "flat": bool(ratio and ratio <= FLAT),
        }
    return out


def table(rows: list[dict[str, Any]], flat: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| partitions | CreateTopics (10 partitions) CPU us/commit | IncrementalAlterConfigs "
        "CPU us/commit | broker replay CPU us/record | same, 100 topics only (hot) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['partitions']:,} | {r['create_topic_us']} | {r['alter_config_us']} | "
            f"{r['replay_us_per_record']} | {r['replay_hot_us_per_record']} |"
        )
    hot = rows[-1]["replay_hot_us_per_record"] / rows[0]["replay_hot_us_per_record"]
    lines.append(
        "| largest / smallest (flat: <= 1.2) | "
        + " | ".join(
            f"{flat[m]['ratio']} ({'flat' if flat[m]['flat'] else 'GROWS'})" for m in METRICS
        )
        + f" | {hot:.2f} (not a target) |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--topics",
        type=int,
        nargs="+",
        default=list(SIZES),
        help="image sizes, in topics of 100 partitions (default: 100 1000 10000 20000)",
    )
    ap.add_argument("--commits", type=int, default=200, help="commits measured per image")
    ap.add_argument("--batches", type=int, default=200, help="100-record batches replayed")
    a = ap.parse_args(argv)
    rows = [measure(t, a.commits, a.batches) for t in sorted(a.topics)]
    flat = flatness(rows)
    print(table(rows, flat))
    print(json.dumps({"system": "pykraft", "bench": "cost_curves", "rows": rows, "flat": flat}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
