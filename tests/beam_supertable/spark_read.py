"""Reads every snapshot of an Iceberg table with Apache Spark and prints what it holds.

    python -m tests.beam_supertable.spark_read TABLE_DIR

Runs in its own process (Spark's JVM stays out of the test's); Spark fetches
its Iceberg runtime from Maven Central. Prints one JSON object: snapshot id ->
``[rows, sum of n, sorted keys]``.
"""

import json
import sys

from pyspark.sql import SparkSession

ICEBERG_RUNTIME = "org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.10.0"


def main(path: str) -> None:
    spark = (SparkSession.builder.master("local[1]").appName("iceberg-read")
             .config("spark.jars.packages", ICEBERG_RUNTIME)
             .config("spark.sql.extensions",
                     "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    history = spark.read.format("iceberg").load(f"{path}#snapshots").select("snapshot_id")
    out = {}
    for (snapshot_id,) in sorted(history.collect()):
        frame = spark.read.format("iceberg").option("snapshot-id", snapshot_id).load(path)
        rows = frame.select("key", "n").collect()
        out[snapshot_id] = [len(rows), sum(r.n for r in rows), sorted(r.key for r in rows)]
    print(json.dumps(out))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
