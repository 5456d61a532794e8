"""Unit tests for the audit's pure parts: the Arrow decoder, segment planning, state replay
against snapshots, time/offset parsing and the report (no SparkSession needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from kraft.log.metadata_log import MetadataLog
from kraft.log.segment import iter_frames, list_segments
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.records import (
    FENCE,
    LEADER_UNCHANGED,
    RECOVERY_UNCHANGED,
    ZERO_HASH,
    Batch,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    PartitionChangeRecord,
    PartitionRecord,
    Provenance,
    RegisterBrokerRecord,
    TopicRecord,
    batch_hash,
    record_to_json,
)
from kraft.snapshotter import image_to_snapshot
from tools.audit import report, state
from tools.audit.columns import ARROW_SCHEMA, decode_segment, decode_snapshot
from tools.audit.datasource import KraftMetadataReader, segment_ranges
from tools.commands.audit_cmd import parse_point
from tools.commands.common import UsageError

TID = "3f0c6b7e-1c9a-4d2e-9a35-0d1e2f3a4b5c"
FEATURES = ({"name": "metadata.version", "min_version": 1, "max_version": 2},)


def _register(b: int) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(
        b, f"00000000-0000-4000-8000-00000000000{b % 10}", b, (), FEATURES, "r1", False, False
    )


def _records() -> list[tuple[Provenance, tuple]]:
    user = Provenance("User:alice", "cli", "r1", "CreateTopics", "user-request")
    ctl = Provenance("controller", "", "", "FenceBroker", "session-timeout")
    batches = [
        (
            Provenance("User:b", "b", "x", "BrokerRegistration", "broker-registration"),
            (_register(1), _register(2)),
        )
    ]
    batches.append(
        (
            user,
            (
                TopicRecord("t", TID),
                ConfigRecord(2, "t", "retention.ms", "5"),
                PartitionRecord(0, TID, (1, 2), (1, 2), (), (), 1, 0, 0, 0),
            ),
        )
    )
    for i in range(20):
        batches.append(
            (
                ctl,
                (
                    PartitionChangeRecord(
                        0,
                        TID,
                        (2,) if i % 2 == 0 else (1, 2),
                        2 if i % 2 == 0 else LEADER_UNCHANGED,
                        None,
                        None,
                        None,
                        RECOVERY_UNCHANGED,
                        "clean" if i % 2 == 0 else None,
                    ),
                ),
            )
        )
    batches.append((ctl, (BrokerRegistrationChangeRecord(1, 1, FENCE, 0),)))
    return batches


def _write_log(directory: Path, segment_bytes: int = 600) -> list[Batch]:
    out, prev, offset = [], ZERO_HASH, 0
    with MetadataLog.open(directory, segment_bytes=segment_bytes, fsync="never") as mlog:
        for i, (prov, recs) in enumerate(_records()):
            batch = Batch(
                offset, 1 + i // 10, i + 1, 1_700_000_000_000 + i * 1000, prov, prev, recs
            )
            mlog.append(batch)
            prev, offset = batch_hash(batch.encode()), batch.next_offset
            out.append(batch)
    return out


@pytest.fixture
def log(tmp_path) -> tuple[Path, list[Batch]]:
    d = tmp_path / "log"
    return d, _write_log(d)


def _rows(paths, **kw) -> list[dict]:
    rows = []
    for p in paths:
        for rb in decode_segment(p, **kw):
            assert rb.schema == ARROW_SCHEMA
            rows.extend(rb.to_pylist())
    return rows


def test_decoder_gives_one_row_per_record_with_typed_columns_and_json(log):
    d, batches = log
    assert len(list_segments(d)) > 2
    rows = _rows(list_segments(d))
    expected = [(b, i, r) for b in batches for i, r in enumerate(b.records)]
    assert [r["offset"] for r in rows] == list(range(len(expected)))
    for row, (b, i, rec) in zip(rows, expected):
        assert (row["batch_base_offset"], row["index_in_batch"], row["term"]) == (
            b.base_offset,
            i,
            b.term,
        )
        assert (row["principal"], row["api"], row["reason"]) == (
            b.provenance.principal,
            b.provenance.api,
            b.provenance.reason,
        )
        assert (
            row["prev_hash"] == b.prev_hash.hex()
            and row["batch_hash"] == batch_hash(b.encode()).hex()
        )
        assert row["crc_ok"] and row["problem"] is None
        assert row["record_type"] == rec.NAME and json.loads(row["record_json"]) == record_to_json(
            rec
        )
    topic = next(r for r in rows if r["record_type"] == "TopicRecord")
    assert (topic["topic_name"], topic["topic_id"]) == ("t", TID)
    cfg = next(r for r in rows if r["record_type"] == "ConfigRecord")
    assert (cfg["config_name"], cfg["config_value"], cfg["resource_name"]) == (
        "retention.ms",
        "5",
        "t",
    )
    part = next(r for r in rows if r["record_type"] == "PartitionRecord")
    assert (part["replicas"], part["isr"], part["leader"]) == ([1, 2], [1, 2], 1)
    reg = next(r for r in rows if r["record_type"] == "RegisterBrokerRecord")
    assert (reg["fenced"], reg["in_controlled_shutdown"], reg["rack"]) == (-1, 0, "r1")
    change = [r for r in rows if r["record_type"] == "PartitionChangeRecord"]
    assert change[0]["election"] == "clean" and change[1]["leader"] == LEADER_UNCHANGED
    assert rows[-1]["fenced"] == FENCE


def test_offset_bounds_filter_rows(log):
    d, _ = log
    rows = _rows(list_segments(d), from_offset=5, to_offset=9)
    assert [r["offset"] for r in rows] == [5, 6, 7, 8, 9]


def test_damaged_frames_become_rows_with_a_problem(log):
    d, batches = log
    seg, fr = next(
        (s, f)
        for s in list_segments(d)
        for f in iter_frames(s.read_bytes())
        if b"alice" in bytes(f.payload)
    )
    data = bytearray(seg.read_bytes())
    i = fr.position + 8 + bytes(fr.payload).index(b"alice")
    data[i] = ord("A")  # edit a record's bytes
    seg.write_bytes(bytes(data) + b"\x00\x00\x10\x00\x00")  # and leave a torn frame
    rows = _rows([seg])
    edited = [r for r in rows if r["batch_base_offset"] == batches[1].base_offset]
    assert edited and all(not r["crc_ok"] and r["problem"] == "crc" for r in edited)
    assert edited[0]["principal"] == "User:Alice"
    assert edited[0]["batch_hash"] != batch_hash(batches[1].encode()).hex()
    torn = rows[-1]
    assert torn["record_type"] is None and torn["problem"].startswith("torn")


def test_reader_plans_one_partition_per_segment_and_skips_by_offset(log):
    from pyspark.sql.datasource import GreaterThanOrEqual, LessThan

    d, _ = log
    ranges = segment_ranges(d)
    everything = KraftMetadataReader({"path": str(d)}).partitions()
    assert [p.value[1] for p in everything] == [str(p) for p, _, _ in ranges]
    lo = ranges[2][1]
    reader = KraftMetadataReader({"path": str(d)})
    back = list(
        reader.pushFilters([GreaterThanOrEqual(("offset",), lo), LessThan(("offset",), lo + 1)])
    )
    assert len(back) == 2  # handed back: Spark still applies them to rows
    assert [p.value[1] for p in reader.partitions()] == [str(ranges[2][0])]
    assert (
        KraftMetadataReader({"path": str(d), "toOffset": "-1"}).partitions()[0].value[0] == "none"
    )
    spelt = KraftMetadataReader({"path": str(d)}, [("offset", "Offset")])
    list(spelt.pushFilters([GreaterThanOrEqual(("Offset",), lo), LessThan(("Offset",), lo + 1)]))
    assert [p.value[1] for p in spelt.partitions()] == [str(ranges[2][0])]
    with pytest.raises(ValueError, match="fromOffset"):
        KraftMetadataReader({"path": str(d), "fromOffset": "x"})
    with pytest.raises(ValueError, match="snapshots"):
        KraftMetadataReader({"path": str(d), "snapshots": "maybe"})
    with pytest.raises(ValueError, match="not a directory"):
        KraftMetadataReader({"path": str(d / "nope")})


def _image_at(batches: list[Batch], upto: int) -> MetadataImage:
    delta = MetadataDelta(MetadataImage.EMPTY)
    for b in batches:
        if b.last_offset <= upto:
            delta.replay_batch(b)
    return delta.apply()


def test_state_replay_matches_snapshots_and_stops_at_batch_boundaries(log):
    d, batches = log
    snap_image = _image_at(batches, batches[10].last_offset)
    image_to_snapshot(d, snap_image)
    result = state.replay(d)
    assert result.error is None and result.image.offset == batches[-1].last_offset
    assert [c["match"] for c in result.comparisons] == [True]
    assert result.comparisons[0]["offset"] == snap_image.offset
    mid = state.replay(d, upto=batches[1].last_offset - 1)  # inside batch 1: stop before it
    assert mid.image.offset == batches[0].last_offset
    assert mid.image.checksum() == _image_at(batches, batches[0].last_offset).checksum()
    by_time = state.replay(d, upto_ms=batches[3].timestamp_ms)
    assert by_time.image.offset == batches[3].last_offset
    rows = [r for rb in decode_snapshot(list(d.glob("*.checkpoint"))[0]) for r in rb.to_pylist()]
    assert len(rows) == snap_image.record_count()
    assert {r["offset"] for r in rows} == {snap_image.offset}
    assert {r["source_kind"] for r in rows} == {"snapshot"}


def test_state_replay_goes_on_past_a_break_instead_of_raising(log):
    d, batches = log
    seg = list_segments(d)[1]
    data = seg.read_bytes()
    fr = list(iter_frames(data))[0]
    seg.write_bytes(data[: fr.position] + data[fr.end :])  # remove a batch
    gone = next(b for b in batches if b.base_offset == int(seg.name[:20]))
    result = state.replay(d)
    assert result.error is None  # a break, not an error: the replay goes on past it
    (gap,) = result.gaps
    assert (gap.first, gap.last, gap.why) == (gone.base_offset, gone.last_offset, "offsets missing")
    assert result.image.offset == batches[-1].last_offset and result.approximate


def test_parse_point():
    assert parse_point("1200", "--from") == ("offset", 1200)
    assert parse_point("2026-11-22T10:00:00Z", "--to") == ("time", 1795341600000)
    assert parse_point("2026-11-22T10:00:00", "--to") == ("time", 1795341600000)
    with pytest.raises(UsageError, match="--from must be an offset"):
        parse_point("yesterday", "--from")


def test_report_is_self_contained():
    data = {
        "meta": {
            "log_dir": "<d>",
            "records": 3,
            "batches": 1,
            "segments": 1,
            "first_offset": 0,
            "last_offset": 2,
            "first_ms": 0,
            "last_ms": 1000,
            "generated": "now",
            "elapsed_s": 1.0,
            "out": "o",
        },
        "findings": [
            {
                "rule": "hash-chain",
                "severity": "error",
                "count": 1,
                "errors": 1,
                "warnings": 0,
                "description": "d",
                "samples": [{"offset": 7, "severity": "error", "detail": "<b>x</b>"}],
            }
        ],
        "leadership": {"t-0": [(0, 500, 1), (500, 1000, -1)]},
        "broker_keys": [1],
        "broker_states": {"broker 1": [(0, 1000, "fenced")]},
        "isr": {"t-0": [(0, 2), (500, 1)]},
        "volume": [(0, {"TopicRecord": 2})],
        "record_types": ["TopicRecord"],
        "principals": [("User:a · CreateTopics", 3)],
        "replication_intervals": [],
        "lifecycle": [],
        "broker_history": [],
        "snapshots": [],
    }
    page = report.render(data)
    assert "FAILED" in page and page.count("<svg") == 5
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert "<script" not in page and "http" not in page


def test_a_reads_schema_picks_columns_or_is_refused_with_reasons():
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    from tools.audit.columns import COLUMNS
    from tools.audit.datasource import requested_columns

    types = {
        "STRING": StringType(),
        "BIGINT": LongType(),
        "INT": IntegerType(),
        "BOOLEAN": BooleanType(),
        "ARRAY<INT>": ArrayType(IntegerType()),
    }
    assert requested_columns(StructType([StructField(n, types[s]) for n, _, s in COLUMNS])) is None
    picked = StructType(
        [StructField("ISR", ArrayType(IntegerType())), StructField("offset", LongType())]
    )
    assert requested_columns(picked) == [("isr", "ISR"), ("offset", "offset")]
    bad = StructType(
        [
            StructField("offset", IntegerType()),
            StructField("colour", StringType()),
            StructField("leader", IntegerType(), False),
            StructField("Leader", IntegerType()),
            StructField("isr", ArrayType(IntegerType(), False)),
        ]
    )
    with pytest.raises(ValueError) as e:
        requested_columns(bad)
    for reason in (
        "'offset' is BIGINT in the table, not INT",
        "'colour' is not a column",
        "'leader' must be nullable",
        "'Leader' is asked for twice",
        "'isr' must have nullable elements",
    ):
        assert reason in str(e.value)
    with pytest.raises(ValueError, match="no column"):
        requested_columns(StructType([]))


def test_report_data_orders_like_spark_and_breaks_its_ties(tmp_path):
    """The report's driver-side reads: ascending puts nulls first and descending last (Spark's
    defaults), further keys break ties; the top partitions rank by count, then name and
    partition, an unnamed one taking its place but left out; buckets floor like Spark's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tools.audit import reportdata

    (tmp_path / "t").mkdir()
    pq.write_table(
        pa.table(
            {
                "d": [2.0, None, 5.0, 2.0],
                "o": [4, 3, 2, 1],
                "ts": pa.array([1_500, 2_000, None, 0], pa.timestamp("ns")),
            }
        ),
        tmp_path / "t" / "part-0.parquet",
    )
    down = reportdata.ordered(
        tmp_path / "t",
        ("d", "o", "ts"),
        [("d", "descending"), ("o", "ascending")],
        3,
        millis=("ts",),
    )
    assert [(r["d"], r["o"], r["ts"]) for r in down] == [(5.0, 2, None), (2.0, 1, 0), (2.0, 4, 0)]
    up = reportdata.ordered(tmp_path / "t", ("d", "o"), [("d", "ascending")], 2)
    assert [r["o"] for r in up] == [3, 4]
    assert reportdata.ordered(tmp_path / "missing", ("d",), [("d", "ascending")], 2) == []
    (tmp_path / "many").mkdir()  # several files of several batches: kept top rows, ties in order
    for i in range(3):
        pq.write_table(
            pa.table(
                {"d": [float(x % 7) for x in range(50)], "o": [i * 100 + x for x in range(50)]}
            ),
            tmp_path / "many" / f"part-{i}.parquet",
            row_group_size=8,
        )
    whole = sorted(((x % 7, i * 100 + x) for i in range(3) for x in range(50)), key=lambda r: -r[0])
    assert [
        (r["d"], r["o"])
        for r in reportdata.ordered(tmp_path / "many", ("d", "o"), [("d", "descending")], 20)
    ] == [(float(d), o) for d, o in whole[:20]]

    seeds = pa.Table.from_pylist(
        [
            {"topic_id": t, "partition_id": p, "leader_events": n, "isr_events": 0}
            for t, p, n in (
                ("a", 0, 5),
                ("b", 1, 5),
                ("b", 0, 5),
                ("x", 0, 9),
                ("c", 0, 1),
                ("a2", 0, None),
            )
        ]
    )
    assert reportdata.top_partitions(None, {}, "leader_events", 3) == []
    names = {"a": "beta", "b": "alpha", "c": "gamma", "a2": "beta"}
    assert reportdata.top_partitions(seeds, names, "leader_events", 3) == [
        ("alpha", 0),
        ("alpha", 1),
    ]
    assert reportdata.top_partitions(seeds, names, "leader_events", 4)[-1] == ("beta", 0)
    vol = reportdata.volume(
        [
            {"timestamp_ms": 0, "record_type": "T", "count": 2},
            {"timestamp_ms": 999, "record_type": "T", "count": 1},
            {"timestamp_ms": 1000, "record_type": "T", "count": 4},
        ],
        0,
        1000,
    )
    assert sorted((r["b"], r["count"]) for r in vol) == [(0, 2), (59, 5)]
