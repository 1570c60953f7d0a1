"""train.py in two CPU processes (accelerate launch, gloo): every rank rolls out its share of each
step with its own engine and retriever. Each algo runs 2 steps under a probe (this file, run as a
script) that records what each rank rolled out, trained and evaluated; the tests check the logged
metrics against both ranks' records, the evaluation against one process's, a resume after kill -9,
and the update's normalisation against one process on the same samples.

On CPU, `accelerate launch --cpu --num_processes 2` starts ONE process (accelerate 1.15 takes its
simple launcher for --cpu unless mpirun is configured); torchrun's launcher (--multi_gpu) with
ACCELERATE_USE_CPU=1 starts two, on gloo."""

import faulthandler
import importlib.util
import json
import os
import pickle
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # as a script (accelerate launch), for train, rollout, ...

WATCHDOG = 500  # seconds: a probe or parity run (this file as a script) past it dumps its stacks
TIMING = ("time", "seconds")  # metrics that measure the machine, not the run


def launch_command(script, *args, processes=2) -> list[str]:
    """`script` under accelerate's launcher in `processes` CPU processes (a free port each time)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = "--multi_gpu --num_machines 1 --mixed_precision no --dynamo_backend no".split()
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *launcher,
        "--num_processes",
        str(processes),
        "--main_process_port",
        str(port),
        str(script),
        *map(str, args),
    ]


# CPU processes on gloo, with any GPU hidden (a visible one makes the launcher's ranks pick CUDA)
CPU = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def launch_train(env, *args, script=ROOT / "train.py", before=()) -> subprocess.CompletedProcess:
    """train.py's flags (the tests' fast ones, then `args`) given to `script` after `before` (a
    probe: this file or test_fsdp.py, its mode and records), in two CPU processes; the output
    captured."""
    from test_train import train_command

    flags = train_command(env, *args)[2:]  # without "python train.py"
    return subprocess.run(
        launch_command(script, *before, *flags),
        cwd=env,
        capture_output=True,
        text=True,
        timeout=600,
        env=CPU,
    )


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def check_lr(rows: list[dict], steps: list[dict]):
    """`train/lr` after every step is one process's: the warmup counts the applied optimizer steps
    (`steps`: a rank's records, each step's gradient norms one per applied step), never processes
    (Accelerate's prepared scheduler steps once per process per call unless told not to)."""
    import train

    args, applied = train.Args(), 0
    assert len(rows) == len(steps) > 0
    for row, step in zip(rows, steps):
        applied += len(step["grad_norms"])
        want = args.lr * min(1.0, applied / args.warmup_steps)  # constant after linear warmup
        assert row["train/lr"] == pytest.approx(want, rel=1e-6), (row["step"], applied)


def strip(rows):
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMING)} for r in rows]


# ---- every algo, 2 steps, under the probe --------------------------------------------------------

ALGOS = ["grpo", "tree_grpo", "branpo", "carl", "treeps"]
STEP = "--steps 2 --eval_every 2 --eval_n 8 --prompts_per_step 4 --checkpoint_every 1".split()


@pytest.fixture(scope="module")
def launched(env, tmp_path_factory):
    """algo -> (its run directory, both ranks' probe records, the launcher's output): each algo
    launched once, on first use."""
    from test_train import train_command

    done = {}

    def run(algo):
        if algo not in done:
            records = tmp_path_factory.mktemp(f"probe_{algo}")
            flags = train_command(env, "--algo", algo, "--run_name", f"mp_{algo}", *STEP)[2:]
            out = subprocess.run(
                launch_command(Path(__file__), "probe", records, *flags),
                cwd=env,
                capture_output=True,
                text=True,
                timeout=900,
                env=CPU,
            )
            assert out.returncode == 0, out.stderr[-3000:]
            ranks = [pickle.loads((records / f"rank{r}.pkl").read_bytes()) for r in (0, 1)]
            done[algo] = (env / "out" / "runs" / f"mp_{algo}", ranks, out)
        return done[algo]

    return run


