"""Builds the real adapters from the daemon configuration. Wiring only: no decisions here."""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import structlog

from supervisor.adapters.clock import SystemClock
from supervisor.adapters.fence import CommandFencer
from supervisor.adapters.guard_client import GuardClient
from supervisor.adapters.logtail import LogTail
from supervisor.adapters.paging.webhook import Pager, PagerSettings, WebhookNotifier, notify_new_events, read_secret
from supervisor.adapters.run_files import daemon_dirs as default_daemon_dirs
from supervisor.adapters.secrets import read_secret as read_secret_file
from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.adapters.slurm.config import has_accounting, kill_wait_s
from supervisor.adapters.slurm.reads import own_account, own_user
from supervisor.adapters.slurm.sacct import SacctCli
from supervisor.adapters.sqlite import DB_NAME, SqliteStore
from supervisor.adapters.wake_clock import WakeableClock
from supervisor.adapters.web.ingest import IngestServer, ReportIngest
from supervisor.adapters.web.launcher_channel import LAUNCHER_PREFIX, LauncherChannel
from supervisor.adapters.web.pages import PageSettings, mount_pages
from supervisor.adapters.web.renderer import ProcessRenderer
from supervisor.adapters.web.server import HttpServer, server_tls
from supervisor.adapters.web.tokens import TokenBook
from supervisor.config import DaemonConfig
from supervisor.domain.checkpoints.signing import manifest_key
from supervisor.domain.health.findings import HeartbeatSettings
from supervisor.domain.health.gpu_health import HealthRules
from supervisor.domain.health.gpu_table import GpuHealthSettings
from supervisor.domain.health.quarantine import QuarantineSettings
from supervisor.domain.progress.hang import HangSettings
from supervisor.domain.run import RunSpec
from supervisor.engine.reconcile import EngineSettings
from supervisor.engine.watch.checkpoints import CheckpointWatch
from supervisor.engine.watch.progress import ProgressWatch
from supervisor.ports import CheckpointStore, Clock, PortError, ProgressLedger, Store

if TYPE_CHECKING:
    from supervisor.adapters.postgres import PostgresStore
    from supervisor.adapters.web.renderer import Renderer
    from supervisor.api.client import Reader
    from supervisor.api.server import ApiServer
    from supervisor.engine.facts.hang_stacks import HangStacks
    from supervisor.engine.loop.leadership import Leadership

    DaemonStore = SqliteStore | PostgresStore

log = structlog.get_logger(__name__)


def scheduler(cfg: DaemonConfig) -> SlurmCli:
    """Slurm, read as the instance's account sees its own work: that account's jobs only (it
    submits every job it supervises as itself), not every user's (bench/README.md, issue 14)."""
    return SlurmCli(
        bin_dir=str(cfg.slurm.bin_dir) if cfg.slurm.bin_dir else None,
        slurm_conf=str(cfg.slurm.slurm_conf) if cfg.slurm.slurm_conf else None,
        timeout=cfg.slurm.command_timeout_s,
        user=own_user(),
    )


def from_slurm_config(scheduler: SlurmCli, settings: EngineSettings) -> EngineSettings:
    """What decisions need from Slurm's own configuration, read once at start (KillWait); Slurm's
    defaults, said in the log, when the controller cannot answer."""
    try:
        config = scheduler.show_config()
    except PortError as exc:
        log.warning("slurm_config_unread", error=str(exc), kill_wait_s=settings.kill_wait_s)
        return settings
    return replace(settings, kill_wait_s=kill_wait_s(config))


def accounting(scheduler: SlurmCli) -> SacctCli | None:
    """``sacct`` for the outcomes of jobs squeue forgot, when the cluster keeps job accounting
    (slurmdbd; read from Slurm's configuration at start). None without: such a job's outcome is
    then unknown, and the logbook says why. When the controller cannot say, sacct is tried (a
    failing sacct says why in the logbook)."""
    try:
        config = scheduler.show_config()
    except PortError as exc:
        log.warning("slurm_accounting_unknown", error=str(exc))
        config = {"AccountingStorageType": "unknown"}
    if not has_accounting(config):
        log.info("slurm_accounting_none", detail="outcomes of jobs squeue forgot cannot be read")
        return None
    return SacctCli(bin_dir=scheduler.bin_dir, slurm_conf=scheduler.slurm_conf, timeout=scheduler.timeout)


