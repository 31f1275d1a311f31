"""`slurm-supervisor analyze`: real logs and synthetic ones replayed through the daemon's watch, run
as a person runs it (click's CliRunner on the installed command group)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"
REAL = DATA / "analyze"  # whole real logs (shared/data/train_logs, copied unchanged)
EXCERPTS = DATA / "train_logs"
T0 = datetime(2024, 1, 1, tzinfo=UTC).timestamp()


def analyze(*args: str | Path) -> str:
    result = CliRunner().invoke(main, ["analyze", *map(str, args)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def analyze_json(*args: str | Path) -> dict:
    return json.loads(analyze("--json", *args))


def events(doc: dict, kind: str) -> list[dict]:
    return [e for e in doc["events"] if e["kind"] == kind]


def stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")


def line(step: int, loss: float, at: float | None = None, grad: float = 1.0) -> str:
    """A Megatron-LM 2024 iteration line (with its timestamp when ``at`` is given), 1 s per step."""
    prefix = f"[{stamp(at)}]" if at is not None else ""
    return (
        f"{prefix} iteration {step:8d}/ 1000000 | consumed samples: {step * 64} | elapsed time per iteration (ms): "
        f"1000.0 | learning rate: 1.0E-04 | global batch size: 64 | lm loss: {loss:.6E} | loss scale: 1.0 | "
        f"grad norm: {grad:.3f} | number of skipped iterations: 0 | number of nan iterations: 0 |"
    )


def saved(step: int) -> list[str]:
    return [
        f"saving checkpoint at iteration {step:8d} to /ckpt",
        f"  successfully saved checkpoint at iteration {step:8d} to /ckpt",
    ]


def write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def steady(step: int) -> float:
    return 2.0 - step * 1e-5


# ---------------------------------------------------------------------------- real logs


def test_a_real_megatron_deepspeed_log_shows_its_early_spike_healing_and_the_later_loss_trend():
    doc = analyze_json(REAL / "bigscience_meg_ds_3d_gpt2_perf_n16-ds-off.out")
    (attempt,) = doc["attempts"]
    assert (attempt["format"], attempt["first_step"], attempt["last_step"], attempt["records"]) == (
        "megatron",
        1,
        62,
        62,
    )
    assert [e["step"] for e in events(doc, "spike_healed")] == [30]  # the start-up spike at step 3 healed by itself
    assert events(doc, "spike")[0]["evidence"]["onset_step"] == 3
    trend = [e for e in events(doc, "rollback_blocked") if e["evidence"]["kind"] == "trend"]
    assert trend and trend[0]["evidence"]["onset_step"] == 35  # no checkpoint in the log: a human decides


def test_a_real_megatron_log_with_skipped_iterations_heals_and_is_left_alone():
    doc = analyze_json(REAL / "bigscience_meg_gpt2_base_n8_dp1_tp4_pp8-1809562.out")
    assert [(e["kind"], e["step"]) for e in doc["events"]] == [("spike", 30), ("spike_healed", 60)]
    (attempt,) = doc["attempts"]
    assert attempt["clock"] == "log timestamps" and attempt["hang_threshold_s"] == 120.0 and attempt["stopped"] is None


def test_the_104b_spike_that_did_not_heal_is_rolled_back_as_the_humans_did():
    # tr8-104B exp 12: the BigScience team rolled back. The replay decides at step 9026 (heal window
    # 200 steps). The log shows no save: without checkpoints a human decides; with one assumed every
    # 100 steps it goes back to 8600, the newest at least 100 steps before the onset at 8741.
    log = EXCERPTS / "tr8_104b_exp12_spike_then_divergence_iter8738-9027.log"
    blocked = events(analyze_json(log), "rollback_blocked")
    assert [(e["step"], e["evidence"]["rule"]) for e in blocked] == [(9026, "not_healed"), (9027, "nonfinite")]
    first, after = events(analyze_json("--checkpoint-every", "100", log), "rollback")
    assert (first["step"], first["evidence"]["checkpoint_step"], first["after_stop"]) == (9026, 8600, False)
    assert after["after_stop"]  # the NaN step after it: the daemon would have stopped the job already


def test_the_bloom_176b_spike_heals_and_the_104b_divergence_is_rolled_back():
    healed = events(analyze_json(EXCERPTS / "bloom176b_spike_iter31214-31251.log"), "spike_healed")
    assert [(e["evidence"]["onset_step"], e["step"]) for e in healed] == [
        (31216, 31251)
    ]  # left alone, as BigScience did
    (diverged,) = events(analyze_json(EXCERPTS / "tr8_104b_exp2_glitch_iter6900-6940.log"), "rollback_blocked")
    assert (diverged["step"], diverged["evidence"]["rule"]) == (6940, "diverged")  # BigScience rolled back to 6210


def test_the_bloom_eval_hang_is_called_a_hang_half_an_hour_after_its_last_step():
    doc = analyze_json(EXCERPTS / "tr11_chronicles_eval_hang_L302-313.log")
    (hang,) = events(doc, "hang")
    assert hang["step"] == 45000 and hang["evidence"]["threshold_s"] == 1800.0  # start-up grace: pace not learned
    assert doc["attempts"][0]["stopped"] == "a hang"


@pytest.mark.parametrize(
    "name", ["hf_trainer_state_jaong_cpt.json", "hf_trainer_state_whisper_excerpt.json"], ids=["jaong", "whisper"]
)
def test_a_trainer_state_json_is_replayed_from_its_log_history(name):
    doc = analyze_json(EXCERPTS / name)
    (attempt,) = doc["attempts"]
    assert (attempt["format"], attempt["format_note"]) == ("hf-trainer", "trainer_state.json") and attempt[
        "records"
    ] > 5
    assert attempt["clock"] == "step times" and not events(doc, "hang")


def test_the_text_report_names_the_format_the_clock_and_the_decisions():
    out = analyze(REAL / "bigscience_meg_gpt2_base_n8_dp1_tp4_pp8-1809562.out")
    assert "format megatron (detected)" in out and "clock: log timestamps" in out
    assert "spike_healed" in out and "summary: 1 spike, 1 healed, 0 rollbacks" in out


# ---------------------------------------------------------------------------- synthetic logs


def test_a_spike_that_heals_is_left_alone(tmp_path):
    lines = [line(s, steady(s) * (1.8 if 1500 <= s < 1520 else 1.0), T0 + s) for s in range(10, 2001, 10)]
    doc = analyze_json(write(tmp_path, "heal.log", lines))
    assert [(e["kind"], e["evidence"]["onset_step"]) for e in doc["events"]] == [
        ("spike", 1500),
        ("spike_healed", 1500),
    ]
    assert not events(doc, "rollback") and doc["attempts"][0]["stopped"] is None


def test_a_divergence_is_rolled_back_to_the_newest_saved_checkpoint_before_it(tmp_path):
    lines = []
    for s in range(10, 2401, 10):
        lines.append(line(s, steady(s) * (1.0 + max(0, s - 2130) / 100), T0 + s))  # climbs from 2130 on
        if s % 500 == 0:
            lines += saved(s)
    doc = analyze_json(write(tmp_path, "diverge.log", lines))
    rollback, *later_rollbacks = events(doc, "rollback")
    ev = rollback["evidence"]
    assert ev["checkpoint_step"] == 2000 and ev["skip_first"] == 2001  # newest save >= 100 steps before onset
    assert rollback["step"] == ev["decided_step"] < 2400 and ev["onset_step"] >= 2130
    assert [e["step"] for e in events(doc, "save")] == [500, 1000, 1500, 2000]
    assert doc["attempts"][0]["stopped"] == "a rollback"
    assert not rollback["after_stop"] and all(e["after_stop"] for e in later_rollbacks)


def test_a_silence_is_a_hang_at_the_first_poll_past_the_learned_limit(tmp_path):
    lines = [line(s, steady(s), T0 + s) for s in range(10, 1001, 10)]
    lines.append(f"[{stamp(T0 + 1000 + 7200)}] NCCL watchdog: collective operation timeout")
    doc = analyze_json(write(tmp_path, "hang.log", lines))
    (hang,) = events(doc, "hang")
    # a logged step every 10 s: 5 x 10 s is under the 120 s floor; polls every 5 s from the start
    assert hang["step"] == 1000 and hang["evidence"]["threshold_s"] == 120.0
    assert T0 + 1000 + 120 < hang["at"] <= T0 + 1000 + 125
    assert hang["time"] == stamp(hang["at"])


def test_a_node_that_becomes_slow_is_named_a_straggler_on_the_nodes_given(tmp_path):
    lines = []
    for s in range(1, 400):
        times = [1.0, 1.01, 0.99, 1.0, 1.0, 1.02, 0.98, 1.0]
        times[5] = 1.3 if s > 200 else times[5]  # the 6th node slows down half way
        record = {"ssv": 1, "step": s, "loss": 2.0, "step_time_s": max(times), "rank_step_times_s": times}
        lines.append(f"[{stamp(T0 + s)}] {json.dumps(record)}")
    log = write(tmp_path, "ranks.log", lines)
    doc = analyze_json("--nodes", "n[1-8]", log)
    (straggler,) = events(doc, "straggler")
    assert straggler["evidence"]["node"] == "n6" and straggler["step"] > 200
    assert "n6" in events(doc, "slowdown")[0]["message"]
    assert not events(analyze_json(log), "straggler")  # no nodes given: ranks are not scored


def test_hostile_bytes_in_a_log_are_printed_escaped(tmp_path):
    lines = [line(s, steady(s), T0 + s) for s in range(10, 501, 10)]
    lines.append(f"[{stamp(T0 + 500)}] \x1b]0;owned\x07\x1b[2J\u202eevil\x9b31m")  # read with step 500 ...
    lines.append(f"[{stamp(T0 + 4000)}] the job was cancelled")  # ... the last line before the silence
    out = analyze(write(tmp_path, "hostile.log", lines))
    assert "hang" in out and "last line:" in out
    assert not any(c in out for c in "\x1b\x07\u202e\x9b")
    assert "?]0;owned??[2J?evil?31m" in out


def test_several_logs_are_consecutive_attempts_and_a_rollback_counts_across_them(tmp_path):
    first = [line(s, steady(s), T0 + s) for s in range(10, 1001, 10)] + saved(1000)
    second = [line(s, steady(s) * (1.8 if s >= 1600 else 1.0), T0 + 5000 + s) for s in range(1010, 2001, 10)]
    doc = analyze_json(write(tmp_path, "a.log", first), write(tmp_path, "b.log", second))
    assert [a["index"] for a in doc["attempts"]] == [0, 1] and doc["attempts"][1]["first_step"] == 1010
    (rollback,) = events(doc, "rollback")
    assert rollback["attempt"] == 1 and rollback["evidence"]["checkpoint_step"] == 1000  # saved by attempt 0


def test_format_can_be_forced_and_an_unknown_one_is_refused(tmp_path):
    log = write(tmp_path, "m.log", [line(s, steady(s), T0 + s) for s in range(10, 101, 10)])
    assert analyze_json("--format", "megatron-lm", log)["attempts"][0]["records"] == 10
    assert analyze_json("--format", "torchtitan", log)["attempts"][0]["records"] == 0
    result = CliRunner().invoke(main, ["analyze", "--format", "nope", str(log)])
    assert result.exit_code == 2 and "unknown progress format" in result.output


def test_a_log_without_timestamps_is_timed_by_its_step_times_and_judges_no_hang(tmp_path):
    lines = [line(s, steady(s)) for s in range(10, 1001, 10)]
    doc = analyze_json(write(tmp_path, "plain.log", lines))
    (attempt,) = doc["attempts"]
    assert attempt["clock"] == "step times" and attempt["ended_at"] == pytest.approx(990.0, abs=5.0)
    assert not events(doc, "hang")


def test_the_last_line_without_a_newline_and_an_overlong_line_are_read(tmp_path):
    path = tmp_path / "cut.log"
    body = "\n".join(line(s, steady(s), T0 + s) for s in range(10, 101, 10))
    path.write_text(body.replace("\n", "\n" + "x" * 3_000_000 + "\n", 1), encoding="utf-8")  # no final newline
    doc = analyze_json(path)
    assert doc["attempts"][0]["last_step"] == 100 and doc["attempts"][0]["records"] == 10


def test_entries_are_bounded_per_kind(tmp_path):
    lines = []
    for s in range(10, 1001, 10):
        lines.append(line(s, steady(s), T0 + s))
        lines += saved(s)
    doc = analyze_json("--limit", "5", write(tmp_path, "saves.log", lines))
    assert len(events(doc, "save")) == 5 and doc["counts"]["save"] == 100 and doc["omitted"]["save"] == 95
