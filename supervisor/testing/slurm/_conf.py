"""slurm.conf for the private test cluster (settings measured to work on one Debian 12 host)."""

from __future__ import annotations

import os
import pwd
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


def base_settings(root: Path, ctld_port: int, munge_socket: Path) -> dict[str, str]:
    """Everything but the node and partition lines; every path lies under ``root``."""
    user = pwd.getpwuid(os.geteuid()).pw_name
    return {
        "ClusterName": "localslurm",
        "SlurmctldHost": f"{socket.gethostname()}(127.0.0.1)",
        "SlurmctldPort": str(ctld_port),
        "SlurmUser": user,
        "SlurmdUser": "root",
        "AuthType": "auth/munge",
        "CredType": "cred/munge",
        # The default cred_expire (120 s) delays every requeued job's restart by two minutes.
        "AuthInfo": f"socket={munge_socket},cred_expire=10",
        "StateSaveLocation": f"{root}/state",
        "SlurmdSpoolDir": f"{root}/spool/%n",
        "SlurmctldPidFile": f"{root}/run/slurmctld.pid",
        "SlurmdPidFile": f"{root}/run/slurmd-%n.pid",
        "SlurmctldLogFile": f"{root}/log/slurmctld.log",
        "SlurmdLogFile": f"{root}/log/slurmd-%n.log",
        "SlurmctldDebug": "info",
        "SlurmdDebug": "info",
        "PlugStackConfig": f"{root}/plugstack.conf",
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_CPU",
        "ReturnToService": "1",
        "SlurmdTimeout": "10",
        "MessageTimeout": "5",
        "JobRequeue": "1",
        "SlurmdParameters": "config_overrides",
        "MinJobAge": "300",
        "PrologFlags": "Alloc",
        "JobCompType": "jobcomp/filetxt",
        "JobCompLoc": f"{root}/log/jobcomp.txt",
        "AccountingStorageType": "accounting_storage/none",
        "JobAcctGatherType": "jobacct_gather/none",
        "MpiDefault": "none",
        "MailProg": "/bin/true",
        # A test setting: backfill every second instead of every 30 s, so that a requeued or
        # newly submitted job starts within ~1 s of becoming eligible (default: up to 30 s).
        "SchedulerParameters": "bf_interval=1",
    }


@dataclass(frozen=True)
class ExtraNodes:
    """Nodes defined in slurm.conf whose slurmd never starts (a large cluster's node table on one
    host): ``count`` nodes ``{prefix}1..{prefix}count`` in ``state`` (a NodeName State= value:
    DOWN, DRAIN, FUTURE, CLOUD), all in the cluster's partition. ``port``: a port no slurmd listens
    on (slurmctld's pings of such nodes are refused at once)."""

    count: int
    prefix: str = "x"
    state: str = "DOWN"
    port: int = 9

    def names(self) -> str:
        return f"{self.prefix}[1-{self.count}]" if self.count else ""

    def line(self) -> str:
        reason = ' Reason="defined, never started"' if self.state in ("DOWN", "DRAIN") else ""
        return (
            f"NodeName={self.names()} NodeHostname=localhost NodeAddr=127.0.0.1 Port={self.port} CPUs=1 "
            f"State={self.state}{reason}"
        )


@dataclass(frozen=True)
class Partitions:
    """The cluster's partition (the default: every node) with more words for its line, and more
    partitions over the same nodes (name -> their words)."""

    name: str
    options: str = ""
    more: Mapping[str, str] = field(default_factory=dict)

    def lines(self, members: str) -> list[str]:
        first = f"PartitionName={self.name} Nodes={members} Default=YES MaxTime=INFINITE State=UP {self.options}"
        others = [
            f"PartitionName={name} Nodes={members} MaxTime=INFINITE State=UP {words}"
            for name, words in self.more.items()
        ]
        return [line.rstrip() for line in (first, *others)]


def render(
    settings: Mapping[str, str],
    node_ports: Mapping[str, int],
    partitions: Partitions,
    cpus_per_node: int,
    extra: ExtraNodes | None = None,
) -> str:
    lines = [f"{key}={value}" for key, value in settings.items()]
    for name, port in node_ports.items():
        lines.append(
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs={cpus_per_node} State=UNKNOWN"
        )
    members = list(node_ports)
    if extra is not None and extra.count:
        lines.append(extra.line())
        members.append(extra.names())
    lines += partitions.lines(",".join(members))
    return "\n".join(lines) + "\n"
