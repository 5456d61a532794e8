"""The findings' counts and samples (what findings.json reports per rule) come from one Spark
job: counted per (rule, severity) however many rows a rule has, its samples the first
``SAMPLES_PER_RULE`` by offset."""
from __future__ import annotations

import pytest

pyspark = pytest.importorskip("pyspark")

from tests.spark_fixture import module_spark  # noqa: E402

from tools.audit.run import SAMPLES_PER_RULE, _counts_and_samples  # noqa: E402

pytestmark = pytest.mark.timeout(300)

spark = module_spark("local[2]", "kraft-audit-findings-test")


def test_counts_every_severity_and_samples_the_first_by_offset(spark):
    many = SAMPLES_PER_RULE + 50
    rows = ([("hash-chain", "error", 1000 - i, f"e{i}") for i in range(many)]
            # warnings only after the rule's first SAMPLES_PER_RULE rows
            + [("hash-chain", "warning", 5000 + i, f"w{i}") for i in range(3)]
            + [("unclean-election", "warning", 7, "u")])
    df = spark.createDataFrame(rows, "rule string, severity string, offset bigint, detail string")
    counts, samples = _counts_and_samples(df.repartition(3))
    assert counts == {("hash-chain", "error"): many, ("hash-chain", "warning"): 3,
                      ("unclean-election", "warning"): 1}
    chain = [r["offset"] for r in samples if r["rule"] == "hash-chain"]
    assert chain == sorted(1000 - i for i in range(many))[:SAMPLES_PER_RULE]
    assert [(r["offset"], r["detail"]) for r in samples if r["rule"] == "unclean-election"] == \
        [(7, "u")]


def test_no_findings(spark):
    df = spark.createDataFrame([], "rule string, severity string, offset bigint, detail string")
    assert _counts_and_samples(df) == ({}, [])
