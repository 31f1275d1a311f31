"""Slurm accounting for a private test cluster: a private MariaDB and a real slurmdbd.

Debian's ``mariadb-server`` binaries are run by hand as a private instance: ``mariadb-install-db``
creates a data directory under the cluster's directory, ``mariadbd`` serves it on a free port of
127.0.0.1 (and a socket beside it) as root, with a small buffer pool; nothing in /etc or
/var/lib/mysql is touched and no system service starts. Debian's ``slurmdbd`` is pointed at it
(as the database's root user, which has no password in a private instance), authenticates with
the cluster's munged, and listens on another free port; ``slurm_settings`` gives the slurm.conf
lines that send the cluster's accounting there. ``LocalSlurm(accounting=True)`` starts all this
between munged and slurmctld and registers the cluster with ``sacctmgr``.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from supervisor.testing.slurm._daemon import Daemon, LocalSlurmError, clean_env, find_binary, free_ports

log = structlog.get_logger()

DATABASE_BINARIES = ("mariadbd", "mariadb-install-db", "mariadb")
ACCOUNTING_BINARIES = ("slurmdbd", "sacct", "sacctmgr")
STORAGE_LOC = "slurm_acct_db"


def accounting_unavailable_reason() -> str | None:
    """Why accounting cannot start here (Debian packages ``slurmdbd``, ``mariadb-server``), or None."""
    missing = [b for b in DATABASE_BINARIES + ACCOUNTING_BINARIES if find_binary(b) is None]
    if missing:
        return f"accounting binaries not found: {', '.join(missing)} (apt-get install slurmdbd mariadb-server)"
    return None


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Accounting:
    """MariaDB and slurmdbd for one private cluster, everything under ``root``.

    ``start`` needs the cluster's munged running and its slurm.conf written: slurmdbd reads
    slurmdbd.conf from the directory of ``SLURM_CONF`` (it has no option for another path), and
    ``sacctmgr`` reads slurm.conf to register the cluster. ``terminate`` ends both daemons.
    """

    name = "accounting"

    def __init__(
        self, root: Path, *, slurm_conf: Path, munge_socket: Path, cluster: str, ready_timeout: float = 30.0
    ) -> None:
        self.root = root
        self.slurm_conf = slurm_conf
        self.munge_socket = munge_socket
        self.cluster = cluster
        self.ready_timeout = ready_timeout
        self.db_port, self.dbd_port = free_ports(2)
        self._mariadb: Daemon | None = None
        self._slurmdbd: Daemon | None = None
        self.seconds = 0.0  # how long ``start`` took

    def slurm_settings(self) -> dict[str, str]:
        """slurm.conf lines that send the cluster's job records to this slurmdbd. Jobs' resource
        use is not gathered (``jobacct_gather/none``): job records and outcomes need no sampling."""
        return {
            "AccountingStorageType": "accounting_storage/slurmdbd",
            "AccountingStorageHost": "127.0.0.1",
            "AccountingStoragePort": str(self.dbd_port),
            # With slurmdbd this is the munge socket for connections to it (AuthInfo is not used).
            "AccountingStoragePass": str(self.munge_socket),
            "JobAcctGatherType": "jobacct_gather/none",
        }

    # ----------------------------------------------------------------- lifecycle

    def start(self, env: dict[str, str]) -> Accounting:
        reason = accounting_unavailable_reason()
        if reason:
            raise LocalSlurmError(reason)
        started = time.monotonic()
        for sub in ("db", "log", "run"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._install_db()
        self._mariadb = self._start_mariadb(env)
        self._create_database()
        self._slurmdbd = self._start_slurmdbd(env)
        self.seconds = time.monotonic() - started
        log.info("localslurm.accounting_started", seconds=round(self.seconds, 2), dbd_port=self.dbd_port)
        return self

    def register(self, run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
        """Add the cluster to the database (``sacctmgr``, through the cluster's ``run``), so that
        slurmctld's first connection finds it."""
        run(["sacctmgr", "-i", "add", "cluster", self.cluster], check=True, timeout=30)

    def terminate(self, *, timeout: float = 10.0) -> None:
        """Stop slurmdbd, then MariaDB (each SIGTERM, then SIGKILL after ``timeout``)."""
        for daemon in (self._slurmdbd, self._mariadb):
            if daemon is not None:
                daemon.terminate(timeout=timeout)

    # ----------------------------------------------------------------- MariaDB

    def _db_options(self) -> list[str]:
        """Options for both install and server: private paths, small memory, no name lookups."""
        return [
            "--no-defaults",
            f"--datadir={self.root / 'db'}",
            "--user=root",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=16M",
            "--innodb-log-file-size=4M",
        ]

    def _install_db(self) -> None:
        install = Daemon(
            "mariadb-install-db",
            [
                str(find_binary("mariadb-install-db")),
                *self._db_options(),
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            self.root / "log" / "mariadb-install.out",
            None,
        )
        install.spawn(clean_env({}))
        assert install.proc is not None
        if install.proc.wait(60.0) != 0:
            raise LocalSlurmError(install.describe("failed"))

    @property
    def db_socket(self) -> Path:
        return self.root / "run" / "mariadb.sock"

    def _start_mariadb(self, env: dict[str, str]) -> Daemon:
        argv = [
            str(find_binary("mariadbd")),
            *self._db_options(),
            f"--socket={self.db_socket}",
            f"--port={self.db_port}",
            "--bind-address=127.0.0.1",
            f"--pid-file={self.root / 'run' / 'mariadb.pid'}",
            f"--log-error={self.root / 'log' / 'mariadb.log'}",
            "--skip-log-bin",
        ]
        logs = self.root / "log"
        daemon = Daemon("mariadbd", argv, logs / "mariadb.out", logs / "mariadb.log")
        daemon.spawn(clean_env(env))
        daemon.wait_ready(lambda: _port_open(self.db_port), self.ready_timeout, "did not listen")
        return daemon

    def _create_database(self) -> None:
        """slurmdbd creates its database itself when it finds none, then reconnects with the same
        MYSQL handle — which Debian 13's MariaDB Connector/C (3.4.10) leaves broken: slurmdbd dies
        (``_check_mysql_concat_is_sane: null result``) on every empty database. Made here first, as
        a site's first start needs it too (docs/slurm-releases.md)."""
        argv = [
            str(find_binary("mariadb")),
            "--no-defaults",
            f"--socket={self.db_socket}",
            "--user=root",
            "--execute",
            f"CREATE DATABASE IF NOT EXISTS {STORAGE_LOC}",
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=clean_env({}), check=False)
        if done.returncode != 0:
            raise LocalSlurmError(f"could not create the accounting database: {done.stderr.strip()[:300]}")

    # ----------------------------------------------------------------- slurmdbd

    def _write_conf(self) -> Path:
        conf = self.slurm_conf.parent / "slurmdbd.conf"  # slurmdbd reads it beside SLURM_CONF
        lines = {
            "AuthType": "auth/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "DbdHost": "localhost",
            "DbdAddr": "127.0.0.1",
            "DbdPort": str(self.dbd_port),
            "SlurmUser": pwd.getpwuid(os.geteuid()).pw_name,  # as slurm.conf's: the owner of this file
            "DebugLevel": "info",
            "LogFile": str(self.root / "log" / "slurmdbd.log"),
            "PidFile": str(self.root / "run" / "slurmdbd.pid"),
            "StorageType": "accounting_storage/mysql",
            "StorageHost": "127.0.0.1",
            "StoragePort": str(self.db_port),
            "StorageUser": "root",
            "StorageLoc": STORAGE_LOC,
        }
        conf.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
        conf.chmod(0o600)  # slurmdbd refuses a config others can read
        return conf

    def _start_slurmdbd(self, env: dict[str, str]) -> Daemon:
        self._write_conf()
        argv = [str(find_binary("slurmdbd")), "-D"]
        logs = self.root / "log"
        daemon = Daemon("slurmdbd", argv, logs / "slurmdbd.out", logs / "slurmdbd.log")
        daemon.spawn(clean_env(env))
        daemon.wait_ready(lambda: _port_open(self.dbd_port), self.ready_timeout, "did not listen")
        return daemon
