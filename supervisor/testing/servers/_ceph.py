"""A private Ceph cluster with a RADOS Gateway on loopback: one mon, one OSD (memstore), radosgw.

Debian's Ceph packages (``ceph-mon ceph-osd radosgw ceph-common``: 16 on Debian 12, 18 on 13); nothing in /etc is read or
written: every daemon and client gets ``-c DIR/ceph.conf`` and keyrings under the instance's own
directory. cephx auth is on (with ``auth none`` radosgw loops on ``get_initial_auth_request
returned -13``); messenger v2 only, with the ports pinned to a free range (``ms bind port
min/max``) so that several instances can run side by side. The OSD keeps its objects in memory
(memstore): nothing is written to disk but the logs, and a restart loses everything.

At-rest corruption goes through librados (the ``rados`` tool) into the bucket data pool, below
radosgw: the gateway's stored ETag and checksums stay those of the original object.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import structlog

from supervisor.testing.slurm._daemon import Daemon, find_binary, search_path

log = structlog.get_logger()

BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "ceph", "ceph-authtool", "monmaptool", "radosgw-admin", "rados")
PACKAGES = "ceph-mon ceph-osd radosgw ceph-common"
DATA_POOL = "default.rgw.buckets.data"
_PORT_SPAN = 12  # mon, the OSD's public/cluster/heartbeat messengers, radosgw's, clients'


class CephError(RuntimeError):
    """The private Ceph cluster could not start, or a command against it failed."""


def ceph_unavailable_reason() -> str | None:
    missing = [b for b in BINARIES if find_binary(b) is None]
    if missing:
        return f"Ceph binaries not found: {', '.join(missing)} (apt-get install --no-install-recommends {PACKAGES})"
    return None


# Where the OSD finds its object classes (cls_rgw, cls_version…), which radosgw calls. Debian 13's Ceph 18
# is built with a relative default (``lib/x86_64-linux-gnu/rados-classes``, looked up from the OSD's working
# directory): without the absolute path every class call fails with EOPNOTSUPP and radosgw exits at start
# ("could not initialize zone policy handler").
_CLASS_DIRS = ("/usr/lib/*/rados-classes", "/usr/lib64/rados-classes", "/usr/lib/rados-classes")


def rados_class_dir() -> str | None:
    """The installed directory of the RADOS object classes, or None where none is found."""
    found = (d for pattern in _CLASS_DIRS for d in sorted(glob.glob(pattern)) if glob.glob(f"{d}/libcls_rgw.so*"))
    return next(found, None)


def _port_range(span: int) -> int:
    """The first of ``span`` consecutive TCP ports free on 127.0.0.1 right now."""
    for base in range(20000 + (os.getpid() * 37) % 20000, 61000, span):
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + span):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise CephError(f"no {span} consecutive free ports on 127.0.0.1")


class CephCluster:
    """mon + OSD + radosgw under one directory. ``start()`` returns once the gateway answers."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        ready_timeout: float = 60.0,
        keep_dir: bool = False,
        memstore_bytes: int = 3 << 30,
    ) -> None:
        self.ready_timeout = ready_timeout
        self.keep_dir = keep_dir
        self.memstore_bytes = memstore_bytes
        self._base_dir = base_dir
        self.root = Path()
        self.conf = Path()
        self.rgw_port = 0
        self.access_key = "ssv-test-" + uuid.uuid4().hex[:12]
        self.secret_key = uuid.uuid4().hex + uuid.uuid4().hex
        self._daemons: list[Daemon] = []

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> CephCluster:
        reason = ceph_unavailable_reason()
        if reason:
            raise CephError(reason)
        started = time.monotonic()
        try:
            self._prepare()
            self._start_mon()
            self._start_osd()
            self._start_rgw()
            self._create_user()
        except BaseException:
            self.stop()
            raise
        log.info("ceph.started", root=str(self.root), port=self.rgw_port, seconds=round(time.monotonic() - started, 2))
        return self

    def stop(self) -> None:
        for daemon in reversed(self._daemons):
            try:
                daemon.terminate(timeout=10.0)
            except (OSError, subprocess.SubprocessError) as exc:
                log.warning("ceph.stop_failed", daemon=daemon.name, error=str(exc))
        self._daemons.clear()
        if self.root != Path() and not self.keep_dir:
            shutil.rmtree(self.root, ignore_errors=True)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.rgw_port}"

    # ----------------------------------------------------------------- setup

    def _prepare(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ceph-", dir=self._base_dir))
        for sub in ("mon", "osd", "rgw", "run", "log"):
            (self.root / sub).mkdir()
        base = _port_range(_PORT_SPAN + 1)
        self.mon_port, self.rgw_port = base, base + _PORT_SPAN
        self.fsid = str(uuid.uuid4())
        self.conf = self.root / "ceph.conf"
        self.conf.write_text(self.render_conf(base + 1, base + _PORT_SPAN - 1))
        keyring = str(self.root / "keyring")
        self._run(["ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", "mon.", "--cap", "mon", "allow *"])
        self._run(
            [
                "ceph-authtool",
                keyring,
                "--gen-key",
                "-n",
                "client.admin",
                "--cap",
                "mon",
                "allow *",
                "--cap",
                "osd",
                "allow *",
                "--cap",
                "mgr",
                "allow *",
            ]
        )
        self._run(
            [
                "monmaptool",
                "--create",
                "--fsid",
                self.fsid,
                "--addv",
                "a",
                f"[v2:127.0.0.1:{self.mon_port}]",
                str(self.root / "monmap"),
            ]
        )

    def render_conf(self, port_min: int, port_max: int) -> str:
        r = self.root
        settings = {
            "fsid": self.fsid,
            "mon host": f"[v2:127.0.0.1:{self.mon_port}]",
            "mon initial members": "a",
            "public network": "127.0.0.0/8",
            "ms bind msgr1": "false",
            "ms bind port min": str(port_min),
            "ms bind port max": str(port_max),
            "auth cluster required": "cephx",
            "auth service required": "cephx",
            "auth client required": "cephx",
            "keyring": f"{r}/keyring",
            "run dir": f"{r}/run",
            "admin socket": f"{r}/run/$name.asok",
            "pid file": f"{r}/run/$name.pid",
            "log file": f"{r}/log/$name.log",
            "crash dir": f"{r}/log",
            "mon data": f"{r}/mon/$name",
            "osd data": f"{r}/osd/$name",
            "osd objectstore": "memstore",
            **({"osd class dir": classes} if (classes := rados_class_dir()) else {}),
            "memstore device bytes": str(self.memstore_bytes),
            "osd pool default size": "1",
            "osd pool default min size": "1",
            "osd pool default pg num": "8",
            "osd pool default pgp num": "8",
            "osd crush chooseleaf type": "0",
            "mon allow pool size one": "true",
            "mon warn on pool no redundancy": "false",
            "mon max pg per osd": "1000",
            "osd pool default pg autoscale mode": "off",
            "rgw frontends": f"beast endpoint=127.0.0.1:{self.rgw_port}",
            "rgw data": f"{r}/rgw",
            "rgw dns name": "127.0.0.1",
            "rgw enable usage log": "false",
            "osd max object name len": "460",
            "osd max object namespace len": "64",
        }
        return (
            "[global]\n"
            + "".join(f"{k} = {v}\n" for k, v in settings.items())
            + f"[osd]\nkeyring = {r}/osd/$name/keyring\n"
            + f"[client.rgw.gw]\nkeyring = {r}/rgw/keyring\n"
        )

    def _daemon(self, name: str, argv: list[str]) -> Daemon:
        daemon = Daemon(name, argv, self.root / "log" / f"{name}.out", self.root / "log" / f"{name}.log")
        daemon.spawn(self._env())
        self._daemons.append(daemon)
        return daemon

    def _start_mon(self) -> None:
        self._run(
            [
                "ceph-mon",
                "-c",
                str(self.conf),
                "--mkfs",
                "-i",
                "a",
                "--monmap",
                str(self.root / "monmap"),
                "--keyring",
                str(self.root / "keyring"),
            ]
        )
        mon = self._daemon("mon.a", ["ceph-mon", "-c", str(self.conf), "-f", "-i", "a"])
        mon.wait_ready(lambda: self._try(["ceph", "mon", "stat"]) is not None, 30.0, "mon answered")
        self._run(["ceph", "config", "set", "mon", "auth_allow_insecure_global_id_reclaim", "false"])

    def _start_osd(self) -> None:
        osd_uuid = str(uuid.uuid4())
        osd_id = self._run(["ceph", "osd", "new", osd_uuid]).strip()
        data = self.root / "osd" / f"osd.{osd_id}"
        data.mkdir()
        keyring = data / "keyring"
        self._run(["ceph-authtool", "--create-keyring", str(keyring), "--gen-key", "-n", f"osd.{osd_id}"])
        self._run(
            [
                "ceph",
                "auth",
                "add",
                f"osd.{osd_id}",
                "osd",
                "allow *",
                "mon",
                "allow profile osd",
                "mgr",
                "allow profile osd",
                "-i",
                str(keyring),
            ]
        )
        self._run(["ceph-osd", "-c", str(self.conf), "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid])
        osd = self._daemon(f"osd.{osd_id}", ["ceph-osd", "-c", str(self.conf), "-f", "-i", osd_id])
        osd.wait_ready(lambda: self._osd_up(osd_id), 30.0, "OSD up")

    def _osd_up(self, osd_id: str) -> bool:
        out = self._try(["ceph", "osd", "dump", "--format", "json"])
        if not out:
            return False
        return any(str(o.get("osd")) == osd_id and o.get("up") == 1 for o in json.loads(out).get("osds", []))

    def _start_rgw(self) -> None:
        keyring = self.root / "rgw" / "keyring"
        self._run(
            [
                "ceph",
                "auth",
                "get-or-create",
                "client.rgw.gw",
                "mon",
                "allow rw",
                "osd",
                "allow rwx",
                "-o",
                str(keyring),
            ]
        )
        rgw = self._daemon(
            "client.rgw.gw", ["radosgw", "-c", str(self.conf), "-f", "-n", "client.rgw.gw", "--keyring", str(keyring)]
        )
        rgw.wait_ready(self._rgw_answers, self.ready_timeout, "radosgw answered")

    def _rgw_answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.rgw_port), timeout=1.0) as s:
                s.sendall(b"GET / HTTP/1.0\r\n\r\n")
                return s.recv(12).startswith(b"HTTP/1.")
        except OSError:
            return False

    def _create_user(self) -> None:
        self._run(
            [
                "radosgw-admin",
                "-c",
                str(self.conf),
                "user",
                "create",
                "--uid",
                "ssv-test",
                "--display-name",
                "slurm-supervisor tests",
                "--access-key",
                self.access_key,
                "--secret-key",
                self.secret_key,
            ],
            secret=True,
        )

    # ----------------------------------------------------------------- clients

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CEPH_")}
        env.update({"CEPH_CONF": str(self.conf), "PATH": search_path()})
        return env

    def _argv(self, argv: Sequence[str]) -> list[str]:
        if argv[0] == "ceph":
            return ["ceph", "-c", str(self.conf), "--connect-timeout", "10", *argv[1:]]
        if argv[0] == "rados":
            return ["rados", "-c", str(self.conf), *argv[1:]]
        return list(argv)

    def _run(
        self, argv: Sequence[str], *, timeout: float = 30.0, secret: bool = False, stdin: bytes | None = None
    ) -> str:
        full = self._argv(argv)
        done = subprocess.run(
            full,
            input=stdin,
            capture_output=True,
            timeout=timeout,  # noqa: S603
            env=self._env(),
            check=False,
        )
        if done.returncode != 0:
            shown = full[:3] if secret else full
            raise CephError(
                f"{' '.join(shown)} failed ({done.returncode}): {done.stderr.decode(errors='replace').strip()[-2000:]}"
            )
        return done.stdout.decode(errors="replace")

    def _try(self, argv: Sequence[str]) -> str | None:
        try:
            return self._run(argv, timeout=10.0)
        except (CephError, subprocess.TimeoutExpired):
            return None

    def rados(self, *args: str, stdin: bytes | None = None, timeout: float = 30.0) -> str:
        """``rados -c ceph.conf ARGS``; CephError when it fails."""
        return self._run(["rados", *args], stdin=stdin, timeout=timeout)

    def radosgw_admin(self, *args: str, timeout: float = 30.0) -> str:
        return self._run(["radosgw-admin", "-c", str(self.conf), *args], timeout=timeout)

    def rados_objects(self, pool: str = DATA_POOL) -> list[str]:
        return [line for line in self.rados("-p", pool, "ls").splitlines() if line]

    def rados_get(self, name: str, pool: str = DATA_POOL) -> bytes:
        target = self.root / "rados-get.tmp"
        self.rados("-p", pool, "get", name, str(target))
        try:
            return target.read_bytes()
        finally:
            target.unlink(missing_ok=True)

    def rados_put(self, name: str, data: bytes, pool: str = DATA_POOL) -> None:
        """Replace a RADOS object's bytes (its xattrs, radosgw's manifest among them, stay)."""
        source = self.root / "rados-put.tmp"
        source.write_bytes(data)
        try:
            self.rados("-p", pool, "put", name, str(source))
        finally:
            source.unlink(missing_ok=True)
