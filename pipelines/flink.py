"""Running the pipelines on Apache Flink with Beam's FlinkRunner.

Beam's FlinkRunner starts a Flink job server (a Java process) and, for
``flink_master=[local]``, an embedded Flink cluster inside it. By default it
downloads the job server jar matching the SDK from Maven Central; where
that jar is not served (as on this project's build machines), the same job
server is assembled from the runner's Maven artifacts by
``scripts/flink-job-server`` (see ``flink/pom.xml``). :func:`fill_defaults`
points the options at that build when the user names no jar.
"""

from __future__ import annotations

import os
import subprocess

from apache_beam.options.pipeline_options import (FlinkRunnerOptions, PipelineOptions,
                                                  PortableOptions, StandardOptions)

# The Flink minor version of the job server that flink/pom.xml assembles; the
# runner artifact for it must exist for the pinned apache-beam version.
FLINK_VERSION = "1.19"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB_SERVER_SCRIPT = os.path.join(ROOT, "scripts", "flink-job-server")
JOB_SERVER_JAR_ENV = "BEAM_FLINK_JOB_SERVER_JAR"


def job_server_jar() -> str:
    """Path of the job server jar: ``$BEAM_FLINK_JOB_SERVER_JAR``, or the local build."""
    jar = os.environ.get(JOB_SERVER_JAR_ENV)
    if jar:
        return jar
    try:
        out = subprocess.run([JOB_SERVER_SCRIPT], check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        raise RuntimeError(
            f"could not assemble Beam's Flink job server with {JOB_SERVER_SCRIPT} "
            f"(needs Java 17 and Maven): {detail.strip()[-2000:]}") from e
    return out.stdout.strip().splitlines()[-1]


def is_flink(options: PipelineOptions) -> bool:
    runner = options.view_as(StandardOptions).runner or ""
    name = runner if isinstance(runner, str) else type(runner).__name__
    return name.rsplit(".", 1)[-1] in ("FlinkRunner", "flink")


def fill_defaults(options: PipelineOptions) -> PipelineOptions:
    """For FlinkRunner: use the local job server build unless a jar was named."""
    if is_flink(options):
        portable = options.view_as(PortableOptions)
        # apache-beam 2.62 parses each options view with argparse abbreviations
        # on, so a job's own --output reads as --output_executable_path and
        # FlinkRunner would write a jar there instead of running the job.
        if not any(f.startswith("--output_executable_path") for f in options._flags):  # noqa: SLF001 (no public accessor)
            portable.output_executable_path = None
        flink = options.view_as(FlinkRunnerOptions)
        if not flink.flink_job_server_jar and not flink.flink_submit_uber_jar:
            flink.flink_job_server_jar = job_server_jar()
            flink.flink_version = FLINK_VERSION
    return options


def flink_options(parallelism: int = 2, master: str = "[local]", *extra: str) -> PipelineOptions:
    """Options for a pipeline on Flink: LOOPBACK workers, the given parallelism."""
    return fill_defaults(PipelineOptions([
        "--runner=FlinkRunner", f"--flink_master={master}", f"--flink_version={FLINK_VERSION}",
        f"--parallelism={parallelism}", "--environment_type=LOOPBACK", *extra]))

