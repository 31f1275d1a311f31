"""A private PostgreSQL server for tests: Debian's ``postgresql`` binaries run by hand.

``initdb`` makes a cluster under a temporary directory (``C`` locale, UTF-8, no fsync), ``postgres``
serves it on a free port of 127.0.0.1 and a socket in that directory; nothing in /etc or
/var/lib/postgresql is touched and no system service starts. PostgreSQL refuses to run as root:
as root it runs as Debian's ``postgres`` account (the package makes it; else a test account
``ssv-postgres``), otherwise as the caller. TCP connections authenticate with a password
(``scram-sha-256``): a random one for the superuser ``supervisor``, in ``password_file`` (mode 600,
the caller's), as a site hands the daemon its password. The socket trusts whoever reaches it (only
the server's account and root can: the directory is theirs, mode 700).

``database()`` creates a fresh, empty database and answers its URL (no password in it); one
server serves a whole test session, a test gets a database of its own (~0.1 s each).
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from supervisor.testing.slurm._daemon import clean_env, free_ports, tail

if TYPE_CHECKING:
    from supervisor.testing.servers.netns import ServerNet

log = structlog.get_logger()

BINARIES = ("initdb", "postgres")
SUPERUSER = "supervisor"
_SERVER_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",  # a test server's data is thrown away: nothing to keep through a power cut
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "16MB",
    "max_connections": "100",
    "logging_collector": "off",
}


class LocalPostgresError(RuntimeError):
    """The private server could not start or answer; carries the tail of its log."""


def bin_dir() -> Path | None:
    """The newest Debian PostgreSQL's binaries (/usr/lib/postgresql/N/bin), else PATH's."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=_major, reverse=True)
    if found:
        return Path(found[0]).parent
    on_path = shutil.which("postgres")
    return Path(on_path).resolve().parent if on_path else None


def _major(path: str) -> int:
    part = Path(path).parent.parent.name
    return int(part) if part.isdigit() else 0


def unavailable_reason() -> str | None:
    """Why a LocalPostgres cannot start here (Debian package ``postgresql``), or None."""
    where = bin_dir()
    if where is None or any(not (where / b).is_file() for b in BINARIES):
        return "PostgreSQL binaries not found (apt-get install postgresql)"
    try:
        import psycopg  # noqa: F401 - only whether it imports
    except ImportError:
        return "psycopg is not installed (pip install -e '.[test]')"
    return None


@dataclass(frozen=True)
class Account:
    """Who the server runs as: subprocess keyword arguments, and the owner of its files."""

    uid: int
    gid: int

    def popen_kwargs(self) -> dict[str, Any]:
        if self.uid == os.geteuid():
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def server_account() -> Account:
    if os.geteuid() != 0:
        return Account(os.geteuid(), os.getegid())
    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:
        from supervisor.testing.slurm.users import local_user

        entry = local_user("ssv-postgres")
    return Account(entry.pw_uid, entry.pw_gid)