@pytest.mark.parametrize("algo", ALGOS)
def test_two_processes_split_every_step_and_log_the_whole_of_it(env, launched, algo):
    import train
    from infra import data, health, loaders

    run, ranks, out = launched(algo)
    assert "2 processes, each rolling out its share of every step" in out.stdout
    assert "Traceback" not in out.stderr and out.stdout.count("engine: hf") == 1  # rank 0 says it
    rows = metrics(run)
    assert [(r["step"], "eval/em" in r) for r in rows] == [(0, 1), (1, 0), (2, 0), (2, 1)]
    # each prompt of a step rolled out once, on one rank: rank 0 the first half, rank 1 the second
    train_rows = loaders.load_rows(str(env / "out" / "world"), "train")
    order = list(range(len(train_rows)))
    random.Random(0).shuffle(order)  # the data order of --seed 0
    for step, row in enumerate(r for r in rows if "train/loss" in r):
        want = [train_rows[order[(4 * step + i) % len(order)]].question for i in range(4)]
        mine = [rec["steps"][step] for rec in ranks]
        assert mine[0]["questions"] + mine[1]["questions"] == want
        assert len(mine[0]["questions"]) == 2
        # the logged metrics are those of both ranks' trees, samples and tokens together
        expected = health.metrics(mine[0]["prompts"] + mine[1]["prompts"])
        for key, value in expected.items():
            if "seconds" not in key:
                assert row[key] == value, key
        samples = mine[0]["samples"] + mine[1]["samples"]
        assert row["train/samples"] == len(samples)
        assert row["train/tokens_trained"] == sum(sum(s.loss_mask) for s in samples)
        stats = mine[0]["stats"] + mine[1]["stats"]
        # the update's statistics over every trained token of both ranks
        expected = health.train_metrics(
            stats, mine[0]["grad_norms"], mine[0]["losses"], train.Args()
        )
        for key, value in expected.items():  # kl, entropy, clip and TIS fractions, quantiles...
            assert row[key] == value, key
        assert sum(len(s["kl"]) for s in stats) == row["train/tokens_trained"]  # one epoch
        # one gradient (DDP's mean) and one loss on both ranks: the mean of the ranks' losses
        assert mine[0]["grad_norms"] == mine[1]["grad_norms"] and mine[0]["grad_norms"]
        assert mine[0]["losses"] == mine[1]["losses"]
        n = len(mine[0]["losses"])
        loss = sum(sum(rec["loss_items"]) for rec in mine) / 2 / n
        assert row["train/loss"] == pytest.approx(loss, rel=1e-6, abs=1e-9)
    check_lr([r for r in rows if "train/loss" in r], ranks[0]["steps"])
    # every rank holds the logged row (timings aside), so every rank takes the env-error stop's
    # decision alike
    assert ranks[0]["checked"] == ranks[1]["checked"] == strip(r for r in rows if "train/loss" in r)
    # each test question evaluated once, on one rank (steps 0 and 2)
    test_rows = data.spread(loaders.load_rows(str(env / "out" / "world"), "test"), 8)
    for call in (0, 1):
        asked = [q for rec in ranks for q, _ in rec["evals"][call]]
        assert asked == [r.question for r in test_rows]
    assert (run / "final" / "config.json").exists() and (run / "curve.png").exists()
    state = json.loads((run / "checkpoint-2" / "trainer_state.json").read_text())
    assert len(state["ranks"]) == 1 and state["rng"] != state["ranks"][0]["rng"]  # own streams


