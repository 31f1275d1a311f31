"""`slurm-supervisor stacks` and `analyze FOLDER`: a run's captures read back, judged again, printed."""

from __future__ import annotations

from click.testing import CliRunner

from supervisor.adapters.stack_files import StackFiles
from supervisor.cli import main
from supervisor.domain.stacks.dumps import Capture, rank_dump
from supervisor.domain.stacks.verdict import judge

C10D = "torch/distributed/distributed_c10d.py"


def keep(tmp_path) -> StackFiles:
    def one(rank: int, node: str, name: str, file: str):
        raw = {"rank": rank, "pid": 10 + rank, "threads": [{"os_thread_id": 10 + rank, "frames": [{"name": name, "filename": file, "line": 7}]}]}  # fmt: skip
        return rank_dump(raw, node)

    files = StackFiles(tmp_path / "state" / "stacks")
    capture = Capture((one(0, "n1", "all_reduce", C10D), one(1, "n2", "load_batch", "train.py")), {}, 2.5)
    files.keep("gpt", "job7-r0-g0-100", capture, judge(capture.dumps, ["n1", "n2"], {}))
    return files


def test_stacks_of_a_run_and_analyze_of_a_folder(tmp_path):
    files = keep(tmp_path)
    config = tmp_path / "supervisor.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n')
    shown = CliRunner().invoke(main, ["--config", str(config), "stacks", "gpt", "--ranks"])
    assert shown.exit_code == 0, shown.output
    assert "job7-r0-g0-100  suspect n2: rank 1 (n2) in data loading (load_batch, train.py:7)" in shown.output
    assert "rank 1 (n2, pid 11): data loading" in shown.output and "captured in 2.5 s" in shown.output
    offline = CliRunner().invoke(main, ["analyze", str(files.folder("gpt"))])
    assert offline.exit_code == 0, offline.output
    assert offline.output.startswith("job7-r0-g0-100:\n  verdict: suspect n2: rank 1 (n2)")
    none = CliRunner().invoke(main, ["--config", str(config), "stacks", "other"])
    assert none.exit_code != 0 and "no stack captures for other" in none.output