def store(cfg: DaemonConfig, *, read_only: bool = False, opened: list[DaemonStore] | None = None) -> DaemonStore:
    """A connection to the instance's store, as ``[store]`` chooses: SQLite in the state directory
    (no url, the default), or the PostgreSQL database of ``url``, with the password from
    ``password_file`` or the systemd credential — handed to libpq, never logged. Each caller
    (the engine, the API, the ingest, the launcher channel) gets a connection of its own; a
    writer's is added to ``opened`` (the connections the leader's epoch fences)."""
    made = _open_store(cfg, read_only)
    if opened is not None and not read_only:
        opened.append(made)
    return made


def _open_store(cfg: DaemonConfig, read_only: bool) -> DaemonStore:
    if not cfg.store.postgres:
        return SqliteStore(Path(cfg.daemon.state_dir), read_only=read_only)
    from supervisor.adapters.postgres import PostgresStore, StoreUnreachable, safe_url

    url = cfg.store.url
    assert url is not None
    try:
        opened = PostgresStore(
            url, password=store_password(cfg), read_only=read_only, connect_timeout_s=cfg.store.connect_timeout_s
        )
    except StoreUnreachable as exc:
        raise click.ClickException(str(exc)) from None
    log.debug("store_opened", kind="postgres", url=safe_url(url), read_only=read_only)
    return opened


def migrate_store(cfg: DaemonConfig) -> tuple[str, int, int]:
    """Bring the instance's store to this code's schema: (where, version before, version now)."""
    if not cfg.store.postgres:
        from supervisor.adapters.sqlite.schema import SCHEMA_VERSION

        path = Path(cfg.daemon.state_dir) / DB_NAME
        before = _sqlite_version(path)
        SqliteStore(Path(cfg.daemon.state_dir)).close()  # opening migrates
        return str(path), before, SCHEMA_VERSION
    from supervisor.adapters.postgres import StoreUnreachable, migrate_database, safe_url
    from supervisor.adapters.postgres.schema import SCHEMA_VERSION as PG_VERSION

    url = cfg.store.url
    assert url is not None
    try:
        before = migrate_database(url, store_password(cfg), cfg.store.connect_timeout_s)
    except StoreUnreachable as exc:
        raise click.ClickException(str(exc)) from None
    return safe_url(url), before, PG_VERSION


def _sqlite_version(path: Path) -> int:
    """The schema version of the SQLite file (0: none yet)."""
    if not path.is_file():
        return 0
    db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def store_password(cfg: DaemonConfig, environ: Mapping[str, str] = os.environ) -> str | None:
    """The store's password from ``[store] password_file`` or ``password_credential`` (its owner and
    mode checked like every secret); None when neither is set."""
    s = cfg.store
    try:
        path = s.credential_path(environ)
        if path is None:
            return None
        what = "password_file" if s.password_file is not None else "password_credential"
        return read_secret_file(path, what, "store")
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def existing_store(state_dir: Path) -> Reader | None:
    """The store a daemon left in ``state_dir``, for the CLI's reads while no daemon answers; None
    when there is none, or this account may not open it (another instance's, not root)."""
    if not (state_dir / DB_NAME).is_file():
        return None
    try:
        return SqliteStore(state_dir)
    except (sqlite3.Error, OSError):
        return None


def api_server(cfg: DaemonConfig, clock: SystemClock, opened: list[DaemonStore] | None = None) -> ApiServer:
    """The instance's local API (``[api]``) over a store connection of its own; submits are checked
    with Slurm as the instance's account."""
    from supervisor.api.identity import instance
    from supervisor.api.ops import Operations
    from supervisor.api.server import ApiServer

    ops = Operations(store(cfg, opened=opened), clock, instance(cfg.api.group, cfg.api.admin_group), scheduler(cfg))
    return ApiServer(cfg.api.socket_path(cfg.daemon.state_dir), ops.answer, instance=ops.instance)


