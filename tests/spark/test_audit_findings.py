"""The findings' counts and samples (what findings.json reports per rule) come from one Spark
job: counted per (rule, severity) however many rows a rule has, its samples the first
``SAMPLES_PER_RULE`` by offset."""

from __future__ import annotations

import pytest

pyspark = pytest.importorskip("pyspark")

from tests.spark_fixture import module_spark
from tools.audit.run import SAMPLES_PER_RULE, _counts_and_samples

pytestmark = pytest.mark.timeout(300)

spark = module_spark("local[2]", "kraft-audit-findings-test")


def test_counts_every_severity_and_samples_the_first_by_offset(spark):
    many = SAMPLES_PER_RULE + 50
    rows = (
        [("hash-chain", "error", 1000 - i, f"e{i}") for i in range(many)]
        # warnings only after the rule's first SAMPLES_PER_RULE rows
        + [("hash-chain", "warning", 5000 + i, f"w{i}") for i in range(3)]
        + [("unclean-election", "warning", 7, "u")]
    )
    df = spark.createDataFrame(rows, "rule string, severity string, offset bigint, detail string")
    counts, samples, consequences = _counts_and_samples(df.repartition(3))
    assert counts == {
        ("hash-chain", "error"): many,
        ("hash-chain", "warning"): 3,
        ("unclean-election", "warning"): 1,
    }
    chain = [r["offset"] for r in samples if r["rule"] == "hash-chain"]
    assert chain == sorted(1000 - i for i in range(many))[:SAMPLES_PER_RULE]
    assert [(r["offset"], r["detail"]) for r in samples if r["rule"] == "unclean-election"] == [
        (7, "u")
    ]
    assert consequences == {}
    # a damaged stretch from offset 900 on: the findings at or after it are its consequences
    _, _, after = _counts_and_samples(df, [900])
    assert after == {("hash-chain", 0): 101 + 3}


def test_no_findings(spark):
    df = spark.createDataFrame([], "rule string, severity string, offset bigint, detail string")
    assert _counts_and_samples(df) == ({}, [], {})


def test_batch_rules_with_known_bounds_equal_those_with_aggregated_ones(spark):
    """A re-audit passes every batch's lowest and highest base offset (read on the driver)
    instead of aggregating them: the same gaps, overlaps and broken chain links are found."""
    from tools.audit import checks

    z = "0" * 64
    rows = [
        (0, 4, 1, "h0", z),
        (5, 9, 1, "h1", "h0"),
        (12, 15, 1, "h2", "h1"),
        (12, 13, 1, "h3", "h2"),
        (16, 20, 1, "h4", "bad"),
    ]
    cols = ("batch_base_offset", "batch_last_offset", "term", "batch_hash", "prev_hash")
    every = spark.createDataFrame(rows, cols)
    new = every.filter("batch_base_offset >= 12")

    def found(df):
        return sorted(tuple(r) for r in df.collect())

    for rule, wrong in ((checks.offsets_contiguous, (0, 12)), (checks.hash_chain, (12, 16))):
        derived = found(rule(new, every))
        assert derived and found(rule(new, every, (0, 16))) == derived
        assert found(rule(new, every, wrong)) != derived  # the bounds are used


def test_the_new_rows_totals_read_on_the_driver_equal_sparks(spark, tmp_path):
    """A re-audit takes the new rows' totals, head and watermark from the mirror with pyarrow
    (``_meta_of_rows``); a whole-log run aggregates them in Spark (``_meta``): the same
    figures, a damaged frame and a torn tail included."""
    from kraft.log.segment import list_segments
    from testsupport.sample_log import write_history
    from tools.audit import tables
    from tools.audit.mirror import Mirror
    from tools.audit.run import META_COLUMNS, _meta, _meta_of_rows

    log_dir = tmp_path / "log"
    write_history(log_dir, segment_bytes=1500)
    segments = list_segments(log_dir)
    assert len(segments) > 2
    data = bytearray(segments[1].read_bytes())
    data[40] ^= 0xFF  # inside the first frame's payload: a CRC problem row
    segments[1].write_bytes(bytes(data))
    with open(segments[-1], "ab") as f:
        f.write(b"\x00\x00\x10\x00\x00")  # a torn tail
    mirror = Mirror(log_dir, tmp_path / "mirror")
    records, _ = mirror.load(spark)
    by_spark = _meta(tables.prepare(records))
    by_arrow = _meta_of_rows(mirror.rows_after(segments[0].name, -1, list(META_COLUMNS)))
    assert by_spark["problems"] >= 2 and by_spark["records"] > 20
    assert by_arrow == by_spark
