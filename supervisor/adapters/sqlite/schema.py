"""The store's schema, versioned with SQLite's ``user_version``; each migration runs once, in order."""

from __future__ import annotations

import sqlite3

MIGRATIONS: tuple[str, ...] = (
    # 1: runs, attempts, nodes, exclusions, the intent journal, the logbook
    """
    CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    INSERT INTO meta(key, value) VALUES ('instance', lower(hex(randomblob(4))));
    CREATE TABLE runs (
        name TEXT PRIMARY KEY,
        spec TEXT NOT NULL,
        state TEXT NOT NULL,
        restarts_spent INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        end_reason TEXT
    );
    CREATE TABLE attempts (
        run TEXT NOT NULL REFERENCES runs(name) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        job_id INTEGER NOT NULL,
        restart_count INTEGER NOT NULL,
        submitted_at REAL NOT NULL,
        nodes TEXT,
        excluded TEXT,
        started_at REAL,
        ended_at REAL,
        end_state TEXT,
        end_reason TEXT,
        exit_code INTEGER,
        PRIMARY KEY (run, seq),
        UNIQUE (run, job_id, restart_count)
    );
    CREATE TABLE exclusions (
        run TEXT NOT NULL REFERENCES runs(name) ON DELETE CASCADE,
        node TEXT NOT NULL,
        reason TEXT NOT NULL,
        since REAL NOT NULL,
        PRIMARY KEY (run, node)
    );
    CREATE TABLE nodes (
        name TEXT PRIMARY KEY,
        verdict TEXT NOT NULL,
        reason TEXT NOT NULL,
        evidence TEXT NOT NULL,
        run TEXT,
        action TEXT,
        since REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE actions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run TEXT NOT NULL,
        kind TEXT NOT NULL,
        params TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending', 'done', 'failed')),
        created_at REAL NOT NULL,
        completed_at REAL,
        result TEXT
    );
    CREATE INDEX actions_open ON actions(status) WHERE status = 'pending';
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        run TEXT NOT NULL,
        attempt INTEGER,
        job_id INTEGER,
        kind TEXT NOT NULL,
        message TEXT NOT NULL,
        evidence TEXT NOT NULL,
        actor TEXT NOT NULL,
        key TEXT NOT NULL UNIQUE
    );
    CREATE INDEX events_run ON events(run, id);
    CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
        BEGIN SELECT RAISE(ABORT, 'the logbook is append-only'); END;
    CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
        BEGIN SELECT RAISE(ABORT, 'the logbook is append-only'); END;
    """,
    # 2: checkpoints seen in each run's storage and what their verifications found
    """
    CREATE TABLE checkpoints (
        run TEXT NOT NULL REFERENCES runs(name) ON DELETE CASCADE,
        location TEXT NOT NULL,
        name TEXT NOT NULL,
        step INTEGER,
        guarantee TEXT NOT NULL,
        committed INTEGER NOT NULL,
        seen_at REAL NOT NULL,
        first_seen REAL NOT NULL,
        metadata_result TEXT,
        full_result TEXT,
        demoted TEXT,
        PRIMARY KEY (run, location)
    );
    """,
    # 3: degraded nodes kept out from the next boundary; operators' clears of quarantined nodes
    """
    ALTER TABLE exclusions ADD COLUMN deferred INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE quarantine_clears (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        node TEXT NOT NULL,
        at REAL NOT NULL,
        by TEXT NOT NULL,
        note TEXT NOT NULL
    );
    """,
    # 4: each run's telemetry token (agents and hooks authenticate with it)
    """
    CREATE TABLE run_tokens (
        run TEXT PRIMARY KEY REFERENCES runs(name) ON DELETE CASCADE,
        token TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    """,
    # 5: indexes for the per-tick queries (faults by kind and time, the last event of a kind,
    # node changes in the blast-radius window)
    """
    CREATE INDEX events_kind_at ON events(kind, at);
    CREATE INDEX events_run_kind ON events(run, kind, id);
    CREATE INDEX actions_node_changes ON actions(kind, status, completed_at);
    """,
    # 6: typed records the engine reads back, each in its own table (never logbook evidence):
    # faults pinned on nodes (quarantine), node changes made (blast radius), rollbacks, and the
    # attempts' progress (last step, step time). Earlier databases are carried over once.
    """
    CREATE TABLE node_faults (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        node TEXT NOT NULL,
        run TEXT NOT NULL,
        at REAL NOT NULL,
        reason TEXT NOT NULL,
        source TEXT NOT NULL,
        key TEXT NOT NULL UNIQUE
    );
    CREATE INDEX node_faults_at ON node_faults(at);
    INSERT OR IGNORE INTO node_faults(node, run, at, reason, source, key)
        SELECT json_extract(evidence, '$.node'), run, at, COALESCE(json_extract(evidence, '$.observed'), 'fault'),
               'fault', key
        FROM events WHERE kind = 'fault' AND json_extract(evidence, '$.node') IS NOT NULL ORDER BY id;
    CREATE TABLE node_changes (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        node TEXT NOT NULL,
        run TEXT NOT NULL,
        change TEXT NOT NULL CHECK (change IN ('DOWN', 'DRAIN')),
        at REAL NOT NULL,
        reason TEXT NOT NULL,
        intent INTEGER UNIQUE
    );
    CREATE INDEX node_changes_at ON node_changes(at);
    INSERT OR IGNORE INTO node_changes(node, run, change, at, reason, intent)
        SELECT json_extract(params, '$.node'), run, json_extract(params, '$.change'), completed_at,
               COALESCE(json_extract(params, '$.reason'), ''), id
        FROM actions WHERE kind = 'node_state' AND status = 'done' AND json_extract(params, '$.change') IN ('DOWN', 'DRAIN');
    CREATE TABLE rollbacks (
        run TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        onset_step INTEGER NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('planned', 'done', 'blocked')),
        at REAL NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (run, attempt, onset_step)
    );
    INSERT OR IGNORE INTO rollbacks(run, attempt, onset_step, status, at, record)
        SELECT run, attempt, json_extract(evidence, '$.onset_step'), 'planned', at,
               json_object('run', run, 'attempt', attempt, 'onset_step', json_extract(evidence, '$.onset_step'),
                           'status', 'planned', 'at', at, 'reason', message,
                           'checkpoint_step', json_extract(evidence, '$.checkpoint_step'),
                           'skip', json_array(json_extract(evidence, '$.skip_first'), json_extract(evidence, '$.skip_last')),
                           'lr_scale', COALESCE(json_extract(evidence, '$.lr_scale'), 1.0),
                           'escalation', COALESCE(json_extract(evidence, '$.escalation'), 0))
        FROM events WHERE kind = 'rollback' AND attempt IS NOT NULL ORDER BY id;
    INSERT OR IGNORE INTO rollbacks(run, attempt, onset_step, status, at, record)
        SELECT run, attempt, json_extract(evidence, '$.onset_step'), 'blocked', at,
               json_object('run', run, 'attempt', attempt, 'onset_step', json_extract(evidence, '$.onset_step'),
                           'status', 'blocked', 'at', at, 'reason', message)
        FROM events WHERE kind = 'rollback_blocked' AND attempt IS NOT NULL ORDER BY id;
    UPDATE rollbacks SET status = 'done', record = json_set(record, '$.status', 'done')
        WHERE status = 'planned'
          AND EXISTS (SELECT 1 FROM attempts a WHERE a.run = rollbacks.run AND a.seq > rollbacks.attempt);
    ALTER TABLE attempts ADD COLUMN last_step INTEGER;
    ALTER TABLE attempts ADD COLUMN step_time_s REAL;
    CREATE TABLE resume_plans (
        run TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        plan TEXT NOT NULL,
        PRIMARY KEY (run, attempt)
    );
    INSERT OR IGNORE INTO resume_plans(run, attempt, plan)
        SELECT run, attempt, json_extract(evidence, '$.resume') FROM events
        WHERE kind IN ('submitted', 'restarted') AND attempt IS NOT NULL
          AND json_extract(evidence, '$.resume') IS NOT NULL ORDER BY id;
    """,
    # 7: what the hang detector learned of each attempt's pace, and the node findings the engine
    # holds active (a restarted daemon keeps both)
    """
    ALTER TABLE attempts ADD COLUMN hang_pace TEXT;
    CREATE TABLE node_findings (
        node TEXT PRIMARY KEY,
        finding TEXT NOT NULL
    );
    """,
    # 8: why an attempt's log shows its checkpoint load failed (checkpoint fallback's evidence)
    """
    ALTER TABLE attempts ADD COLUMN load_failed TEXT;
    """,
    # 9: how long the attempt's checkpoint saves stalled its log (Young/Daly's save cost)
    """
    ALTER TABLE attempts ADD COLUMN save_s REAL;
    """,
    # 10: who registered each run (the caller's UID as the kernel gave it to the local API);
    # runs from before have none and belong to the instance's account
    """
    ALTER TABLE runs ADD COLUMN owner_uid INTEGER;
    """,
    # 11: what an attempt's log shows it died of before any checkpoint load began (checkpoint
    # fallback's evidence that the checkpoint is not to blame)
    """
    ALTER TABLE attempts ADD COLUMN failed_before_load TEXT;
    """,
    # 12: the progress series the daemon read (loss, step time, throughput per logged step),
    # thinned to a bounded number of points per run: the HTML page's curves, goodput's evidence
    """
    CREATE TABLE progress (
        run TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        step INTEGER NOT NULL,
        at REAL NOT NULL,
        loss REAL,
        step_time_s REAL,
        tokens_per_s REAL,
        samples_per_s REAL,
        PRIMARY KEY (run, attempt, step)
    );
    """,
    # in-allocation recovery (docs/in-allocation.md): the step each job should run (one row per
    # generation, written by a journaled swap) and what its launcher said last
    """
    CREATE TABLE alloc_steps (
        run TEXT NOT NULL REFERENCES runs(name) ON DELETE CASCADE,
        job_id INTEGER NOT NULL,
        generation INTEGER NOT NULL,
        nodes TEXT NOT NULL,
        resume TEXT,
        reason TEXT NOT NULL,
        decided_at REAL NOT NULL,
        PRIMARY KEY (run, job_id, generation)
    );
    CREATE TABLE launcher_reports (
        run TEXT NOT NULL REFERENCES runs(name) ON DELETE CASCADE,
        job_id INTEGER NOT NULL,
        generation INTEGER NOT NULL,
        alive INTEGER NOT NULL,
        nodes TEXT NOT NULL,
        host TEXT NOT NULL,
        exit_code INTEGER,
        at REAL NOT NULL,
        PRIMARY KEY (run, job_id)
    );
    """,
    # when the daemon first heard the reported generation's step ended (its report repeats)
    """
    ALTER TABLE launcher_reports ADD COLUMN ended_at REAL;
    """,
    # the checkpoint ledger read newest step first (each restart's choice, the stale alarm): an
    # index walk of the newest rows, not a sort of the thousands a long run collects
    """
    CREATE INDEX checkpoints_by_step ON checkpoints(run, step, first_seen);
    """,
    # the checkpoint a planned end of the attempt was continued from (domain.decide.continuation)
    """
    ALTER TABLE attempts ADD COLUMN continued_with TEXT;
    """,
    # the run's next job, pre-queued (held) before its current one ends (domain.decide.prequeue)
    """
    CREATE TABLE successors (
        run TEXT PRIMARY KEY REFERENCES runs(name) ON DELETE CASCADE,
        job_id INTEGER NOT NULL,
        after_seq INTEGER NOT NULL,
        submitted_at REAL NOT NULL,
        excluded TEXT NOT NULL
    );
    """,
    # the leader lease of the instance (issue 33: domain.lease), one row; the epoch each intent was
    # journaled under (the fencing token the leader's writes carry)
    """
    CREATE TABLE leader (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        holder TEXT NOT NULL,
        address TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        since REAL NOT NULL,
        expires REAL NOT NULL
    );
    ALTER TABLE actions ADD COLUMN epoch INTEGER;
    """,
    # each node's place on the remediation ladder (issue 34: domain.health.ladder), one row a node
    """
    CREATE TABLE node_care (
        node TEXT PRIMARY KEY,
        rung TEXT NOT NULL,
        since REAL NOT NULL,
        cause TEXT NOT NULL,
        rule TEXT NOT NULL,
        failures INTEGER NOT NULL,
        boot_before REAL,
        until REAL,
        evidence TEXT NOT NULL,
        updated_at REAL NOT NULL
    );
    """,
    # when Slurm began preempting the attempt (its PreemptTime, seen while it ran its GraceTime):
    # a requeue or an end after it is a preemption (domain.decide.preempted)
    """
    ALTER TABLE attempts ADD COLUMN preempted_at REAL;
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)


class SchemaTooNew(RuntimeError):
    pass


class SchemaMismatch(RuntimeError):
    """A read-only reader found a schema other than SCHEMA_VERSION; only the daemon migrates."""


def require_current(db: sqlite3.Connection) -> None:
    """For read-only readers (the page renderer): refuse a schema this code does not know."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version != SCHEMA_VERSION:
        raise SchemaMismatch(
            f"the state database has schema version {version}, this slurm-supervisor reads only "
            f"version {SCHEMA_VERSION}; restart the daemon of this version (it migrates the store)"
        )


def migrate(db: sqlite3.Connection) -> int:
    """Bring the database to SCHEMA_VERSION; return the version it had before.

    The version is read inside the write transaction, so two processes opening a new state
    directory at once (the daemon and a CLI command) migrate it once, one after the other.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        before = int(db.execute("PRAGMA user_version").fetchone()[0])
        if before > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"the state database has schema version {before}, newer than this slurm-supervisor "
                f"understands ({SCHEMA_VERSION}); run the newer version, or restore a backup"
            )
        for version in range(before, SCHEMA_VERSION):
            for statement in _statements(MIGRATIONS[version]):
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {version + 1}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return before


def _statements(script: str) -> list[str]:
    """Split a migration into statements, keeping trigger bodies whole."""
    out: list[str] = []
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out
