"""What a broker image check costs (``metadata.image.check.interval.ms``), in CPU seconds.

Each check computes one image checksum on the broker and, unless another broker asked at the
same offset, one on the controller (``MetadataImage.checksum``, checksum version 2: per-topic
digests cached on the topic objects images share). For each image shape (topics x partitions,
RF 3 over 30 brokers) it measures, median of ``--repeat`` runs:

* ``fresh`` — the first checksum of a just-loaded image (nothing cached: every topic digested);
* ``after_100_changes`` — the checksum of the image one batch of 100 partition changes after
  one whose checksum is known (the steady state of a busy cluster: one check per interval);
* ``idle`` — the same image asked again (a quiet cluster: the cached value).

``python -m bench.image_check_bench [--shape 1000x100 --shape 100000x1]`` prints a markdown
table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from bench.hotpaths_bench import _cpu, build_image, change_batches


def measure(topics: int, partitions: int, repeat: int) -> dict[str, Any]:
    from kraft.metadata.delta import MetadataDelta
    from kraft.records import decode_batch

    fresh, after, idle = [], [], []
    for _ in range(repeat):
        image = build_image(topics, partitions, 30)
        _, s = _cpu(image.checksum)
        fresh.append(s)
        delta = MetadataDelta(image)
        delta.replay_batch(decode_batch(change_batches(image, 1)[0]))
        changed = delta.apply()
        _, s = _cpu(changed.checksum)
        after.append(s)
        _, s = _cpu(changed.checksum)
        idle.append(s)
    return {
        "topics": topics,
        "partitions": topics * partitions,
        "fresh_cpu_s": round(statistics.median(fresh), 4),
        "after_100_changes_cpu_s": round(statistics.median(after), 4),
        "idle_cpu_s": round(statistics.median(idle), 6),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shape", action="append", help="TOPICSxPARTITIONS (repeatable)")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    shapes = a.shape or ["1000x100", "100000x1"]
    rows = []
    for shape in shapes:
        t, p = (int(x) for x in shape.lower().split("x"))
        rows.append(measure(t, p, a.repeat))
    print("| topics | partitions | fresh CPU s | after 100 changes CPU s | idle CPU s |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['topics']:,} | {r['partitions']:,} | {r['fresh_cpu_s']} | "
            f"{r['after_100_changes_cpu_s']} | {r['idle_cpu_s']} |"
        )
    print(json.dumps({"system": "pykraft", "bench": "image_check", "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
