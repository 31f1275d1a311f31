"""The PostgreSQL store's schema, versioned in ``schema_migrations``; each migration runs once, in order.

The tables and columns are SQLite's (``adapters.sqlite.schema`` at its version 20) under the same
names, so one decoder reads both (``adapters.store_rows``); the types are PostgreSQL's: times are
``double precision`` seconds since the epoch as the engine's clock gives them, flags ``boolean``,
numbers ``bigint`` (Slurm job ids are 32 bits unsigned), ids identities. Names that are sorted
(runs, nodes) compare byte by byte (``COLLATE "C"``), as SQLite does, whatever the database's
locale. JSON stays text: what the engine wrote is what it reads back, key order and numbers alike.

Migrations are transactional (PostgreSQL's DDL is): a migration that fails leaves the version it
found. Two processes migrating one database at once take turns on an advisory lock; the second
finds nothing left to do.
"""

from __future__ import annotations

from typing import Any

import psycopg

MIGRATIONS: tuple[str, ...] = (
    # 1: every table of the store; the logbook append-only
    """
    CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    INSERT INTO meta(key, value) VALUES ('instance', substr(md5(random()::text || clock_timestamp()::text), 1, 8));
    CREATE TABLE runs (
        name TEXT COLLATE "C" PRIMARY KEY,
        spec TEXT NOT NULL,
        state TEXT NOT NULL,
        restarts_spent BIGINT NOT NULL DEFAULT 0,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        cancel_requested BOOLEAN NOT NULL DEFAULT false,
        end_reason TEXT,
        owner_uid BIGINT
    );
    CREATE TABLE attempts (
        run TEXT COLLATE "C" NOT NULL REFERENCES runs(name) ON DELETE CASCADE,
        seq BIGINT NOT NULL,
        job_id BIGINT NOT NULL,
        restart_count BIGINT NOT NULL,
        submitted_at DOUBLE PRECISION NOT NULL,
        nodes TEXT,
        excluded TEXT,
        started_at DOUBLE PRECISION,
        ended_at DOUBLE PRECISION,
        end_state TEXT,
        end_reason TEXT,
        exit_code BIGINT,
        last_step BIGINT,
        step_time_s DOUBLE PRECISION,
        hang_pace TEXT,
        load_failed TEXT,
        save_s DOUBLE PRECISION,
        failed_before_load TEXT,
        continued_with TEXT,
        PRIMARY KEY (run, seq),
        UNIQUE (run, job_id, restart_count)
    );
    CREATE TABLE exclusions (
        run TEXT COLLATE "C" NOT NULL REFERENCES runs(name) ON DELETE CASCADE,
        node TEXT COLLATE "C" NOT NULL,
        reason TEXT NOT NULL,
        since DOUBLE PRECISION NOT NULL,
        deferred BOOLEAN NOT NULL DEFAULT false,
        PRIMARY KEY (run, node)
    );
    CREATE TABLE run_tokens (
        run TEXT COLLATE "C" PRIMARY KEY REFERENCES runs(name) ON DELETE CASCADE,
        token TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE successors (
        run TEXT COLLATE "C" PRIMARY KEY REFERENCES runs(name) ON DELETE CASCADE,
        job_id BIGINT NOT NULL,
        after_seq BIGINT NOT NULL,
        submitted_at DOUBLE PRECISION NOT NULL,
        excluded TEXT NOT NULL
    );
    CREATE TABLE actions (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run TEXT NOT NULL,
        kind TEXT NOT NULL,
        params TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending', 'done', 'failed')),
        created_at DOUBLE PRECISION NOT NULL,
        completed_at DOUBLE PRECISION,
        result TEXT
    );
    CREATE TABLE events (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at DOUBLE PRECISION NOT NULL,
        run TEXT NOT NULL,
        attempt BIGINT,
        job_id BIGINT,
        kind TEXT NOT NULL,
        message TEXT NOT NULL,
        evidence TEXT NOT NULL,
        actor TEXT NOT NULL,
        key TEXT NOT NULL UNIQUE
    );
    CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'the logbook is append-only'; END
    $$;
    CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
        FOR EACH ROW EXECUTE FUNCTION events_append_only();
    CREATE TRIGGER events_append_only_truncate BEFORE TRUNCATE ON events
        FOR EACH STATEMENT EXECUTE FUNCTION events_append_only();
    CREATE TABLE nodes (
        name TEXT COLLATE "C" PRIMARY KEY,
        verdict TEXT NOT NULL,
        reason TEXT NOT NULL,
        evidence TEXT NOT NULL,
        run TEXT,
        action TEXT,
        since DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE node_faults (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        node TEXT NOT NULL,
        run TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        reason TEXT NOT NULL,
        source TEXT NOT NULL,
        key TEXT NOT NULL UNIQUE
    );
    CREATE TABLE node_changes (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        node TEXT NOT NULL,
        run TEXT NOT NULL,
        change TEXT NOT NULL CHECK (change IN ('DOWN', 'DRAIN')),
        at DOUBLE PRECISION NOT NULL,
        reason TEXT NOT NULL,
        intent BIGINT UNIQUE
    );
    CREATE TABLE node_findings (
        node TEXT COLLATE "C" PRIMARY KEY,
        finding TEXT NOT NULL
    );
    CREATE TABLE quarantine_clears (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        node TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        "by" TEXT NOT NULL,
        note TEXT NOT NULL
    );
    CREATE TABLE checkpoints (
        run TEXT COLLATE "C" NOT NULL REFERENCES runs(name) ON DELETE CASCADE,
        location TEXT NOT NULL,
        name TEXT NOT NULL,
        step BIGINT,
        guarantee TEXT NOT NULL,
        committed BOOLEAN NOT NULL,
        seen_at DOUBLE PRECISION NOT NULL,
        first_seen DOUBLE PRECISION NOT NULL,
        metadata_result TEXT,
        full_result TEXT,
        demoted TEXT,
        PRIMARY KEY (run, location)
    );
    CREATE TABLE resume_plans (
        run TEXT NOT NULL,
        attempt BIGINT NOT NULL,
        plan TEXT NOT NULL,
        PRIMARY KEY (run, attempt)
    );
    CREATE TABLE rollbacks (
        run TEXT NOT NULL,
        attempt BIGINT NOT NULL,
        onset_step BIGINT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('planned', 'done', 'blocked')),
        at DOUBLE PRECISION NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (run, attempt, onset_step)
    );
    CREATE TABLE progress (
        run TEXT NOT NULL,
        attempt BIGINT NOT NULL,
        step BIGINT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        loss DOUBLE PRECISION,
        step_time_s DOUBLE PRECISION,
        tokens_per_s DOUBLE PRECISION,
        samples_per_s DOUBLE PRECISION,
        PRIMARY KEY (run, attempt, step)
    );
    CREATE TABLE alloc_steps (
        run TEXT COLLATE "C" NOT NULL REFERENCES runs(name) ON DELETE CASCADE,
        job_id BIGINT NOT NULL,
        generation BIGINT NOT NULL,
        nodes TEXT NOT NULL,
        resume TEXT,
        reason TEXT NOT NULL,
        decided_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (run, job_id, generation)
    );
    CREATE TABLE launcher_reports (
        run TEXT COLLATE "C" NOT NULL REFERENCES runs(name) ON DELETE CASCADE,
        job_id BIGINT NOT NULL,
        generation BIGINT NOT NULL,
        alive BOOLEAN NOT NULL,
        nodes TEXT NOT NULL,
        host TEXT NOT NULL,
        exit_code BIGINT,
        at DOUBLE PRECISION NOT NULL,
        ended_at DOUBLE PRECISION,
        PRIMARY KEY (run, job_id)
    );
    """,
    # 2: indexes for the per-tick queries: open intents, faults by time, the last event of a kind,
    # node changes in the blast-radius window, the checkpoint ledger newest step first
    """
    CREATE INDEX actions_open ON actions(id) WHERE status = 'pending';
    CREATE INDEX actions_node_changes ON actions(kind, status, completed_at);
    CREATE INDEX events_run ON events(run, id);
    CREATE INDEX events_kind_at ON events(kind, at);
    CREATE INDEX events_run_kind ON events(run, kind, id);
    CREATE INDEX node_faults_at ON node_faults(at);
    CREATE INDEX node_changes_at ON node_changes(at);
    CREATE INDEX checkpoints_by_step ON checkpoints(run, step DESC NULLS LAST, first_seen DESC);
    """,
    # 3: the leader lease of the instance (issue 33: domain.lease), one row; the epoch each intent
    # was journaled under (the fencing token the leader's writes carry)
    """
    CREATE TABLE leader (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        holder TEXT NOT NULL,
        address TEXT NOT NULL,
        epoch BIGINT NOT NULL,
        since DOUBLE PRECISION NOT NULL,
        expires DOUBLE PRECISION NOT NULL
    );
    ALTER TABLE actions ADD COLUMN epoch BIGINT;
    """,
    # 4: each node's place on the remediation ladder (issue 34: domain.health.ladder), one row a node
    """
    CREATE TABLE node_care (
        node TEXT COLLATE "C" PRIMARY KEY,
        rung TEXT NOT NULL,
        since DOUBLE PRECISION NOT NULL,
        cause TEXT NOT NULL,
        rule TEXT NOT NULL,
        failures BIGINT NOT NULL,
        boot_before DOUBLE PRECISION,
        until DOUBLE PRECISION,
        evidence TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    );
    """,
    # 5: when Slurm began preempting the attempt (SQLite's version 20; issue 31)
    """
    ALTER TABLE attempts ADD COLUMN preempted_at DOUBLE PRECISION;
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)

# pg_advisory_xact_lock keys of this store (any 64-bit numbers no other program of the database
# uses): one migration at a time; one writing transaction at a time (``base.PostgresBase``).
MIGRATION_LOCK = 0x5C_5E_0001
WRITER_LOCK = 0x5C_5E_0002

_LEDGER = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    " version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
)


class SchemaTooNew(RuntimeError):
    pass


class SchemaMismatch(RuntimeError):
    """A read-only reader found a schema other than SCHEMA_VERSION; only the daemon migrates."""


def version(db: psycopg.Connection[Any]) -> int:
    """The schema version the database holds (0: none yet, or not this store's)."""
    found = db.execute("SELECT to_regclass('schema_migrations') IS NOT NULL AS present").fetchone()
    if not found or not _first(found):
        return 0
    row = db.execute("SELECT COALESCE(MAX(version), 0) AS version FROM schema_migrations").fetchone()
    return int(_first(row)) if row else 0


def require_current(db: psycopg.Connection[Any]) -> None:
    """For read-only readers: refuse a schema this code does not know."""
    found = version(db)
    if found != SCHEMA_VERSION:
        raise SchemaMismatch(
            f"the store has schema version {found}, this slurm-supervisor reads only version "
            f"{SCHEMA_VERSION}; run `slurm-supervisor store migrate` with this version"
        )


def migrate(db: psycopg.Connection[Any], target: int = SCHEMA_VERSION) -> int:
    """Bring the database to ``target`` (the newest by default); return the version it had before.

    The version is read after the migration lock is taken, inside the migration's transaction."""
    with db.transaction():
        db.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        db.execute(_LEDGER)
        before = version(db)
        if before > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"the store has schema version {before}, newer than this slurm-supervisor understands "
                f"({SCHEMA_VERSION}); run the newer version, or restore a backup"
            )
        for number in range(before + 1, target + 1):
            db.execute(MIGRATIONS[number - 1].encode())  # a script of statements, no parameters
            db.execute("INSERT INTO schema_migrations(version) VALUES (%s)", (number,))
    return before


def _first(row: Any) -> Any:
    """The first column of a row, whatever the connection's row factory (dict or tuple)."""
    return next(iter(row.values())) if isinstance(row, dict) else row[0]