def test_two_process_eval_equals_one_process_eval_of_the_same_model(env, launched):
    # the grpo run's step-2 evaluation (4 questions per rank) against one process evaluating its
    # final model: the same report, and the same answer to every question
    import eval as evaluation
    import rollout
    from infra import data, engines, loaders, policy, protocol
    from infra.search import BM25Retriever, load_corpus

    run, ranks, _ = launched("grpo")
    (row,) = [r for r in metrics(run) if "eval/em" in r and r["step"] == 2]
    world = env / "out" / "world"
    test_rows = data.spread(loaders.load_rows(str(world), "test"), 8)
    model, tok = policy.load_policy(str(run / "final"))
    cfg = protocol.for_eval(protocol.AgentConfig(max_step_tokens=12, max_turns=2))
    search = BM25Retriever(load_corpus(str(world / "corpus.jsonl")))
    agent = rollout.Agent(engines.HFEngine(model, tok), search, tok, cfg, seed=0)
    asked = []
    chain = evaluation.chain

    def recording_chain(agent, rows, rng, cfg):
        prompts = chain(agent, rows, rng, cfg)
        asked.extend(answers(rows, prompts))
        return prompts

    evaluation.chain = recording_chain
    try:
        report = evaluation.evaluate(agent, test_rows)
    finally:
        evaluation.chain = chain
    assert {f"eval/{k}": v for k, v in report.items() if k not in ("by_source", "questions")} == {
        k: v for k, v in row.items() if k != "step"
    }
    assert asked == ranks[0]["evals"][1] + ranks[1]["evals"][1]


def answers(rows, prompts) -> list[tuple[str, str]]:
    """(question, its first trajectory's text) per question."""
    from tree import path

    return [
        (row.question, "".join(n.text + n.obs_text for n in path(trees[0].leaves()[0])))
        for row, trees in zip(rows, prompts)
    ]


# ---- resume after kill -9 ------------------------------------------------------------------------


