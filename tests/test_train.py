"""train.py as a script: its flags reaching the algorithms, the end-of-run summary, smoke runs of
the real loop (every algo, the embedded default's warm start, a GGUF model, mixed precision, vLLM),
resume after SIGKILL and SIGTERM, checkpoints, run locks, and the checks that stop a run before
anything loads."""

import contextlib
import math
import re

import pytest

from advantages import CreditConfig
from infra.run import summary
from infra.warmstart import WarmConfig
from retriever import RetrieverConfig
from rollout import ALGOS, AgentConfig, RolloutConfig
from train import Args


def test_algo_flags_reach_the_configs_the_papers_functions_read():
    # each strategy reads its knobs from the RolloutConfig, each credit function from the
    # CreditConfig it is given: the flags set them in one place, and nothing else does
    from infra.flags import parse

    flags = "--tree_replace --carl_N0 8 --treeps_D 4 --no_carl_train_phase1 --clip_low 0.1"
    configs = (Args, RolloutConfig, CreditConfig, AgentConfig, RetrieverConfig, WarmConfig)
    a, r, c, *_ = parse(*configs, args=flags.split())
    assert r.tree_replace and r.carl_N0 == 8 and r.treeps_D == 4 and not c.carl_train_phase1
    assert a.clip_low == 0.1 and r == RolloutConfig(tree_replace=True, carl_N0=8, treeps_D=4)


def test_the_summary_says_whether_rl_helped_beyond_noise():
    # the gain's standard error: sqrt(a(1-a)/n + b(1-b)/n) over the first and last evaluation (n =
    # 1000 each)
    def said(a, b):
        return summary(
            [{"step": 0, "eval/em": a, "eval/n": 1000}, {"step": 60, "eval/em": b, "eval/n": 1000}],
            {"world": 1.0},
            60.0,
            "runs/x",
        )

    # 0.70 -> 0.90: se = sqrt(0.21/1000 + 0.09/1000) = 0.0173; +0.200 > 2 se = 0.035
    assert "RL improved the policy: test EM 0.700 (step 0) -> 0.900 (step 60), +0.200" in said(
        0.70, 0.90
    )
    # 0.70 -> 0.72: se = sqrt(0.21/1000 + 0.2016/1000) = 0.0203; +0.020 < 2 se = 0.041: said plainly
    assert "NO clear change from RL (the gain is within 2 standard errors, 0.041)" in said(
        0.70, 0.72
    )
    # 0.70 -> 0.60: se = sqrt(0.21/1000 + 0.24/1000) = 0.0212; -0.100 < -0.042
    assert "RL made the policy WORSE" in said(0.70, 0.60) and "-0.100" in said(0.70, 0.60)


# ---- smoke runs of the real script (tiny world, tiny random policy) ------------------------------

import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FAST = (
    "--prompts_per_step 2 --max_step_tokens 12 --max_turns 2 --eval_n 2 --grpo_G 3 --branpo_N 2 "
    "--carl_N 2 --treeps_N 3 --micro_batch_size 4"
).split()
# the embedded default's warm start, as short as it goes
TINY_WARM = "--copy_steps 2 --sft_steps 2 --warm_batch_size 2 --target_em 0".split()


def train_command(env, *args) -> list[str]:
    """train.py on the tiny random policy, writing under env/out, FAST, then `args`."""
    model = ["--model", str(env / "tiny"), "--out_dir", str(env / "out")]
    return [sys.executable, str(ROOT / "train.py"), *model, *FAST, *args]


def train(env, *args, **kw):
    cmd = train_command(env, *args)
    return subprocess.run(cmd, cwd=env, capture_output=True, text=True, timeout=600, **kw)


