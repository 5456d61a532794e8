"""``kraft audit``: replay the metadata log in Spark — what changed, when, who asked, was it safe.

Modules: ``columns`` (the record table's schema and the decoder that fills it, using the
project's own codec), ``datasource`` (the ``kraft-metadata`` PySpark data source), ``session``
(a quiet SparkSession), ``mirror`` (incremental Parquet copy of sealed segments), ``tables``
(derived tables), ``checks`` (named rules), ``state`` (image at offset N / time T, snapshot
comparison), ``report`` (HTML), ``run`` (the whole audit).
"""