def engine_settings(cfg: DaemonConfig) -> EngineSettings:
    h, q = cfg.health, cfg.quarantine
    return EngineSettings(
        may_change_nodes=cfg.may_change_nodes,
        max_drains_per_hour=cfg.daemon.max_drains_per_hour,
        max_drains_per_run_per_hour=cfg.daemon.max_drains_per_run_per_hour,
        probe_confirm_s=cfg.probe.confirm_after_s,
        heartbeat=HeartbeatSettings(h.heartbeat_timeout_s, h.heartbeat_startup_grace_s),
        finding_ttl_s=h.finding_ttl_s,
        quarantine=QuarantineSettings(q.faults, q.window_h * 3600, q.base_h * 3600, q.max_h * 3600, q.when_short),
        stuck_page_s=cfg.daemon.stuck_page_after_s,
        outage_logged_after_s=2 * cfg.daemon.poll_interval_s,
        account=own_account(),
    )


def clock() -> WakeableClock:
    """The system clock; the launcher channel may cut the loop's wait short (a hint to tick now)."""
    return WakeableClock()


def fencer(cfg: DaemonConfig) -> CommandFencer | None:
    return CommandFencer(cfg.fence.command) if cfg.fence.command else None


def guard(cfg: DaemonConfig) -> GuardClient | None:
    """The node guard's client when ``[guard] socket`` is set: node changes go through it."""
    g = cfg.guard
    return GuardClient(str(g.socket), timeout_s=g.timeout_s) if g.socket is not None else None


def progress(cfg: DaemonConfig, ledger: ProgressLedger | None = None) -> ProgressWatch | None:
    """Hang detection from each running attempt's output file (``[hang]``); the loss, step-time
    and throughput series it reads are kept in ``ledger`` (the store) for goodput and the page."""
    if not cfg.hang.enabled:
        return None
    settings = HangSettings(
        multiple=cfg.hang.multiple,
        floor_s=cfg.hang.floor_s,
        cap_s=cfg.hang.cap_s,
        startup_grace_s=cfg.hang.startup_grace_s,
        pause_cap_s=cfg.hang.pause_cap_s,
    )
    dirs = daemon_dirs(cfg)
    opener = lambda path, at_end: LogTail(path, start_at_end=at_end, protected=dirs)  # noqa: E731
    return ProgressWatch(opener, settings, ledger=ledger)


def daemon_dirs(cfg: DaemonConfig) -> tuple[str, ...]:
    """The daemon's own folders and secret files: no file of a run is read or written there."""
    state, n, i = cfg.daemon.state_dir, cfg.notify, cfg.ingest
    secrets = (i.hook_token_file, i.read_token_file, i.tls_key_file, n.webhook_url_file, n.routing_key_file)
    secret_files = [f for f in (*secrets, cfg.store.password_file) if f]
    return default_daemon_dirs([state, cfg.api.socket_path(state).parent, *secret_files])


def checkpoint_store(spec: RunSpec, key: bytes | None = None) -> CheckpointStore:
    """The run's checkpoint store, from its ``[checkpoints]`` section (S3 or a directory); ``key``:
    the run's manifest key (domain.checkpoints.signing), with which its manifests are checked."""
    from supervisor.adapters.checkpoints.store import open_store

    policy = spec.checkpoints
    assert policy is not None
    bandwidth = policy.bandwidth_mb_s * 1e6 if policy.bandwidth_mb_s else None
    s3: dict[str, Any] = {}
    if policy.root.startswith("s3://"):
        s3 = {k: v for k, v in (("endpoint_url", policy.endpoint_url), ("region", policy.region)) if v is not None}
    return open_store(
        policy.root,
        bandwidth_bytes_s=bandwidth,
        uncommitted_grace_s=policy.upload_grace_s,
        key=key,
        trust=policy.trust,
        **s3,
    )


