"""Real ZooKeeper servers for tests and demos: a standalone server or an ensemble on loopback.

Each server is a plain ``java`` process running Debian's ``/usr/share/java/zookeeper.jar`` (no
systemd, no ``zkServer.sh``, which logs to /var/log whatever it is told) with its config, data and
log under a directory of its own, on ports picked free at start. Readiness is ZooKeeper's own
``srvr`` four-letter word answering with a ``Mode:`` line, which an ensemble member gives only once
it has joined a quorum. Everything started is killed on exit, whatever happened.

Synchronous on purpose: fixtures and scripts start and stop servers, trio code only talks to them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import attrs

__all__ = [
    "ZOOKEEPER_JAR",
    "Ensemble",
    "ZooKeeperNode",
    "free_ports",
    "open_ensemble",
    "zookeeper_available",
]

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
_LOGGING_JAR = Path("/usr/share/java/slf4j-simple.jar")
STANDALONE_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

#: A short tick so that tests can use short sessions: ZooKeeper grants session timeouts between
#: 2 and 20 ticks, here 1 s to 10 s.
TICK_MS = 500

#: How long a server may take to answer after its JVM starts (measured: ~0.2 s standalone, ~1 s
#: for an ensemble to elect; CI's two busy cores get a wide margin).
READY_DEADLINE = 60.0


def zookeeper_available() -> bool:
    return ZOOKEEPER_JAR.exists() and shutil.which("java") is not None


def free_ports(count: int) -> list[int]:
    """Ports that were free a moment ago; all held open together so that they are distinct."""
    with contextlib.ExitStack() as stack:
        sockets = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]


def four_letter_word(port: int, word: str, *, timeout: float = 2.0) -> str:
    """Send a four-letter command and return the whole answer ('' when nobody answered)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(word.encode("ascii"))
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
    except OSError:
        return ""
    return b"".join(chunks).decode("utf-8", "replace")


@attrs.define(eq=False)
class ZooKeeperNode:
    """One server: its myid (0 for a standalone server), directory, ports and process."""

    myid: int
    directory: Path
    client_port: int
    peer_port: int
    election_port: int
    main_class: str
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        if self.running:
            return
        classpath = str(ZOOKEEPER_JAR)
        if _LOGGING_JAR.exists():
            classpath += os.pathsep + str(_LOGGING_JAR)
        command = [
            "java",
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp",
            classpath,
            self.main_class,
            str(self.directory / "zoo.cfg"),
        ]
        with open(self.directory / "server.log", "ab") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                start_new_session=True,  # a Ctrl-C meant for the tests does not reach it
            )

    def kill(self) -> None:
        """SIGKILL, as a crash would: no goodbye to clients or peers."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.process = None

    def serving(self) -> bool:
        return "Mode:" in four_letter_word(self.client_port, "srvr")

    def mode(self) -> str | None:
        """``standalone``, ``leader`` or ``follower``; None while it is not serving."""
        for line in four_letter_word(self.client_port, "srvr").splitlines():
            if line.startswith("Mode:"):
                return line.partition(":")[2].strip()
        return None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = (self.directory / "server.log").read_text("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@attrs.define(eq=False)
class Ensemble:
    """A running standalone server (one node) or quorum (several), and its connect string."""

    nodes: list[ZooKeeperNode]

    @property
    def hosts(self) -> str:
        """The kazoo connect string; append ``/chroot`` to give a client its own namespace."""
        return ",".join(node.address for node in self.nodes)

    def wait_serving(self, *, deadline: float = READY_DEADLINE) -> None:
        """Block until every running node serves, or raise with the logs of those that do not."""
        give_up = time.monotonic() + deadline  # real-clock: waiting on real processes
        pending = [node for node in self.nodes if node.running]
        while pending:
            pending = [node for node in pending if not node.serving()]
            if not pending:
                return
            dead = [node for node in pending if not node.running]
            if dead or time.monotonic() > give_up:  # real-clock: as above
                why = "exited" if dead else f"did not serve within {deadline:.0f} s"
                logs = "\n".join(f"--- server {n.myid}:\n{n.log_tail()}" for n in pending)
                raise RuntimeError(f"ZooKeeper {why}:\n{logs}")
            time.sleep(0.05)  # real-clock: a blocking wait on real processes starting up

    def leader(self) -> ZooKeeperNode | None:
        for node in self.nodes:
            if node.running and node.mode() in ("leader", "standalone"):
                return node
        return None

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()


def _write_config(node: ZooKeeperNode, peers: list[ZooKeeperNode]) -> None:
    data_dir = node.directory / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        f"tickTime={TICK_MS}",
        "initLimit=20",
        "syncLimit=10",
        f"dataDir={data_dir}",
        f"clientPort={node.client_port}",
        "clientPortAddress=127.0.0.1",
        "maxClientCnxns=0",
        "admin.enableServer=false",
        "4lw.commands.whitelist=ruok,srvr,mntr",
        "autopurge.purgeInterval=0",
    ]
    if len(peers) > 1:
        (data_dir / "myid").write_text(f"{node.myid}\n")
        lines += [f"server.{p.myid}=127.0.0.1:{p.peer_port}:{p.election_port}" for p in peers]
    (node.directory / "zoo.cfg").write_text("\n".join(lines) + "\n")


@contextlib.contextmanager
def open_ensemble(size: int = 1, *, base_dir: Path | None = None) -> Iterator[Ensemble]:
    """Start ``size`` servers (1: standalone; 3: a quorum), wait until they serve, yield them,
    and kill them all on exit. The directory is removed afterwards unless ``base_dir`` was given.
    """
    if not zookeeper_available():
        raise RuntimeError(f"ZooKeeper needs java and {ZOOKEEPER_JAR} (apt-get install zookeeper)")
    with contextlib.ExitStack() as stack:
        if base_dir is None:
            base_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="zookeeper-")))
        ports = free_ports(3 * size)
        main_class = STANDALONE_MAIN if size == 1 else QUORUM_MAIN
        nodes = [
            ZooKeeperNode(
                myid=myid if size > 1 else 0,
                directory=base_dir / f"zk{myid}",
                client_port=ports[3 * (myid - 1)],
                peer_port=ports[3 * (myid - 1) + 1],
                election_port=ports[3 * (myid - 1) + 2],
                main_class=main_class,
            )
            for myid in range(1, size + 1)
        ]
        ensemble = Ensemble(nodes=nodes)
        stack.callback(ensemble.kill)
        for node in nodes:
            _write_config(node, nodes)
            node.start()
        ensemble.wait_serving()
        yield ensemble
