from setuptools import find_packages, setup

setup(
    name="beam-upsert-supertable",
    version="0.1.0",
    description=(
        "Apache Beam plugin: upsert commands to a retraction changelog, and an "
        "object-store table of Parquet superfiles with vector and text indexes."),
    python_requires=">=3.10,<3.13",
    packages=find_packages(include=["beam_upsert*", "beam_supertable*", "pipelines*"]),
    install_requires=[
        # Pinned to the newest release whose Flink runner Maven Central serves
        # here with all its dependencies, so the SDK and the job server built
        # by flink/pom.xml are the same version (see README, "Running on Flink").
        "apache-beam>=2.62.0,<2.63",
        # apache-beam 2.62 caps pyarrow below 17 and numpy below 2.3.
        "pyarrow>=16,<17",
        "numpy>=1.26,<2.3",
        "scikit-learn>=1.5,<2",
        "fsspec>=2024.6.0",
        "s3fs>=2024.6.0",
    ],
    extras_require={
        "test": [
            "pytest>=8,<10",
            "hypothesis>=6.100,<7",
            "moto[server]>=5.0.15,<6",
        ],
        # Baselines the benchmarks compare against (not needed by the tests).
        "bench": [
            "faiss-cpu>=1.8,<2",
            "bm25s>=0.2,<0.4",
            "lancedb>=0.20,<1",
        ],
    },
)