def metrics(env, run):
    with open(env / "out" / "runs" / run / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("algo", list(ALGOS))  # the registry: every --algo
def test_every_algo_trains_two_steps_evaluates_and_saves(env, algo):
    out = train(
        env, "--algo", algo, "--steps", "2", "--run_name", f"smoke_{algo}", "--eval_every", "2"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = metrics(env, f"smoke_{algo}")
    train_rows = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    assert [r["step"] for r in rows if "eval/em" in r] == [0, 2]
    for r in train_rows:
        assert r["tree/leaves_per_prompt"] > 0 and r["train/skipped_steps"] == 0
        assert r["rollout/retrieval_failed_queries"] == 0 and r["abnormal/env_error"] == 0
        assert math.isfinite(r["train/loss"]) and r["train/time_rollout"] > 0
    assert (env / "out" / "runs" / f"smoke_{algo}" / "curve.png").stat().st_size > 0
    assert (env / "out" / "runs" / f"smoke_{algo}" / "final" / "config.json").exists()


def test_more_mini_batches_than_micro_batches_is_said_each_step(env):
    # before: --ppo_mini_batches above the step's micro-batches was cut down silently. 2 prompts x
    # 3 chains = 6 samples (none cut by the budget: 3 x 12 tokens) in micro-batches of 4: 2
    out = train(
        env,
        *"--algo grpo --steps 2 --ppo_mini_batches 5 --eval_every 0 --run_name many_minis".split(),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    said = "--ppo_mini_batches 5: this step's 6 samples fill 2 micro-batches of --micro_batch_size "
    assert out.stdout.count(said + "4, so 2 mini-batches of one") == 2, out.stdout


def test_evaluating_leaves_training_as_it_was(env):
    # evaluation draws nothing from training's random state: a run evaluated at steps 0, 1 and 2
    # trains exactly as one never evaluated (the same steps' metrics but their times, the same final
    # weights), so benchmarks/compare.py --merge may join runs of other --eval_every
    from safetensors.torch import load_file

    for run, every in (("evaluated", "1"), ("not_evaluated", "0")):
        out = train(
            env, "--algo", "tree_grpo", "--steps", "2", "--run_name", run, "--eval_every", every
        )
        assert out.returncode == 0, out.stderr[-3000:]
    rows = {
        run: [
            {k: v for k, v in r.items() if not re.search("time|second|eval/", k)}
            for r in metrics(env, run)
            if "train/loss" in r
        ]
        for run in ("evaluated", "not_evaluated")
    }
    assert len(rows["evaluated"]) == 2 and rows["evaluated"] == rows["not_evaluated"]
    assert [r["step"] for r in metrics(env, "evaluated") if "eval/em" in r] == [0, 1, 2]
    weights = [
        load_file(env / "out" / "runs" / run / "final" / "model.safetensors")
        for run in ("evaluated", "not_evaluated")
    ]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_reject_sampling_filter_drops_all_zero_and_all_one_groups():
    from infra.data import QARow
    from train import reject_sampling_filter

    rows = [QARow(str(i), f"q{i}?", ["a"], "world", "train", i) for i in range(5)]
    rewards = [[0, 0, 0], [1, 1, 1], [0, 1, 0], [0.5, 0.5, 0.5], [1.0, 0.2, 1.0]]
    kept, report = reject_sampling_filter(rows, rewards)
    assert [r.id for r in kept] == ["2", "3", "4"]
    assert (
        report.total,
        report.kept,
        report.dropped_all_zero,
        report.dropped_all_one,
        report.kept_constant,
    ) == (5, 3, 1, 1, 1)


def test_reject_sampling_filter_refuses_mismatched_or_empty_reward_groups():
    from infra.data import QARow
    from train import reject_sampling_filter

    rows = [QARow("0", "q?", ["a"], "world", "train", 0)]
    with pytest.raises(ValueError, match="1 rows but 2 reward groups"):
        reject_sampling_filter(rows, [[0], [1]])
    with pytest.raises(ValueError, match="question '0' has an empty reward group"):
        reject_sampling_filter(rows, [[]])


def test_cut_the_bills_refine_agent_and_data_filter_run_end_to_end(env, tmp_path):
    # both off by default; here the tiny policy is its own frozen refine agent (§6), and the filter
    # (§3) rolls each of the run's 4 questions out twice first. With --format_penalty the random
    # policy's broken steps get -0.5: an all -0.5 group is kept (constant-groups-kept), so some
    # questions stay to train on
    flags = ["--refine_model", str(env / "tiny"), "--refine_max_tokens", "6"]
    out = train(
        env,
        *("--algo", "grpo", "--steps", "2", "--run_name", "cut_the_bill", "--eval_every", "2"),
        *(*flags, "--filter_rollouts", "2", "--format_penalty"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "data filter (Cut the Bill §3)" in out.stdout
    rows = metrics(env, "cut_the_bill")
    first = rows[0]  # the filter's row, at step 0
    assert first["step"] == 0 and first["rollout/filter_questions"] == 4
    dropped = first["rollout/filter_dropped_all_zero"] + first["rollout/filter_dropped_all_one"]
    assert first["rollout/filter_kept"] + dropped == 4 and first["rollout/filter_kept"] > 0
    train_rows = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    for r in train_rows:  # the refine agent's summaries: their length and time, every step
        searched = r["rollout/tool_calls_per_prompt"] > 0
        assert 0 < r["rollout/refine_summary_tokens"] <= 6 or not searched
        assert r["rollout/refine_seconds"] > 0 or not searched
    # eval.py takes the same flag (the filter is training's only)
    report = tmp_path / "eval.json"
    world = ["--data", str(env / "out" / "world"), "--corpus", str(env / "out" / "world")]
    world[-1] += "/corpus.jsonl"
    cmd = [sys.executable, str(ROOT / "eval.py"), "--model", str(env / "tiny"), *world, *flags]
    cmd += ["--n", "2", "--max_step_tokens", "12", "--max_turns", "2", "--out", str(report)]
    out = subprocess.run(cmd, cwd=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(report.read_text())["report"]["n"] == 2


def test_embedded_default_warm_starts_then_trains(env, tmp_path):
    # no --model: the world, a (tiny) warm start cached under out/warmstart, then RL from it, as the
    # main job does
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "--out_dir",
            str(tmp_path),
            *FAST,
            "--steps",
            "1",
            "--eval_every",
            "0",
            *TINY_WARM,
        ],
        cwd=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "warm start: saved" in out.stdout
    assert out.stdout.count("retriever: bm25") == 1  # the warm start used the run's (before: 2)
    assert json.loads((tmp_path / "warmstart" / "warmstart.json").read_text())["sft_steps"] == 2
    run = tmp_path / "runs" / "tree_grpo-seed0"  # the default run name: algo and seed
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and math.isfinite(row["train/loss"])


def test_resume_after_sigkill_continues_exactly(env):
    # a run killed with SIGKILL once a checkpoint is complete, then resumed for one more step
    cmd = train_command(
        env, *"--algo grpo --steps 50 --run_name killed --eval_every 0 --checkpoint_every 2".split()
    )
    proc = subprocess.Popen(cmd, cwd=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = env / "out" / "runs" / "killed" / "latest"
    deadline = time.time() + 300
    while not latest.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = int(latest.read_text().removeprefix("checkpoint-"))
    assert saved % 2 == 0 and saved >= 2
    # its process is dead
    assert (latest.parent / "run.lock").read_text().split()[0] == str(proc.pid)
    with open(latest.parent / "metrics.jsonl", "a") as f:
        # a torn last line, as a kill in the middle of a write leaves
        f.write('{"step": 99, "rollout/rew')
    out = train(
        env,
        "--algo",
        "grpo",
        "--steps",
        str(saved + 1),
        "--run_name",
        "killed",
        "--eval_every",
        "0",
        "--checkpoint_every",
        "2",
        "--resume",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # the dead run's lock: released
    assert f"at step {saved}" in out.stdout and "torn last line" in out.stdout
    rows = metrics(env, "killed")
    # nothing logged twice, nothing lost
    assert [r["step"] for r in rows] == list(range(1, saved + 2))
    # deterministic on CPU: the resumed step equals the same step of an uninterrupted run
    ref = train(
        env,
        "--algo",
        "grpo",
        "--steps",
        str(saved + 1),
        "--run_name",
        "straight",
        "--eval_every",
        "0",
    )
    assert ref.returncode == 0, ref.stderr[-3000:]
    straight = metrics(env, "straight")
    for key in (
        "rollout/reward",
        "train/tokens_trained",
        "train/loss",
        "train/kl",
        "train/grad_norm",
    ):
        assert rows[saved][key] == pytest.approx(straight[saved][key], rel=1e-5, abs=1e-7), key


def test_one_training_step_with_the_smollm2_gguf(env):
    from conftest import smollm2_gguf

    folder, name = smollm2_gguf()
    out = train(
        env,
        "--model",
        folder,
        "--gguf_file",
        name,
        "--algo",
        "grpo",
        "--steps",
        "1",
        "--grpo_G",
        "2",
        "--prompts_per_step",
        "1",
        "--max_step_tokens",
        "8",
        "--max_turns",
        "1",
        "--eval_every",
        "0",
        "--run_name",
        "gguf",
        "--lr",
        "1e-6",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (row,) = metrics(env, "gguf")
    assert (
        row["train/samples"] == 2
        and math.isfinite(row["train/loss"])
        and row["train/skipped_steps"] == 0
    )


@pytest.mark.parametrize(
    "precision,ref_dtype", [("no", "compute"), ("bf16", "float32"), ("bf16", "compute")]
)
def test_pi_theta_pi_old_and_pi_ref_share_one_numeric_path(env, precision, ref_dtype):
    # `accelerate launch --mixed_precision bf16` sets this variable. Step 1 has no update before its
    # statistics (the warmup's first learning rate is 0), so pi_theta = pi_old: ratio 1, in float32
    # as in bf16, and pi_ref = pi_theta too where the reference has the policy's float32 weights:
    # KL 0 (before, under bf16 the policy ran under autocast while pi_ref came from a float32
    # reference run without it: KL 4.6e-8 here). In float32 the HF engine's log-probs are pi_old
    # itself, so TIS is exactly 1; under bf16 pi_old is recomputed and TIS measures the engine's
    # rounding against the trainer's (its size is the platform's: 2.5e-4 on this CPU, 0.0 on an
    # H100, so no test asserts it).
    # --ref_dtype compute (the default) keeps the reference in bf16 under bf16 (half its memory);
    # its weights are then the policy's rounded to bf16, under the same autocast: step 1's KL is
    # that rounding's, 9.8e-8 on the tiny random policy here (measured), not 0.
    out = subprocess.run(
        train_command(
            env,
            *f"--algo tree_grpo --steps 1 --eval_every 0 --ref_dtype {ref_dtype}".split(),
            *f"--run_name mp_{precision}_{ref_dtype}".split(),
        ),
        cwd=env,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "ACCELERATE_MIXED_PRECISION": precision},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (row,) = metrics(env, f"mp_{precision}_{ref_dtype}")
    assert abs(row["train/ratio_p5"] - 1) < 2e-6 and abs(row["train/ratio_p95"] - 1) < 2e-6, row
    if precision == "bf16" and ref_dtype == "compute":
        assert 0 < row["train/kl"] < 1e-5, row
    else:
        assert row["train/kl"] < 1e-9, row
    if precision == "bf16":
        assert "pi_old: the trainer's forward (HFEngine, mixed precision bf16)" in out.stdout
    else:
        assert "pi_old: the HF engine's log-probs" in out.stdout
        assert row["train/tis_ratio_max_dev"] == 0.0, row


def test_log_with_a_tracker_that_is_not_installed_stops_before_anything_loads(env):
    # before: the run went on and logged nothing to the tracker, with one UserWarning from
    # accelerate in the output
    from infra.run import TRACKERS

    missing = [name for name, installed in TRACKERS.items() if not installed()]
    if not missing:
        pytest.skip("every tracker accelerate supports is installed here")
    name = missing[0]
    out = train(env, "--algo", "grpo", "--steps", "1", "--run_name", "tracker", "--log_with", name)
    assert out.returncode != 0, out.stdout[-3000:]
    assert f"--log_with {name}: the {name!r} package is not installed" in out.stderr, out.stderr
    assert f"pip install {name}" in out.stderr and "nothing was loaded or run" in out.stderr
    assert not (env / "out" / "runs" / "tracker").exists()


# ---- the real loop on vLLM ---------------------------------------------------------------------
# (runs only where vllm imports: the CPU virtualenv of docs/vllm_cpu.md, CI's too)

import importlib.util  # noqa: E402


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed (docs/vllm_cpu.md)"
)
@pytest.mark.parametrize("algo", list(ALGOS))
def test_vllm_engine_runs_the_training_loop(tmp_path_factory, algo):
    # the embedded default (no --model: world, a tiny warm start shared by the runs, then RL)
    # on vLLM: rollout, update, weight sync, eval, checkpoint, final save and a clean exit, for
    # every algo
    out_dir = tmp_path_factory.getbasetemp() / "vllm_out"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "--engine",
            "vllm",
            "--algo",
            algo,
            "--out_dir",
            str(out_dir),
            *FAST,
            "--steps",
            "2",
            "--eval_every",
            "2",
            "--eval_n",
            "4",
            "--checkpoint_every",
            "2",
            "--lr",
            "1e-2",
            "--ppo_epochs",
            "2",
            *TINY_WARM,
        ],
        cwd=tmp_path_factory.getbasetemp(),
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "engine: vllm (requested" in out.stdout and "float32 (the policy's)" in out.stdout
    for bad in ("Traceback", "Invalid process group", "Downcasting", "dtype mismatch"):
        assert bad not in out.stderr + out.stdout, bad
    run = out_dir / "runs" / f"{algo}-seed0"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/em" in r] == [0, 2] and (run / "checkpoint-2").is_dir()
    assert (run / "final" / "config.json").exists()
    one, two = [r for r in rows if "train/loss" in r]
    # The weight sync: step 2 was sampled by the engine after step 1's update was pushed into it,
    # and the trainer's pi_old agrees with the engine's log-probs on every trained token (float32 on
    # both sides). Step 1 did move the policy: all rewards tie (a 2-step warm start), but the second
    # PPO epoch follows the KL gradient that weight decay opened, and Adam's step is lr-sized
    # whatever the gradient's size. With the sync line of train.py removed, this run measured
    # train/tis_ratio_max_dev 1.09 at step 2 (KL 0.087); with it, 1e-6.
    assert two["train/kl"] > 1e-3, two["train/kl"]
    for r in (one, two):
        assert r["train/tis_ratio_max_dev"] < 1e-3, r
        assert r["train/skipped_steps"] == 0 and math.isfinite(r["train/loss"])


# ---- runs fail loudly, never silently ------------------------------------------------------------


def test_validate_names_each_bad_flag():
    from train import validate

    configs = (Args, RolloutConfig, CreditConfig, AgentConfig, RetrieverConfig, WarmConfig)
    for flag in (
        "prompts_per_step",
        "tree_M",
        "grpo_G",
        "topk",
        "max_turns",
        "micro_batch_size",
        "eval_n",
    ):
        with pytest.raises(SystemExit, match=f"--{flag} 0: must be an integer >= 1"):
            validate(*[c(**{flag: 0}) if flag in c.__dataclass_fields__ else c() for c in configs])
    validate(*[c() for c in configs])  # the defaults pass


def test_validate_refuses_bad_treeps_depth_and_paths_and_the_training_file_as_test_data(tmp_path):
    from train import validate

    # before: --treeps_D -1 grew no layer (range(1, 0)) and trained on nothing; --treeps_train -1
    # raised a bare
    # "Sample larger than population or is negative" after both models loaded; --treeps_D 6 with
    # --max_turns 4
    # failed only at the first rollout
    configs = (Args, RolloutConfig, CreditConfig, AgentConfig, RetrieverConfig, WarmConfig)

    def run(**flags):  # validate() with each flag set on the dataclass that owns it
        validate(
            *[c(**{k: v for k, v in flags.items() if k in c.__dataclass_fields__}) for c in configs]
        )

    for flag in ("treeps_D", "treeps_train"):
        with pytest.raises(SystemExit, match=f"--{flag} -1: must be an integer >= 0"):
            run(**{flag: -1})
    # D <= max_turns + 1 = 4 + 1 = 5: 5 passes, 6 is refused with the max_turns it would need (6 - 1
    # = 5)
    run(treeps_D=5, max_turns=4)
    with pytest.raises(
        SystemExit,
        match=r"--treeps_D 6: .* at most --max_turns \+ 1 = 5; .* raise --max_turns to 5",
    ):
        run(treeps_D=6, max_turns=4)
    # the training file named another way ("./x" vs "x") is still the training file
    (tmp_path / "train.jsonl").write_text("")
    with pytest.raises(
        SystemExit, match="is the --data file: evaluation would score the training questions"
    ):
        run(data=str(tmp_path / "train.jsonl"), test_data=str(tmp_path / "." / "train.jsonl"))
    (tmp_path / "test.jsonl").write_text("")  # (a directory without test.* is refused)
    run(data=str(tmp_path), test_data=str(tmp_path))  # a directory: its test.* split, never train.*


def test_bad_flags_stop_before_anything_loads(env):
    out = train(
        env,
        "--algo",
        "grpo",
        "--steps",
        "1",
        "--run_name",
        "bad_flags",
        "--prompts_per_step",
        "0",
        "--tree_M",
        "0",
        "--engine",
        "vllm",
        "--top_p",
        "1.5",
    )
    assert out.returncode != 0
    for message in (
        "--prompts_per_step 0: must be an integer >= 1",
        "--tree_M 0: must be an integer >= 1",
        "--top_p 1.5: must be in (0, 1]",
        "--engine 'vllm': must be auto or hf: vllm is not installed",
    ):
        assert message in out.stderr, out.stderr[-3000:]
    assert not (env / "out" / "runs" / "bad_flags").exists()


def test_dead_retriever_stops_train_and_eval_at_start(env):
    dead = ("--retriever_url", "http://127.0.0.1:1", "--retriever_retries", "0")
    out = train(env, "--algo", "grpo", "--steps", "1", "--run_name", "dead", *dead)
    assert out.returncode != 0 and "did not answer one test query" in out.stderr, out.stderr[-3000:]
    assert "Connection refused" in out.stderr and "done:" not in out.stdout
    out = subprocess.run(
        [sys.executable, str(ROOT / "eval.py"), "--model", str(env / "tiny"), "--n", "2", *dead],
        cwd=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0 and "did not answer one test query" in out.stderr, out.stderr[-3000:]


def test_env_error_rate_stops_the_run_after_patience_steps():
    from infra.run import check_env_errors

    args = Args(max_env_error_rate=0.5, env_error_patience=3)
    rows = [
        {"step": i, "abnormal/env_error": r} for i, r in enumerate([0.9, 0.9, 0.1, 0.9, 0.6], 1)
    ]
    check_env_errors(rows, args, "X")  # the last three are 0.1, 0.9, 0.6: one step was fine
    # eval rows do not count
    rows += [{"step": 5, "eval/em": 0.5}, {"step": 6, "abnormal/env_error": 1.0}]
    with pytest.raises(
        SystemExit,
        match=r"abnormal/env_error above --max_env_error_rate 0.5 for 3 steps in a row "
        r"\(0.90, 0.60, 1.00\).*X",
    ):
        check_env_errors(rows, args, "X")


def test_rerun_refuses_to_overwrite_a_run(env):
    args = ("--algo", "grpo", "--steps", "1", "--eval_every", "0", "--run_name", "rerun")
    first = train(env, *args)
    assert first.returncode == 0, first.stderr[-3000:]
    before = metrics(env, "rerun")
    out = train(env, *args)
    assert out.returncode != 0 and "already holds a run" in out.stderr
    assert "--resume" in out.stderr and "--overwrite" in out.stderr
    assert metrics(env, "rerun") == before and (env / "out" / "runs" / "rerun" / "final").exists()
    out = train(env, *args, "--overwrite", "--seed", "1")
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(metrics(env, "rerun")) == 1 and metrics(env, "rerun") != before


@contextlib.contextmanager
def held_lock(run):
    """This test's process holds run/run.lock (created), as a running train.py would."""
    import fcntl

    run.mkdir(parents=True)
    with open(run / "run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write(f"{os.getpid()} testhost\n")
        lock.flush()
        yield


def test_a_live_lock_refuses_a_second_writer(env):
    run = env / "out" / "runs" / "locked"
    with held_lock(run):
        out = train(
            env, "--algo", "grpo", "--steps", "1", "--eval_every", "0", "--run_name", "locked"
        )
    assert out.returncode != 0 and f"in use by process {os.getpid()} testhost" in out.stderr, (
        out.stderr[-3000:]
    )
    assert f"kill {os.getpid()}" in out.stderr and not (run / "metrics.jsonl").exists()


def test_read_metrics_survives_a_torn_last_line_and_a_missing_file(tmp_path):
    from infra.run import read_metrics

    assert read_metrics(str(tmp_path / "none.jsonl")) == []
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "tr')
    assert read_metrics(str(path)) == [{"step": 1}, {"step": 2}]
    path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(ValueError, match="metrics.jsonl: line 2 is not JSON"):
        read_metrics(str(path))


def test_train_file_without_test_data_is_refused(env):
    world = env / "out" / "world"
    out = train(
        env,
        "--algo",
        "grpo",
        "--steps",
        "1",
        "--run_name",
        "no_test",
        "--data",
        str(world / "train.jsonl"),
        "--corpus",
        str(world / "corpus.jsonl"),
    )
    assert (
        out.returncode != 0 and "--test_data" in out.stderr and "training questions" in out.stderr
    ), out.stderr[-3000:]


def test_a_bad_corpus_stops_train_and_eval_before_the_model_loads(env, tmp_path):
    # before: the corpus was read after both model copies loaded. Here --model names a directory
    # whose file names pass the start's model check but whose files do not load, so an error about
    # the corpus (and none about the model) proves the corpus was read first.
    world = env / "out" / "world"
    bad = tmp_path / "corpus.jsonl"
    # line 2: not UTF-8
    bad.write_bytes(b'{"id": "0", "contents": "T\\nx"}\n{"id": "1", "contents": "\xff"}\n')
    broken = tmp_path / "broken_model"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (broken / name).write_text("not a model")
    files = (
        "--data",
        str(world / "train.jsonl"),
        "--test_data",
        str(world / "test.jsonl"),
        "--corpus",
        str(bad),
    )
    out = train(
        env,
        "--algo",
        "grpo",
        "--steps",
        "1",
        "--run_name",
        "bad_corpus",
        *files,
        "--model",
        str(broken),
    )
    assert out.returncode != 0 and f"{bad}: line 2: not UTF-8" in out.stderr, out.stderr[-3000:]
    assert "broken_model" not in out.stderr
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "eval.py"),
            "--model",
            str(broken),
            "--data",
            str(world / "test.jsonl"),
            "--corpus",
            str(bad),
            "--n",
            "2",
        ],
        cwd=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0 and f"{bad}: line 2: not UTF-8" in out.stderr, out.stderr[-3000:]
    assert "broken_model" not in out.stderr


WHOLE = (torch.nn.Linear(1, 1), None, None)  # a model with whole weights (no FSDP2 shards) and
# no optimizer or scheduler: what the checkpoint functions hand to Accelerate's save/load_state


def test_a_full_disk_at_checkpoint_says_so_and_keeps_latest(tmp_path):
    from infra.run import save_checkpoint

    class FullDisk:  # save_state fails part-way, as torch does when the disk fills up
        def wait_for_everyone(self):
            pass

        def save_state(self, path):
            os.makedirs(path)
            (Path(path) / "model.safetensors").write_bytes(b"part")
            raise RuntimeError("PytorchStreamWriter failed writing file data/3: file write failed")

    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "latest").write_text("checkpoint-2")
    with pytest.raises(
        OSError,
        match=r"checkpoint-4 failed .*file write failed.*free on the disk.*space.*"
        r"--resume continues from checkpoint-2",
    ):
        save_checkpoint(FullDisk(), str(tmp_path), 4, {"step": 4}, True, WHOLE)
    assert (tmp_path / "latest").read_text() == "checkpoint-2" and sorted(os.listdir(tmp_path)) == [
        "checkpoint-2",
        "latest",
    ]  # the torn checkpoint is removed; `latest` still names a complete one


# ---- what clusters and users do to a run -------------------------------------------------------

TIMING = ("time", "seconds")  # metrics that measure the machine, not the run


def same_run(rows, reference):
    """Whether two metrics histories agree on every step's numbers, timings aside (deterministic on
    CPU)."""
    strip = lambda r: {k: v for k, v in r.items() if not any(t in k for t in TIMING)}
    return [strip(r) for r in rows] == [strip(r) for r in reference]


@pytest.fixture(scope="module")
def straight_run(env, tmp_path_factory):
    """An uninterrupted 4-step GRPO run, by a user with an accelerate configuration (HF_HOME): its
    output and wall time."""
    hf_home = tmp_path_factory.mktemp("hf")
    (hf_home / "accelerate").mkdir()
    (hf_home / "accelerate" / "default_config.yaml").write_text("distributed_type: 'NO'\n")
    cmd = train_command(
        env,
        *"--algo grpo --steps 4 --run_name straight4 --eval_every 0 --checkpoint_every 0".split(),
    )
    t0 = time.perf_counter()
    out = subprocess.run(
        cmd,
        cwd=env,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HOME": str(hf_home)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out, time.perf_counter() - t0, hf_home


@pytest.fixture(scope="module")
def straight(env, straight_run):
    """The metrics of the uninterrupted run: what the interrupted runs must reproduce."""
    return metrics(env, "straight4")


def test_sigterm_saves_a_checkpoint_and_resume_continues_exactly(env, straight, tmp_path):
    # before: SIGTERM (a cluster's preemption) ended the run at once, exit 143 with no message, and
    # every step since the last checkpoint was lost (here, with --checkpoint_every 0: all of them)
    cmd = train_command(
        env,
        *"--algo grpo --steps 50 --run_name sigterm --eval_every 0 --checkpoint_every 0".split(),
    )
    run = env / "out" / "runs" / "sigterm"
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.Popen(cmd, cwd=env, stdout=stdout, stderr=stderr)
        deadline = time.time() + 300
        while (
            time.time() < deadline
            and proc.poll() is None
            and not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").stat().st_size)
        ):
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # in step 2, or between steps 1 and 2
        assert proc.wait(timeout=300) == 128 + signal.SIGTERM  # non-zero: the run is not finished
    said = (tmp_path / "stdout").read_text()
    done = len(metrics(env, "sigterm"))  # the step in progress was finished, then saved
    assert (
        f"stopped by SIGTERM after step {done} of 50: saved {run}/checkpoint-{done}; to go "
        f"on, run the same command with --resume" in said
    ), said
    assert said.rstrip().endswith("--resume")
    assert "SIGTERM: finishing this step" in (tmp_path / "stderr").read_text()
    assert (run / "latest").read_text() == f"checkpoint-{done}" and not (run / "final").exists()
    out = train(
        env,
        "--algo",
        "grpo",
        "--steps",
        "4",
        "--run_name",
        "sigterm",
        "--eval_every",
        "0",
        "--checkpoint_every",
        "0",
        "--resume",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resumed from {run}/checkpoint-{done} at step {done}" in out.stdout
    assert [r["step"] for r in metrics(env, "sigterm")] == [1, 2, 3, 4]  # once each
    assert same_run(metrics(env, "sigterm"), straight)  # as if it had never stopped


def test_an_unreadable_checkpoint_is_named_and_the_previous_one_loaded(env, straight):
    # before: only the last checkpoint was kept, and a truncated model.safetensors made --resume die
    # with "SafetensorError: Error while deserializing header: invalid header length", nothing else
    args = ("--algo", "grpo", "--run_name", "torn", "--eval_every", "0", "--checkpoint_every", "1")
    out = train(env, *args, "--steps", "3")
    assert out.returncode == 0, out.stderr[-3000:]
    run = env / "out" / "runs" / "torn"
    kept = lambda: sorted(p.name for p in run.glob("checkpoint-*"))
    assert kept() == ["checkpoint-2", "checkpoint-3"]  # the previous one too
    weights = run / "checkpoint-3" / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(100)
    out = train(env, *args, "--steps", "4", "--resume")
    assert out.returncode == 0, out.stderr[-3000:]
    assert (
        f"resume: {run}/checkpoint-3 is unreadable: model.safetensors has 100 bytes, {size} "
        f"when saved (truncated or overwritten)" in out.stdout
    ), out.stdout
    assert (
        "resume: fell back to the previous checkpoint, checkpoint-2; the steps after 2 run again"
        in out.stdout
        and f"resumed from {run}/checkpoint-2 at step 2" in out.stdout
    )
    assert same_run(metrics(env, "torn"), straight)  # step 3 redone exactly, each logged once
    assert kept() == ["checkpoint-3", "checkpoint-4"]


def test_load_checkpoint_falls_back_then_stops_saying_what_to_do(tmp_path, capsys):
    from infra.run import load_checkpoint

    class Loader:  # accelerate's load_state, failing as it does on a file corrupt in place
        is_main_process, num_processes = True, 1

        def __init__(self, corrupt):
            self.corrupt, self.loaded = corrupt, []

        def load_state(self, path):
            if os.path.basename(path) in self.corrupt:
                raise RuntimeError("Error while deserializing header: invalid header length")
            self.loaded.append(os.path.basename(path))

        def print(self, *args):
            print(*args)

    for step in (2, 4):  # two complete checkpoints, each recording its file's size: 4 bytes
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "model.safetensors").write_bytes(b"abcd")
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(
            json.dumps({"step": step, "files": {"model.safetensors": 4}})
        )
    (tmp_path / "latest").write_text("checkpoint-4")
    (tmp_path / "checkpoint-6").mkdir()  # torn by a kill: newer than `latest`, never tried
    loader = Loader({"checkpoint-4"})  # corrupt in place: the size is right, the loader fails
    assert load_checkpoint(loader, str(tmp_path), WHOLE)["step"] == 2 and loader.loaded == [
        "checkpoint-2"
    ]
    assert (
        "checkpoint-4 is unreadable: loading it failed (RuntimeError: Error while "
        "deserializing header: invalid header length); its files have the sizes they were "
        "saved with" in capsys.readouterr().out
    )
    assert (tmp_path / "latest").read_text() == "checkpoint-2"  # what the run goes on from
    (tmp_path / "latest").write_text("checkpoint-4")
    (tmp_path / "checkpoint-2" / "model.safetensors").write_bytes(b"ab")  # the previous one: torn
    with pytest.raises(
        SystemExit,
        match=r"no readable checkpoint in .* \(checkpoint-4: loading it "
        r"failed .*; checkpoint-2: model.safetensors has 2 bytes, "
        r"4 when saved .*\): put back the named files \(from a "
        r"backup\), or start over with --overwrite",
    ):
        load_checkpoint(Loader({"checkpoint-4"}), str(tmp_path), WHOLE)


def test_the_console_says_little_and_the_run_directory_holds_the_config(env, straight_run):
    # before: ~90 lines of configuration JSON before the first progress bar; a bar written to a file
    # kept every redraw (one per step and per postfix update: 9 here); a user's accelerate
    # configuration went unmentioned when train.py ran without `accelerate launch`. The update's
    # flags (PPOConfig, which Args extends) come first
    out, wall, hf_home = straight_run
    run = env / "out" / "runs" / "straight4"
    config = json.loads((run / "config.json").read_text())
    assert config["steps"] == 4 and config["lr"] == 5e-5 and config["kl_coef"] == 0.001  # all of it
    assert (
        f"config: {run}/config.json; not the defaults: --micro_batch_size 4 --model "
        f"{env / 'tiny'} --out_dir {env / 'out'} --run_name straight4 --steps 4 "
        f"--prompts_per_step 2 --eval_every 0 --eval_n 2 --checkpoint_every 0 --grpo_G 3 "
        f"--branpo_N 2 --carl_N 2 --treeps_N 3 --algo grpo" in out.stdout
    ), out.stdout
    assert '"kl_coef"' not in out.stdout and len(out.stdout.splitlines()) <= 8, out.stdout
    assert (
        f"accelerate: {hf_home / 'accelerate' / 'default_config.yaml'} is not used by a run "
        f"started without `accelerate launch`" in out.stdout
    )
    # stderr is a pipe here: the bar is drawn when it opens, every 20 s, and when it closes
    assert out.stderr.count("grpo:") <= 2 + wall // 20, out.stderr


def test_two_runs_sharing_an_out_dir_train_one_warm_start(env, tmp_path):
    # before: two fresh runs with --seed 1 and --seed 2 both trained a warm start into out/warmstart
    # at once and both exited 0; warmstart.json then said seed 1, whatever the seed-2 run trained
    # on. Here the test holds the warm start's lock while both runs reach it, then lets them go.
    import fcntl
    import shutil

    shutil.copytree(env / "out" / "world", tmp_path / "world")  # the small world
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "--out_dir",
        str(tmp_path),
        *FAST,
        "--steps",
        "1",
        "--eval_every",
        "0",
        *TINY_WARM,
    ]
    with open(tmp_path / "warmstart.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write(f"{os.getpid()} testhost\n")
        lock.flush()
        runs = [
            subprocess.Popen(
                cmd + ["--seed", seed],
                cwd=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for seed in ("1", "2")
        ]
        for run in runs:  # each says what it waits for
            lines = []
            while not lines or "waiting for" not in lines[-1]:
                lines.append(run.stdout.readline())
                assert lines[-1], "".join(lines) + run.stderr.read()
            assert (
                f"waiting for process {os.getpid()} testhost to finish with the warm start "
                f"{tmp_path / 'warmstart'} (lock: {tmp_path / 'warmstart.lock'})" in lines[-1]
            )
    outputs = [run.communicate(timeout=600) for run in runs]
    codes = [run.returncode for run in runs]
    assert sorted(codes) == [0, 1], outputs
    first = codes.index(0)  # the one that took the lock first trained the warm start...
    seed = json.loads((tmp_path / "warmstart" / "warmstart.json").read_text())["seed"]
    assert seed == first + 1
    # ...and the other, once it had the lock, found a warm start of another seed and refused it
    refused = outputs[1 - first][1]
    assert (
        f"trained with other settings (setting: (cached, asked)) {{'seed': ({seed}, {2 - first})}}"
        in refused
        and "give this run its own --out_dir" in refused
    )


def test_model_paths_are_checked_before_anything_loads(env, tmp_path):
    # before: a missing directory failed in transformers ("Repo id must be in the form 'repo_name'
    # or 'namespace/repo_name'"), one with only config.json with a message about sentencepiece and
    # tiktoken, each after the world, the corpus and the retriever had loaded
    only = tmp_path / "only_config"
    only.mkdir()
    (only / "config.json").write_text((env / "tiny" / "config.json").read_text())
    none = tmp_path / "none"
    no_tokenizer = f"{only} has no tokenizer files (none of tokenizer.json"
    out = train(
        env, "--algo", "grpo", "--steps", "1", "--run_name", "only_config", "--model", str(only)
    )
    assert out.returncode != 0 and no_tokenizer in out.stderr, out.stderr[-3000:]
    assert not (env / "out" / "runs" / "only_config").exists()
    commands = [
        [str(ROOT / "eval.py"), "--model", str(none), "--judge_model", str(only)],
        ["-m", "scripts.dump", "--model", str(none), "--dump", "x.json"],  # the rollout dump
    ]
    for command in commands:
        out = subprocess.run(
            [sys.executable, *command],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode != 0, out.stderr[-3000:]
        assert f"no model at {none}: no such directory" in out.stderr, out.stderr[-3000:]
        assert command[0] == "-m" or no_tokenizer in out.stderr  # eval.py: both at once
        assert not (tmp_path / "out").exists()  # nothing was written or loaded, not even the world