def test_resume_after_kill_9_of_every_process_continues_exactly(env, launched, tmp_path):
    # the job (launcher, torchrun's agent and both ranks, each of which torchrun starts in a
    # session of its own) killed with SIGKILL once checkpoint-1 is complete, then resumed: the run
    # logs what the uninterrupted grpo run logged, each step once
    import psutil
    from test_train import train_command

    reference, _, _ = launched("grpo")
    flags = train_command(env, "--algo", "grpo", "--run_name", "mp_killed", *STEP)[2:]
    cmd = launch_command(ROOT / "train.py", *flags)
    cmd[cmd.index("--steps") + 1] = "50"
    run = env / "out" / "runs" / "mp_killed"
    with open(tmp_path / "stderr", "w") as stderr:
        job = subprocess.Popen(cmd, cwd=env, env=CPU, stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.time() + 600
    while time.time() < deadline and job.poll() is None:
        if (run / "latest").exists() and (run / "latest").read_text() == "checkpoint-1":
            break
        time.sleep(0.02)
    assert job.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
    every = [job.pid] + [p.pid for p in psutil.Process(job.pid).children(recursive=True)]
    for pid in every:
        os.kill(pid, signal.SIGKILL)
    job.wait()
    assert (run / "latest").read_text() == "checkpoint-1", (tmp_path / "stderr").read_text()
    alive = lambda: [
        p for p in every if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
    ]
    deadline = time.time() + 30
    while alive() and time.time() < deadline:  # dead, or zombies of the killed launcher
        time.sleep(0.1)
    assert not alive()
    resume = launch_command(ROOT / "train.py", *flags, "--resume")
    out = subprocess.run(resume, cwd=env, capture_output=True, text=True, timeout=900, env=CPU)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resumed from {run}/checkpoint-1 at step 1" in out.stdout
    assert strip(metrics(run)) == strip(metrics(reference))
    # a checkpoint of 2 processes holds both sampling streams: one process may not go on from it
    one = subprocess.run(
        [*train_command(env, "--algo", "grpo", "--run_name", "mp_killed", *STEP), "--resume"],
        cwd=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    # refused before any load, saying what the checkpoint holds and what this launch is
    said = "holds whole weights (one process or DDP) over 2 processes, and this launch holds whole "
    said += "weights (one process or DDP) over 1 process"
    assert one.returncode != 0 and said in one.stderr, one.stderr[-3000:]
    assert "accelerate launch --num_processes 2" in one.stderr


def test_sigterm_to_the_launcher_stops_both_ranks_after_one_step_and_resume_continues(
    env, tmp_path
):
    # a cluster's preemption: SIGTERM to the launcher, which passes it to both ranks; they finish
    # the step in progress together (any rank asked stops every rank), save one checkpoint and
    # exit, none hangs in the teardown; --resume then logs what the uninterrupted run logged
    flags = "--algo grpo --prompts_per_step 4 --eval_every 0 --checkpoint_every 0".split()
    straight = launch_train(env, *flags, "--steps", "3", "--run_name", "mp_straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    from test_train import train_command

    cmd = launch_command(
        ROOT / "train.py",
        *train_command(env, *flags, "--steps", "50", "--run_name", "mp_sigterm")[2:],
    )
    run = env / "out" / "runs" / "mp_sigterm"
    with open(tmp_path / "out", "w") as stdout, open(tmp_path / "err", "w") as stderr:
        job = subprocess.Popen(cmd, cwd=env, env=CPU, stdout=stdout, stderr=stderr)
        deadline = time.time() + 600
        while time.time() < deadline and job.poll() is None and not metrics_written(run):
            time.sleep(0.05)
        job.send_signal(signal.SIGTERM)  # in step 2, or between steps 1 and 2
        job.wait(timeout=300)
    out, err = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    assert job.returncode != 0, err[-3000:]  # the run is not finished
    done = len(metrics(run))
    assert f"stopped by SIGTERM after step {done} of 50: saved {run}/checkpoint-{done}" in out, (
        out[-3000:] + err[-3000:]
    )
    assert (run / "latest").read_text() == f"checkpoint-{done}" and not (run / "final").exists()
    resume = launch_train(env, *flags, "--steps", "3", "--run_name", "mp_sigterm", "--resume")
    assert resume.returncode == 0, resume.stderr[-3000:]
    assert f"resumed from {run}/checkpoint-{done} at step {done}" in resume.stdout
    assert strip(metrics(run)) == strip(metrics(env / "out" / "runs" / "mp_straight"))


def metrics_written(run: Path) -> bool:
    return (run / "metrics.jsonl").exists() and (run / "metrics.jsonl").stat().st_size > 0


def test_a_live_lock_refuses_two_processes(env):
    # another process holds the run directory's lock: rank 0 refuses, and rank 1, waiting for it at
    # a barrier, is ended by the launcher (no hang)
    from test_train import held_lock

    run = env / "out" / "runs" / "mp_locked"
    with held_lock(run):
        out = launch_train(env, "--algo", "grpo", "--steps", "1", "--run_name", "mp_locked")
    assert out.returncode != 0 and f"in use by process {os.getpid()} testhost" in out.stderr
    assert not (run / "metrics.jsonl").exists()


def test_prompts_per_step_must_split_over_the_processes(env):

    out = launch_train(env, "--algo", "grpo", "--run_name", "mp_odd", "--prompts_per_step", "3")
    assert out.returncode != 0
    assert "--prompts_per_step 3 does not split over the 2 processes" in out.stderr
    assert "nothing was loaded or run" in out.stderr and not (env / "out/runs/mp_odd").exists()


def test_a_refused_resume_in_three_processes_says_why_once_and_no_rank_crashes(env):
    # a --resume that changes --prompts_per_step, in 3 processes: rank 0 refuses, and tells every
    # rank. Before, the other ranks went on to a barrier and each died there with gloo's raw
    # "Connection closed by peer" traceback when rank 0 left
    from test_train import train_command

    run = env / "out" / "runs" / "mp_refused"
    run.mkdir(parents=True)
    # config.json as a run with --prompts_per_step 6 left it (--resume compares the flags it holds)
    (run / "config.json").write_text(json.dumps({"prompts_per_step": 6}))
    flags = train_command(env, "--algo", "grpo", "--run_name", "mp_refused", "--resume")[2:]
    out = subprocess.run(
        launch_command(ROOT / "train.py", *flags, "--prompts_per_step", "3", processes=3),
        cwd=env,
        capture_output=True,
        text=True,
        timeout=600,
        env=CPU,
    )
    said = "these flags differ from its config.json, and a step trained under them would not be "
    said += "that run's: --prompts_per_step 3 (the run: 6)"
    assert out.returncode != 0 and out.stderr.count(said) == 1, out.stderr[-3000:]
    # no rank's traceback (the launcher still reports the failed ranks its own way)
    assert "Connection closed" not in out.stderr and f'File "{ROOT}' not in out.stderr
    assert os.listdir(run) == ["config.json"]  # nothing written


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed (docs/vllm_cpu.md)"
)
def test_vllm_engine_on_every_rank(env, tmp_path):
    # every rank runs its own vLLM engine (vLLM's external_launcher backend: data parallel over the
    # launcher's process group), rolls out its share and, after each update, samples from its own
    # replica's weights: the trainer's pi_old agrees with each engine's log-probs at step 2
    from test_train import FAST, TINY_WARM

    shutil.copytree(env / "out" / "world", tmp_path / "world")  # the small world
    steps = "--steps 2 --eval_every 2 --checkpoint_every 2 --lr 1e-2 --ppo_epochs 2".split()
    train = ["--engine", "vllm", "--algo", "tree_grpo", "--out_dir", tmp_path, *FAST, *steps]
    out = subprocess.run(
        launch_command(ROOT / "train.py", *train, *TINY_WARM),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env={**CPU, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "engine: vllm (requested" in out.stdout and "2 processes, each rolling" in out.stdout
    rows = metrics(tmp_path / "runs" / "tree_grpo-seed0")
    assert [(r["step"], "eval/em" in r) for r in rows] == [(0, 1), (1, 0), (2, 0), (2, 1)]
    one, two = [r for r in rows if "train/loss" in r]
    assert two["train/kl"] > 1e-3, two  # step 1 moved the policy
    for r in (one, two):
        assert r["train/tis_ratio_max_dev"] < 1e-3 and r["train/skipped_steps"] == 0, r


# ---- the update's normalisation ------------------------------------------------------------------


def test_two_processes_take_one_process_update_on_the_same_samples(tmp_path):
    # 7 fixed samples, 5 on rank 0 and 2 on rank 1 (one process: all 7), 2 mini-batches of 2-row
    # micro-batches (rank 1 gets a zero-weight padding micro-batch in the first), 2 epochs, SGD:
    # the weights after the 4 updates, the losses and the gradient norms are one process's, for
    # token-mean and seq-mean-token-mean
    for processes in (1, 2):
        out = subprocess.run(
            parity_command(tmp_path, processes),
            capture_output=True,
            text=True,
            timeout=600,
            env=CPU,
        )
        assert out.returncode == 0, out.stderr[-3000:]
    import torch

    one, two = (torch.load(tmp_path / f"parity{n}.pt") for n in (1, 2))
    for agg in ("token-mean", "seq-mean-token-mean"):
        # gradients reduced once per mini-batch, at its last micro-batch: 2 epochs x 2 mini-batches
        # x 1 bucket (the tiny model's gradients fit DDP's first), not once per micro-batch (rank
        # 0's mini-batches hold 2 and 1: 6 all-reduces)
        assert two[agg]["reduced"] == [0] * 4, two[agg]["reduced"]
        assert two[agg]["losses"] == pytest.approx(one[agg]["losses"], rel=1e-4)
        assert two[agg]["norms"] == pytest.approx(one[agg]["norms"], rel=1e-4)
        moved = 0.0
        for name, w in one[agg]["weights"].items():
            torch.testing.assert_close(two[agg]["weights"][name], w, rtol=1e-4, atol=1e-5)
            moved = max(moved, (w - one["start"][name]).abs().max().item())
        assert moved > 5e-3  # the updates moved the weights (10^5 times the difference)


# ---- the probe: this file as a script, under the launcher ----------------------------------------


def probe(records: Path, argv: list[str]):
    """train.py with `argv`, recording on each rank (records/rank{r}.pkl) per step the questions it
    rolled out, its trees, samples, update statistics and per-micro-batch losses, and per
    evaluation its (question, answer text) pairs, and the metrics row the env-error stop reads."""
    import dataclasses

    import eval as evaluation
    import rollout
    import train
    from advantages import CreditConfig
    from infra import flags, protocol, run
    from infra.warmstart import WarmConfig
    from retriever import RetrieverConfig

    rank = int(os.environ.get("RANK", "0"))
    mine = {"steps": [], "evals": [], "checked": []}
    save = lambda: (records / f"rank{rank}.pkl").write_bytes(pickle.dumps(mine))
    to_samples, update, ppo_loss, chain, check = (
        train.to_samples,
        train.update,
        train.ppo_loss,
        evaluation.chain,
        run.check_env_errors,
    )

    def recording(grow):
        def recording_grow(agent, examples, rng, cfg):
            prompts = grow(agent, examples, rng, cfg)
            mine["steps"].append(
                {"questions": [e.question for e in examples], "prompts": prompts, "loss_items": []}
            )
            return prompts

        return recording_grow

    def recording_to_samples(trajectories):
        mine["steps"][-1]["samples"] = to_samples(trajectories)
        return mine["steps"][-1]["samples"]

    def recording_ppo_loss(**inputs):
        loss, stats = ppo_loss(**inputs)
        mine["steps"][-1]["loss_items"].append(loss.item())
        return loss, stats

    def recording_update(*args):
        updated = update(*args)
        mine["steps"][-1].update(
            stats=[{k: v.cpu() for k, v in s.items()} for s in updated.stats],
            grad_norms=updated.grad_norms,
            losses=updated.losses,
        )
        save()
        return updated

    def recording_check(history, args, where):  # the env-error stop: what this rank decides on
        mine["checked"].append(strip(history)[-1])
        return check(history, args, where)

    def recording_chain(agent, rows, rng, cfg):
        prompts = chain(agent, rows, rng, cfg)
        mine["evals"].append(answers(rows, prompts))
        save()
        return prompts

    rollout.ALGOS = {
        name: dataclasses.replace(algo, grow=recording(algo.grow))
        for name, algo in rollout.ALGOS.items()
    }
    train.to_samples, train.update, train.ppo_loss, evaluation.chain = (
        recording_to_samples,
        recording_update,
        recording_ppo_loss,
        recording_chain,
    )
    run.check_env_errors = recording_check
    sys.argv = [str(ROOT / "train.py"), *argv]
    train.main(
        *flags.parse(
            train.Args,
            rollout.RolloutConfig,
            CreditConfig,
            protocol.AgentConfig,
            RetrieverConfig,
            WarmConfig,
        )
    )


def parity_command(out: Path, processes: int, *extra: str) -> list[str]:
    """This file's parity run (`extra`: "fsdp" to shard the policy) in one process or under the
    launcher."""
    if processes == 1:
        return [sys.executable, __file__, "parity", str(out), *extra]
    return launch_command(Path(__file__), "parity", out, *extra, processes=processes)


def parity(out: Path, fsdp: bool):
    """micro_batches, their log-probs and update on 7 fixed samples split 5 / 2 over two ranks (all
    7 on one), from one tiny model, for both loss aggregations; rank 0 saves the weights, losses
    and norms. With `fsdp`, the policy is sharded as test_fsdp.py shards it."""
    import copy

    import torch
    from accelerate import Accelerator
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from transformers import get_constant_schedule

    import train
    from infra import run, shard, warmstart
    from tree import Sample

    if fsdp:
        from test_fsdp import shard_in_prepare

        shard_in_prepare()
    accelerator = Accelerator()
    tok = warmstart.world_tokenizer()
    start = warmstart.tiny_llama(tok, hidden=32, layers=1, heads=2)
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(7):
        n, prompt = 6 + 3 * (i % 3), 3  # rows of 6, 9 and 12 tokens, the first 3 the prompt
        ids = torch.randint(4, len(tok), (n,), generator=g).tolist()
        mask = [0] * prompt + [int(x) for x in torch.rand(n - prompt, generator=g) < 0.8]
        adv = (torch.randn(1, generator=g).item() * m for m in mask)
        logp = (-torch.rand(1, generator=g).item() * 3 * m for m in mask)
        samples.append(Sample(ids, mask, list(adv), list(logp), f"s{i}"))
    counts = [7] if accelerator.num_processes == 1 else [5, 2]
    first = sum(counts[: accelerator.process_index])
    mine = samples[first : first + counts[accelerator.process_index]]
    saved = {"start": {k: v.clone() for k, v in start.state_dict().items()}}
    for agg in ("token-mean", "seq-mean-token-mean"):
        args = train.Args(
            micro_batch_size=2, ppo_mini_batches=2, ppo_epochs=2, loss_agg=agg, kl_coef=0.1
        )
        model, ref = copy.deepcopy(start), copy.deepcopy(start).requires_grad_(False)
        optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
        model, optimizer = accelerator.prepare(model, optimizer)
        reduced = []  # DDP's gradient all-reduces (one per bucket and synchronised backward)
        if accelerator.num_processes > 1 and not fsdp:

            def counting(state, bucket, reduced=reduced):
                reduced.append(bucket.index())
                return allreduce_hook(state, bucket)

            model.register_comm_hook(None, counting)
        minis = train.micro_batches(mine, counts, accelerator, args, 0)
        train.add_old_and_ref_logprobs(minis, accelerator, model, ref, False)
        updated = train.update(
            minis, accelerator, model, optimizer, get_constant_schedule(optimizer), args
        )
        norms, losses, skipped = updated.grad_norms, updated.losses, updated.skipped
        # one process: micro-batches 0, 2 and 1, 3; two: rank 0 rows 0, 1 | 4 and 2, 3, rank 1 5 |
        # padding and 6
        want = [2, 2] if accelerator.num_processes == 1 else [2, 1]
        assert skipped == 0 and [len(m) for m in minis] == want, [len(m) for m in minis]
        saved["dtensor"] = shard.sharded(model)
        weights = shard.gather(accelerator, model)
        saved[agg] = {"weights": {k: v.detach().clone() for k, v in weights.items()}}
        saved[agg].update(norms=norms, losses=losses, reduced=reduced)
    if accelerator.is_main_process:
        torch.save(saved, out / f"parity{accelerator.num_processes}{'_fsdp' * fsdp}.pt")
    accelerator.wait_for_everyone()
    run.end_processes(accelerator, 0)  # as train.py ends


if __name__ == "__main__":
    # a hang shows where every thread of each rank waits (on stderr, which the tests print) and
    # fails the test before its subprocess timeout
    faulthandler.dump_traceback_later(WATCHDOG, exit=True)
    if sys.argv[1] == "probe":
        probe(Path(sys.argv[2]), sys.argv[3:])
    else:
        parity(Path(sys.argv[2]), sys.argv[3:] == ["fsdp"])


def test_deal_splits_a_step_as_one_process_would_and_pads_the_ranks():
    # 7 samples, micro-batches of 2, at most 2 mini-batches. One process: micro-batches g // 2 =
    # {0,1} {2,3} {4,5} {6}, dealt round-robin: mini-batch 0 = {0,1,4,5}, 1 = {2,3,6}
    from infra import shard
    from train import mini_batch_partition

    minis = mini_batch_partition(7, 2, 2)
    assert minis == [[0, 1, 4, 5], [2, 3, 6]]
    assert shard.deal(minis, [7], 0, 2) == [[[0, 1], [4, 5]], [[2, 3], [6]]]
    # the same 7 over two ranks, 5 and 2 (rank 1's samples are the step's 5 and 6): mini-batch 0
    # holds rank 0's 0,1,4 (2 micro-batches) and rank 1's 5 (its 0: 1 micro-batch, padded with an
    # empty one to rank 0's 2); mini-batch 1 holds rank 0's 2,3 and rank 1's 6 (its 1): 1 each
    assert shard.deal(minis, [5, 2], 0, 2) == [[[0, 1], [4]], [[2, 3]]]
    assert shard.deal(minis, [5, 2], 1, 2) == [[[0], []], [[1]]]
    # fewer micro-batches than ppo_mini_batches: as many mini-batches as micro-batches
    assert mini_batch_partition(3, 2, 4) == [[0, 1], [2]]
    assert shard.deal([[0, 1], [2]], [3], 0, 2) == [[[0, 1]], [[2]]]
