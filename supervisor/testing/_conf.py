"""slurm.conf for the private test cluster (settings measured to work on one Debian 12 host)."""

from __future__ import annotations

import os
import pwd
import socket
from collections.abc import Mapping
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


def render(
    settings: Mapping[str, str],
    node_ports: Mapping[str, int],
    partition: str,
    cpus_per_node: int,
) -> str:
    lines = [f"{key}={value}" for key, value in settings.items()]
    for name, port in node_ports.items():
        lines.append(
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs={cpus_per_node} State=UNKNOWN"
        )
    lines.append(f"PartitionName={partition} Nodes={','.join(node_ports)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"
