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
import re
import subprocess
from typing import Sequence

from apache_beam.options.pipeline_options import (
    FlinkRunnerOptions, PipelineOptions, PortableOptions, StandardOptions)

# The Flink minor version of the job server that flink/pom.xml assembles; the
# runner artifact for it must exist for the job server's apache-beam release.
FLINK_VERSION = "1.19"
# The repository root (scripts/, flink/); absent where the package is installed.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB_SERVER_SCRIPT = os.path.join(ROOT, "scripts", "flink-job-server")
JOB_SERVER_POM = os.path.join(ROOT, "flink", "pom.xml")
JOB_SERVER_JAR_ENV = "BEAM_FLINK_JOB_SERVER_JAR"
# How long a TaskManager keeps a job's SDK workers after its last task let go
# of them. Beam's default (0) closes them whenever no task holds them, and a
# batch job runs its stages one pipelined region after another, so every
# region started the Python workers afresh (a new process each with EXTERNAL
# or PROCESS workers) and set the DoFns up again, once per region of the job.
ENVIRONMENT_CACHE_MS = 60_000


def job_server_beam_version() -> str:
    """The apache-beam release of the job server flink/pom.xml assembles.

    ``<beam.version>`` in the POM is the one constant that names it: the
    Flink test environment installs the same apache-beam (the SDK and the job
    server must match), and moving to a newer job server moves only it.
    """
    with open(JOB_SERVER_POM, encoding="utf-8") as f:
        found = re.search(r"<beam\.version>([^<]+)</beam\.version>", f.read())
    if not found:
        raise RuntimeError(f"{JOB_SERVER_POM}: no <beam.version> property")
    return found.group(1).strip()


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


def _given(argv: Sequence[str], name: str) -> bool:
    return any(a == f"--{name}" or a.startswith(f"--{name}=") for a in argv)


def _cache_given(portable: PortableOptions, argv: Sequence[str]) -> bool:
    # Beam declares --environment_cache_millis without a type: a value from
    # flags (argv, from_dictionary, an abbreviation on apache-beam < 2.63) is
    # a string (even "0"), and its default is the int 0. So any value other
    # than the int 0 was chosen by the user, whether or not ``argv`` shows it.
    return _given(argv, "environment_cache_millis") or portable.environment_cache_millis != 0


def fill_defaults(options: PipelineOptions, argv: Sequence[str] = ()) -> PipelineOptions:
    """For FlinkRunner: the local job server build unless a jar was named, and
    SDK workers kept for the whole job (:data:`ENVIRONMENT_CACHE_MS`) unless
    ``--environment_cache_millis`` was given.

    Args:
        options: the pipeline options built from ``argv``.
        argv: the command-line flags ``options`` came from; they tell which
            options were given literally. An options object built otherwise
            (a dictionary, keyword arguments) keeps the values it holds, but
            an ``environment_cache_millis`` of the int 0 there is Beam's
            default and reads as unset: pass ``"0"`` or the flag in ``argv``.
    """
    if is_flink(options):
        portable = options.view_as(PortableOptions)
        # apache-beam releases before 2.63 parse each options view with argparse
        # abbreviations on, so a job's own --output reads as
        # --output_executable_path and FlinkRunner would write a jar there
        # instead of running the job. Keep it only when it was given literally.
        if not _given(argv, "output_executable_path"):
            portable.output_executable_path = None
        if not _cache_given(portable, argv):
            portable.environment_cache_millis = ENVIRONMENT_CACHE_MS
        flink = options.view_as(FlinkRunnerOptions)
        # A job submitted to a running job server (--job_endpoint) needs no jar.
        if (not flink.flink_job_server_jar and not flink.flink_submit_uber_jar
                and not portable.job_endpoint):
            flink.flink_job_server_jar = job_server_jar()
            flink.flink_version = FLINK_VERSION
    return options


def flink_options(parallelism: int = 2, master: str = "[local]", *extra: str) -> PipelineOptions:
    """Options for a pipeline on Flink: LOOPBACK workers, the given parallelism."""
    argv = ["--runner=FlinkRunner", f"--flink_master={master}", f"--flink_version={FLINK_VERSION}",
            f"--parallelism={parallelism}", "--environment_type=LOOPBACK", *extra]
    return fill_defaults(PipelineOptions(argv), argv)

