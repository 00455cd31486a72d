"""A Spark standalone cluster on this machine for tests/test_spark_cluster.py: a master and two
workers, each worker in its own user+mount+UTS namespace (hostname kstore-w1/kstore-w2) where
`BASE/mnt` is a fresh tmpfs holding only `shared/`, a bind mount of `BASE/export` (the shared
storage, as NFS would give it), with `shared/masked` covered by an empty tmpfs. On this host
`BASE/mnt/shared` is a symlink to the export, so the driver sees the same store at the same
path; `BASE/mnt/local/` exists only here. Every process is in its own process group and killed
by stop()."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from typing import Optional

import pyspark

SPARK_HOME = os.path.dirname(pyspark.__file__)
WORKERS = ("kstore-w1", "kstore-w2")


def namespaces_allowed() -> Optional[str]:
    """None if unshare can make a user+mount+uts namespace with a tmpfs here, else why not."""
    if shutil.which("unshare") is None:
        return "unshare(1) is not installed"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "Java is not installed (Spark needs it)"
    try:
        p = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "--uts", "sh", "-c",
                            "mount -t tmpfs none /mnt && hostname x"],
                           capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare failed: {e}"
    if p.returncode != 0:
        return ("user+mount namespaces are not allowed here: "
                + p.stderr.decode(errors="replace").strip())
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, base: str):
        self.base = base
        self.procs: list[subprocess.Popen] = []
        self.logs: dict[str, str] = {}
        self.port = _free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        export = os.path.join(base, "export")
        for d in ("store", "masked", "ckpt"):
            os.makedirs(os.path.join(export, d))
        os.makedirs(os.path.join(base, "mnt", "local"))
        os.symlink(export, os.path.join(base, "mnt", "shared"))

    def _env(self) -> dict:
        env = dict(os.environ)
        env.update(SPARK_HOME=SPARK_HOME, SPARK_LOCAL_IP="127.0.0.1", SPARK_DAEMON_MEMORY="256m",
                   SPARK_WORKER_MEMORY="700m", SPARK_NO_DAEMONIZE="1",
                   SPARK_LOG_DIR=os.path.join(self.base, "logs"),
                   SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        return env

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = os.path.join(self.base, f"{name}.log")
        self.logs[name] = log
        with open(log, "wb") as out:
            self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                               env=self._env(), start_new_session=True))

    def _wait_for(self, name: str, pattern: str, deadline: float) -> None:
        rx = re.compile(pattern)
        while time.monotonic() < deadline:
            with open(self.logs[name], errors="replace") as f:
                if rx.search(f.read()):
                    return
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[:3]} exited {p.returncode}: " + self.tail())
            time.sleep(0.2)
        raise TimeoutError(f"{name} did not log {pattern!r}: " + self.tail())

    def tail(self) -> str:
        out = []
        for name, log in self.logs.items():
            with open(log, errors="replace") as f:
                out.append(f"--- {name}\n" + f.read()[-3000:])
        return "\n".join(out)

    def start(self, timeout: float = 120) -> "Cluster":
        deadline = time.monotonic() + timeout
        spark_class = os.path.join(SPARK_HOME, "bin", "spark-class")
        self._spawn("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host",
                               "127.0.0.1", "--port", str(self.port), "--webui-port", "0"])
        self._wait_for("master", r"I have been elected leader", deadline)
        mnt = os.path.join(self.base, "mnt")
        for host in WORKERS:
            work = os.path.join(self.base, f"work-{host}")
            os.makedirs(work)
            script = (f"set -e; hostname {host}; mount -t tmpfs none '{mnt}'; "
                      f"mkdir '{mnt}/shared'; mount --bind '{self.base}/export' '{mnt}/shared'; "
                      f"mount -t tmpfs none '{mnt}/shared/masked'; "
                      f"exec '{spark_class}' org.apache.spark.deploy.worker.Worker --host "
                      f"127.0.0.1 --cores 1 --memory 700m --webui-port 0 --work-dir '{work}' "
                      f"{self.url}")
            self._spawn(host, ["unshare", "--user", "--map-root-user", "--mount", "--uts",
                               "sh", "-c", script])
        for host in WORKERS:
            self._wait_for(host, r"Successfully registered with master", deadline)
        return self

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()