class LocalPostgres:
    """One private server. ``start()``; ``database()`` per test; ``stop()`` at the end."""

    def __init__(self, *, ready_timeout: float = 30.0, keep_dir: bool = False, net: ServerNet | None = None) -> None:
        self.ready_timeout = ready_timeout
        self.keep_dir = keep_dir
        self.net = net  # serve inside this namespace, on each of its links (testing.servers.netns), not 127.0.0.1
        self.account = server_account()
        self.root = Path(tempfile.mkdtemp(prefix="localpg-"))
        self.port = free_ports(1)[0]
        self.password = secrets.token_urlsafe(24)
        self.password_file = self.root / "password"  # the caller's, as a daemon's would be
        self._proc: subprocess.Popen[bytes] | None = None
        self._made = 0
        self.seconds = 0.0  # how long ``start`` took

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "run"

    @property
    def log_file(self) -> Path:
        return self.root / "postgres.log"

    def url(self, database: str = "postgres", link: int = 0) -> str:
        """A URL of a database on this server, with no password in it (over ``link`` of its namespace)."""
        host = self.net.server_address(link) if self.net is not None else "127.0.0.1"
        return f"postgresql://{SUPERUSER}@{host}:{self.port}/{database}"

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> LocalPostgres:
        reason = unavailable_reason()
        if reason:
            raise LocalPostgresError(reason)
        started = time.monotonic()
        self._prepare_dirs()
        self._initdb()
        self._serve()
        self.seconds = time.monotonic() - started
        log.info("localpg.started", port=self.port, seconds=round(self.seconds, 2))
        return self

    def stop(self) -> None:
        """Fast shutdown (SIGINT: open connections are cut), SIGKILL after 10 s; the directory goes."""
        self.halt()
        if not self.keep_dir:
            shutil.rmtree(self.root, ignore_errors=True)

    def halt(self) -> None:
        """Fast shutdown, the data kept: an outage of the database; ``serve_again`` ends it."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10.0)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5.0)

    def serve_again(self) -> None:
        """The server halted by ``halt`` started again on the same port and data."""
        self._serve()

    def database(self) -> str:
        """A new, empty database; its URL (no password in it)."""
        from psycopg import sql

        self._made += 1
        name = f"t{self._made}_{secrets.token_hex(3)}"
        with self._admin() as db:
            db.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
        return self.url(name)

    def drop(self, url: str) -> None:
        """Drop a database ``database()`` made (its connections are cut first)."""
        from psycopg import sql

        name = url.rsplit("/", 1)[1]
        with self._admin() as db:
            db.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def _admin(self) -> Any:
        import psycopg

        return psycopg.connect(self.url(), password=self.password, autocommit=True, connect_timeout=5)

    # ----------------------------------------------------------------- steps

    def _prepare_dirs(self) -> None:
        self.socket_dir.mkdir(mode=0o700)
        self.password_file.write_text(self.password + "\n")
        self.password_file.chmod(0o600)
        server_pw = self.root / "initdb-password"
        server_pw.write_text(self.password + "\n")
        server_pw.chmod(0o600)
        for path in (self.root, self.socket_dir, server_pw):
            os.chown(path, self.account.uid, self.account.gid)
        if self.account.uid != os.geteuid():
            self.root.chmod(0o711)  # the caller reaches its password file; nobody lists the directory

    def _initdb(self) -> None:
        where = bin_dir()
        assert where is not None
        argv = [
            str(where / "initdb"),
            f"--pgdata={self.data}",
            f"--username={SUPERUSER}",
            f"--pwfile={self.root / 'initdb-password'}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ]
        done = subprocess.run(  # noqa: S603 - fixed argv, no shell
            argv, capture_output=True, text=True, timeout=120, env=clean_env({}), check=False, **self._as()
        )
        (self.root / "initdb-password").unlink()
        if done.returncode != 0:
            raise LocalPostgresError(f"initdb failed ({done.returncode}): {done.stderr.strip()[-800:]}")

    def _serve(self) -> None:
        where = bin_dir()
        assert where is not None
        argv = [str(where / "postgres"), "-D", str(self.data), "-p", str(self.port), "-k", str(self.socket_dir)]
        for key, value in _SERVER_SETTINGS.items():
            argv += ["-c", f"{key}={value}"]
        if self.net is not None:
            listen = ",".join(self.net.server_address(i) for i in range(self.net.links))
            # the namespace is entered as root, then the server's account is taken (setpriv, util-linux)
            who = self.account
            drop = ["setpriv", f"--reuid={who.uid}", f"--regid={who.gid}", "--clear-groups", "--"]
            argv = [*self.net.exec_prefix, *(drop if who.uid != os.geteuid() else []), *argv]
            argv += ["-c", f"listen_addresses={listen}"]
            with (self.data / "pg_hba.conf").open("a") as hba:  # the links' clients, with the password
                hba.write("host all all 10.0.0.0/8 scram-sha-256\n")
        fd = os.open(self.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.fchown(fd, self.account.uid, self.account.gid)
            self._proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
                argv,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=fd,
                env=clean_env({}),
                start_new_session=True,
                **({} if self.net is not None else self._as()),
            )
        finally:
            os.close(fd)
        self._wait_ready()

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + self.ready_timeout
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise LocalPostgresError(f"postgres exited ({self._proc.returncode}):\n{tail(self.log_file)}")
            try:
                with self._admin():
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise LocalPostgresError(
                        f"postgres did not answer within {self.ready_timeout:.0f} s:\n{tail(self.log_file)}"
                    ) from None
                time.sleep(0.05)

    def _as(self) -> dict[str, Any]:
        return self.account.popen_kwargs()


class Databases:
    """One test's databases on the session's server: ``url`` (made at once), ``new()`` for more
    (another daemon's store); ``drop_all()`` at the test's end."""

    def __init__(self, server: LocalPostgres) -> None:
        self.server = server
        self.made: list[str] = []
        self.url = self.new()

    @property
    def password(self) -> str:
        return self.server.password

    @property
    def password_file(self) -> Path:
        return self.server.password_file

    def new(self) -> str:
        url = self.server.database()
        self.made.append(url)
        return url

    def drop_all(self) -> None:
        for url in self.made:
            self.server.drop(url)
        self.made.clear()
