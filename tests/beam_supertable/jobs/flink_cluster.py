"""A standalone Flink session cluster on loopback: a JobManager and a
TaskManager as separate JVM processes.

PyPI's ``apache-flink`` cannot be installed beside apache-beam 2.62 (it pins
an older Beam), and Maven Central serves no Flink distribution archive here,
so the processes are started from the Flink jars the job server build
already fetched (``flink/target/beam-flink-job-server-lib``), the way Flink's own
``jobmanager.sh``/``taskmanager.sh`` start them: ``BashJavaUtils`` turns the
memory settings into JVM flags and dynamic properties, then the entry point
classes run with ``--configDir``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import List, Optional

JOBMANAGER = "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
TASKMANAGER = "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"
BASH_JAVA_UTILS = "org.apache.flink.runtime.util.bash.BashJavaUtils"
RESULT_PREFIX = "BASH_JAVA_UTILS_EXEC_RESULT:"
# What Flink's own flink-conf.yaml passes every JVM on Java 17
# (``env.java.opts.all``): Kryo reflects into JDK classes. Without them a
# streaming job that pushes back elements waiting for a side input fails
# ("Unable to make field ... java.util.Arrays$ArrayList.a accessible").
JAVA_17_OPTS = [
    "--add-exports=java.base/sun.net.util=ALL-UNNAMED",
    "--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports=java.security.jgss/sun.security.krb5=ALL-UNNAMED",
    *(f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in (
        "java.lang", "java.net", "java.io", "java.nio", "sun.nio.ch", "java.lang.reflect",
        "java.text", "java.time", "java.util", "java.util.concurrent",
        "java.util.concurrent.atomic", "java.util.locks")),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FlinkCluster:
    def __init__(self, lib_dir: str, work_dir: str, slots: int = 2, restart_attempts: int = 3,
                 conf: Optional[dict] = None):
        self.classpath = os.path.join(lib_dir, "*")
        self.work_dir = work_dir
        self.conf_dir = os.path.join(work_dir, "conf")
        self.rest_port = _free_port()
        self.rpc_port = _free_port()
        self.slots = slots
        self.restart_attempts = restart_attempts
        self.extra_conf = dict(conf or {})    # flink-conf.yaml entries over the ones below
        self.jobmanager: Optional[subprocess.Popen] = None
        self.taskmanagers: List[subprocess.Popen] = []

    @property
    def master(self) -> str:
        return f"localhost:{self.rest_port}"

    def _write_conf(self) -> None:
        os.makedirs(self.conf_dir, exist_ok=True)
        conf = {
            "jobmanager.rpc.address": "localhost",
            "jobmanager.rpc.port": self.rpc_port,
            "jobmanager.bind-host": "localhost",
            "taskmanager.bind-host": "localhost",
            "taskmanager.host": "localhost",
            "rest.address": "localhost",
            "rest.bind-address": "localhost",
            "rest.port": self.rest_port,
            "jobmanager.memory.process.size": "1024m",
            "taskmanager.memory.process.size": "3072m",
            # Beam's batch translation opens many shuffle channels at once;
            # Flink's default network memory (~10 % of the process) is too little.
            "taskmanager.memory.network.min": "512m",
            "taskmanager.memory.network.max": "512m",
            "taskmanager.numberOfTaskSlots": self.slots,
            "parallelism.default": self.slots,
            # A failed task restarts the job (Beam sets no strategy of its own).
            # Exponential delay, not fixed delay: a killed TaskManager fails
            # every pipelined region it ran at once, and fixed-delay counts
            # each region as an attempt (a job with many stages used up three
            # attempts on one kill); since Flink 1.19 (FLIP-364) exponential
            # delay counts the failures inside one backoff as one attempt.
            "restart-strategy.type": "exponential-delay",
            "restart-strategy.exponential-delay.initial-backoff": "1 s",
            "restart-strategy.exponential-delay.max-backoff": "10 s",
            "restart-strategy.exponential-delay.backoff-multiplier": 2.0,
            "restart-strategy.exponential-delay.attempts-before-reset-backoff":
                self.restart_attempts,
            # A killed TaskManager is noticed within seconds, not the default 50 s.
            "heartbeat.interval": 2000,
            "heartbeat.timeout": 10000,
            # Streaming jobs with --checkpointing_interval: checkpoints go to
            # files under the work dir (the JobManager's memory would do for a
            # TaskManager failure, but caps each state at 5 MB).
            "state.backend.type": "hashmap",
            "state.checkpoints.dir": "file://" + os.path.join(self.work_dir, "checkpoints"),
            # Where the JobManager keeps what jobs upload (their jars, among them).
            "blob.storage.directory": os.path.join(self.work_dir, "blobs"),
            # The runner's classes come from the cluster's class path, so their
            # static gRPC executor threads outlive the job that started them and
            # keep its (closed, empty) user-code class loader as their context
            # loader. Flink's leak check would fail a later job's first use of
            # such a thread (a bundle then never finishes); the closed loader
            # holds no jars and delegates to the cluster's, which is safe.
            "classloader.check-leaked-classloader": "false",
        }
        conf.update(self.extra_conf)
        with open(os.path.join(self.conf_dir, "flink-conf.yaml"), "w") as f:
            for key, value in conf.items():
                f.write(f"{key}: {value}\n")

    def _resource_params(self, which: str) -> List[List[str]]:
        out = subprocess.run(
            ["java", "-cp", self.classpath, BASH_JAVA_UTILS, which, "--configDir", self.conf_dir],
            check=True, capture_output=True, text=True).stdout
        lines = [line[len(RESULT_PREFIX):] for line in out.splitlines()
                 if line.startswith(RESULT_PREFIX)]
        return [line.split() for line in lines]

    def _java(self, name: str, main: str, params: List[List[str]]) -> subprocess.Popen:
        jvm, dynamic = params[0], params[1] if len(params) > 1 else []
        log = open(os.path.join(self.work_dir, f"{name}.log"), "ab")
        return subprocess.Popen(
            ["java", *jvm, *JAVA_17_OPTS, "-cp", self.classpath, main, "--configDir", self.conf_dir, *dynamic],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, timeout: float = 90) -> "FlinkCluster":
        self._write_conf()
        self.jobmanager = self._java("jobmanager", JOBMANAGER,
                                     self._resource_params("GET_JM_RESOURCE_PARAMS"))
        self.start_taskmanager()
        self.wait_for(lambda o: o["taskmanagers"] >= 1 and o["slots-available"] >= self.slots,
                      timeout, "a registered TaskManager")
        return self

    def start_taskmanager(self) -> subprocess.Popen:
        n = len(self.taskmanagers)
        tm = self._java(f"taskmanager-{n}", TASKMANAGER,
                        self._resource_params("GET_TM_RESOURCE_PARAMS"))
        self.taskmanagers.append(tm)
        return tm

    def rest(self, path: str, patience: float = 90.0) -> dict:
        # The JobManager's REST endpoint stalls for seconds while it takes in
        # a job's jars on a loaded machine: a stall is waited out, not failed.
        deadline = time.time() + patience
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.master}{path}", timeout=15) as r:
                    return json.load(r)
            except (TimeoutError, ConnectionError, urllib.error.URLError):
                if time.time() > deadline:
                    raise
                time.sleep(0.5)

    def uploaded_bytes(self) -> int:
        """Bytes the JobManager holds of what jobs uploaded (its blob store)."""
        root = os.path.join(self.work_dir, "blobs")
        return sum(os.path.getsize(os.path.join(d, f))
                   for d, _, files in os.walk(root) for f in files)

    def overview(self) -> dict:
        return self.rest("/overview", patience=0)

    def wait_for(self, predicate, timeout: float, what: str) -> dict:
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            if self.jobmanager is not None and self.jobmanager.poll() is not None:
                raise RuntimeError(f"the JobManager exited; see {self.work_dir}/jobmanager.log")
            try:
                last = self.overview()
                if predicate(last):
                    return last
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"Flink cluster: no {what} within {timeout} s (last overview {last}); "
                           f"logs in {self.work_dir}")

    def job_exceptions(self, job_id: Optional[str] = None) -> List[str]:
        """Root causes of the failures one job (or every job) went through."""
        out = []
        ids = [job_id] if job_id else [job["id"] for job in self.rest("/jobs")["jobs"]]
        for jid in ids:
            info = self.rest(f"/jobs/{jid}/exceptions")
            for entry in info.get("exceptionHistory", {}).get("entries", []):
                out.append(entry.get("exceptionName", "") + ": " + entry.get("stacktrace", "")[:2000])
        return out

    def stop(self) -> None:
        procs = [p for p in self.taskmanagers + [self.jobmanager] if p is not None]
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            stop_group(proc)


def stop_group(proc: subprocess.Popen, timeout: float = 20) -> None:
    """Stops a process started in its own group, and its children: TERM, then KILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class WorkerPool:
    """Beam's external Python worker pool, the sidecar of a TaskManager.

    ``python -m apache_beam.runners.worker.worker_pool_main`` serves
    ``StartWorker`` requests from the TaskManager's
    ``--environment_type=EXTERNAL`` stages by starting one real SDK worker
    process per request (``python -c ...SdkHarness(...)``, ``python`` from
    ``PATH``), so this pool runs with the current interpreter's directory
    first on ``PATH`` and ``pythonpath`` (the project) importable.
    """

    def __init__(self, work_dir: str, pythonpath: str):
        self.work_dir = work_dir
        self.pythonpath = pythonpath
        self.port = _free_port()
        self.process: Optional[subprocess.Popen] = None

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    def start(self, timeout: float = 60) -> "WorkerPool":
        env = dict(os.environ)
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        env["PYTHONPATH"] = self.pythonpath + os.pathsep + env.get("PYTHONPATH", "")
        log = open(os.path.join(self.work_dir, "worker-pool.log"), "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
             f"--service_port={self.port}"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the worker pool exited; see {self.work_dir}/worker-pool.log")
            try:
                with socket.create_connection(("localhost", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"worker pool: port {self.port} not open within {timeout} s")

    def stop(self) -> None:
        # The pool and the workers it started share one process group.
        if self.process is not None:
            stop_group(self.process)