def checkpoints(clock: SystemClock, cfg: DaemonConfig | None = None, tokens: Store | None = None) -> CheckpointWatch:
    """Verification of each run's checkpoints and the resume choice at every submission; each
    run's manifests checked with the key derived from its token in ``tokens`` (the daemon's store)."""
    from supervisor.adapters.checkpoints.resume_file import write_resume_file

    dirs = daemon_dirs(cfg) if cfg is not None else None

    def factory(spec: RunSpec) -> CheckpointStore:
        return checkpoint_store(spec, manifest_key(tokens.run_token(spec.name)) if tokens is not None else None)

    return CheckpointWatch(factory, clock, write_resume=lambda path, text: write_resume_file(path, text, dirs))


def gpu_health(cfg: DaemonConfig) -> GpuHealthSettings:
    return cfg.gpu_health.to_settings()


def ingest(
    cfg: DaemonConfig, clock: SystemClock, opened: list[DaemonStore] | None = None
) -> tuple[ReportIngest, IngestServer] | None:
    """The agents' and hooks' endpoint, accepting each active run's token (``[ingest]``)."""
    i = cfg.ingest
    if not i.enabled:
        return None
    tokens_store = store(cfg, opened=opened)  # the ingest thread's own connection
    try:  # the hook token file is a secret: its owner and mode are checked (ValueError says the fix)
        book = TokenBook(
            tokens_store.active_tokens,
            hook_token_file=str(cfg.ingest.hook_token_file) if cfg.ingest.hook_token_file else None,
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    feed = ReportIngest(book, HealthRules(gpu_health(cfg)), clock)
    server = IngestServer(feed, cfg.ingest.bind, cfg.ingest.port, cfg.ingest.max_body_bytes)
    # in-allocation launchers poll here (docs/in-allocation.md); a store connection of its own, off the event loop
    wake = clock.wake if isinstance(clock, WakeableClock) else None  # a dead step: tick now, not at the next poll
    channel = LauncherChannel(book, store(cfg, opened=opened), clock, wake, counters=server.counters)
    server.mount(LAUNCHER_PREFIX, channel.handle, blocking=True)
    http_options(server, cfg)
    try:  # the read token is a secret like the hook token
        read_token = read_secret_file(i.read_token_file, "read_token_file", "ingest") if i.read_token_file else None
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    mount_pages(server, page_renderer(cfg), read_token, PageSettings(ttl_s=cfg.daemon.poll_interval_s))
    return feed, server


def page_renderer(cfg: DaemonConfig) -> Renderer:
    """SQLite: a child process with a read-only connection of its own (``ProcessRenderer``).
    PostgreSQL: a read-only connection of its own in the server's worker thread (every transaction
    read-only on the server's side)."""
    if not cfg.store.postgres:
        return ProcessRenderer(cfg.daemon.state_dir)
    from supervisor.adapters.web.renderer import ThreadRenderer

    return ThreadRenderer(store(cfg, read_only=True))


def http_options(server: HttpServer, cfg: DaemonConfig) -> None:
    """The server's caps, deadlines and TLS from ``[ingest]`` (set before ``start``)."""
    i = cfg.ingest
    server.limits = replace(
        server.limits,
        max_connections=i.max_connections,
        max_connections_per_peer=i.max_connections_per_peer,
        request_deadline_s=i.request_deadline_s,
        idle_timeout_s=i.idle_timeout_s,
        node_networks=tuple(i.node_networks),
    )
    if i.tls_cert_file is None or i.tls_key_file is None:
        return
    try:
        read_secret_file(i.tls_key_file, "tls_key_file", "ingest")  # the key's owner and mode, like every secret
        server.ssl = server_tls(str(i.tls_cert_file), str(i.tls_key_file))
    except (ValueError, OSError) as exc:  # ssl.SSLError is an OSError
        raise click.ClickException(f"[ingest] tls_cert_file/tls_key_file: {exc}") from None


def advertised_url(cfg: DaemonConfig, server: IngestServer) -> str:
    if cfg.ingest.advertise_url:
        return cfg.ingest.advertise_url.rstrip("/")
    host = cfg.ingest.bind if cfg.ingest.bind not in ("0.0.0.0", "::", "") else socket.getfqdn()
    scheme = "https" if server.ssl is not None else "http"
    return f"{scheme}://{host}:{server.port}"


def pager(
    cfg: DaemonConfig, store: DaemonStore, clock: SystemClock
) -> tuple[WebhookNotifier, Callable[[], None]] | None:
    """The webhook notifier and the after-tick call that feeds it new logbook events (``[notify]``)."""
    n = cfg.notify
    if n.webhook_url_file is None:
        return None
    url = read_secret(n.webhook_url_file, "webhook_url_file")
    key = read_secret(n.routing_key_file, "routing_key_file") if n.routing_key_file else None
    notifier = WebhookNotifier(
        url,
        n.format,
        routing_key=key,
        timeout_s=n.timeout_s,
        retries=n.retries,
        pager=Pager(PagerSettings(frozenset(n.kinds), n.rollbacks, n.rollback_window_s)),
        source=socket.getfqdn(),
    )
    cursor = [store.last_event_id()]  # events from before this daemon started do not page again

    def after_tick() -> None:
        cursor[0] = notify_new_events(store, notifier, cursor[0])

    return notifier, after_tick


def leadership(
    cfg: DaemonConfig, engine_store: DaemonStore, fenced: list[DaemonStore], address: str
) -> Leadership | None:
    """The leader lease when the store is shared (PostgreSQL): the daemons of the account on every
    login node elect one leader through it (``engine.loop.leadership``). None with SQLite: one machine,
    one daemon, its lock on the state directory."""
    if not cfg.store.postgres:
        return None
    from supervisor.engine.loop.leadership import Leadership, LeaseSettings, new_holder

    lease_s = cfg.store.lease_s
    settings = LeaseSettings(lease_s=lease_s, margin_s=lease_s / 5, inflight_s=cfg.slurm.command_timeout_s)
    return Leadership(engine_store, engine_store, fenced, holder=new_holder(), address=address, settings=settings)


def stacks(cfg: DaemonConfig, clock: Clock, leadership: Leadership | None = None) -> HangStacks | None:
    """A hang's stacks before the cancel (``[stacks]``): an overlapping step of the hung job runs
    the node agent's capture; the files go to STATE/stacks/RUN/."""
    if not cfg.stacks.enabled or not cfg.hang.enabled:
        return None
    from supervisor.adapters.slurm.cli import client_env
    from supervisor.adapters.slurm.stack_capture import CaptureSettings, SrunStackCapture
    from supervisor.adapters.stack_files import StackFileLimits, StackFiles
    from supervisor.engine.facts.hang_stacks import HangStacks

    s = cfg.stacks
    beside = Path(sys.executable).with_name("py-spy")
    py_spy = s.py_spy or (str(beside) if beside.exists() else "py-spy")
    bin_dir = cfg.slurm.bin_dir
    srun = str(Path(bin_dir) / "srun") if bin_dir else shutil.which("srun") or "srun"
    settings = CaptureSettings(deadline_s=s.deadline_s, native=s.native, py_spy=py_spy, srun=srun)
    # the Slurm clients' environment: SLURM_CONF, and none of the daemon's secrets in the job's step
    conf = str(cfg.slurm.slurm_conf) if cfg.slurm.slurm_conf else None
    capture = SrunStackCapture(settings, client_env(os.environ, slurm_conf=conf))
    limits = StackFileLimits(per_rank_bytes=s.max_rank_bytes, total_bytes=s.max_file_bytes, keep=s.keep)
    files = StackFiles(Path(cfg.daemon.state_dir) / "stacks", limits)
    return HangStacks(capture, files, clock, leadership.may_act if leadership is not None else None)
