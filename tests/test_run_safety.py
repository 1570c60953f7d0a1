"""What a run must never do without saying so: delete outside its directory, continue a run under
other flags, read a torn cache, keep steps a retrieval outage degraded, delete an old run before its
own inputs are checked, train on or save non-finite weights, lose the run to a failed final save.
Each test drives train.py (or the function it calls) the way a user or a full disk would."""

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_train import FAST, ROOT, metrics, train, train_command

from infra import files, health, rundir, warmstart
from infra.run import summary


def files_flags(env):
    """Train and test questions and the corpus of the shared world, so that --out_dir needs none."""
    world = env / "out" / "world"
    return [
        *("--data", str(world / "train.jsonl"), "--test_data", str(world / "test.jsonl")),
        *("--corpus", str(world / "corpus.jsonl")),
    ]


ONE_STEP = ("--algo", "grpo", "--steps", "1", "--eval_every", "0")


# ---- 1. --run_name stays under OUT_DIR/runs -----------------------------------------------------


def test_a_run_name_that_is_a_path_is_refused_and_nothing_is_deleted(env, tmp_path):
    # before: --run_name .. --overwrite deleted what OUT_DIR held (another run, the world), and an
    # absolute --run_name deleted that directory's files
    out_dir, victim = tmp_path / "sb" / "out", tmp_path / "victim"
    (out_dir / "runs" / "other").mkdir(parents=True)
    (out_dir / "runs" / "other" / "metrics.jsonl").write_text('{"step": 1}\n')
    (out_dir / "keep.txt").write_text("x")
    victim.mkdir()
    (victim / "file.txt").write_text("x")
    for name in ("..", str(victim), "a/b"):
        out = train(
            env,
            *ONE_STEP,
            *files_flags(env),
            "--out_dir",
            str(out_dir),
            "--run_name",
            name,
            "--overwrite",
        )
        assert out.returncode != 0, out.stdout[-2000:]
        assert f"--run_name {name!r}: must be a name: no '/', not '.' or '..'" in out.stderr
    assert (out_dir / "keep.txt").exists() and (
        out_dir / "runs" / "other" / "metrics.jsonl"
    ).exists()
    assert (victim / "file.txt").exists()


# ---- 2. --resume continues the run it names, under its flags -------------------------------------


def test_resume_refuses_changed_flags_and_a_missing_run_and_allows_a_longer_run(env):
    first = train(
        env,
        "--algo",
        "tree_grpo",
        "--steps",
        "2",
        "--checkpoint_every",
        "1",
        "--eval_every",
        "0",
        "--run_name",
        "rs",
    )
    assert first.returncode == 0, first.stderr[-3000:]
    run = env / "out" / "runs" / "rs"
    config, before = (run / "config.json").read_text(), metrics(env, "rs")
    # before: exit 0; steps 3-4 trained grpo, config.json said lr 0.01 while train/lr logged 5e-05
    changed = ("--lr", "1e-2", "--algo", "grpo", "--seed", "5", "--prompts_per_step", "4")
    out = train(
        env,
        "--algo",
        "tree_grpo",
        "--steps",
        "4",
        "--eval_every",
        "0",
        "--run_name",
        "rs",
        "--resume",
        *changed,
    )
    assert out.returncode != 0
    for said in (
        "--lr 0.01 (the run: 5e-05)",
        "--algo grpo (the run: tree_grpo)",
        "--seed 5 (the run: 0)",
        "--prompts_per_step 4 (the run: 2)",
    ):
        assert said in out.stderr, out.stderr[-3000:]
    assert (run / "config.json").read_text() == config and metrics(env, "rs") == before
    # a run cannot end before the step it goes on from
    out = train(
        env,
        "--algo",
        "tree_grpo",
        "--steps",
        "1",
        "--eval_every",
        "0",
        "--run_name",
        "rs",
        "--resume",
    )
    assert out.returncode != 0, out.stdout[-3000:]
    assert "--steps 1 (the checkpoint is at step 2)" in out.stderr, out.stderr[-3000:]
    # before: a mistyped name started a fresh run in silence
    out = train(env, "--algo", "tree_grpo", "--steps", "3", "--run_name", "rss", "--resume")
    assert out.returncode != 0 and "there is no run" in out.stderr, out.stderr[-3000:]
    assert "rs" in re.search(r"the runs in \S+: (.*)\. Pass", out.stderr).group(1).split(", ")
    assert not (env / "out" / "runs" / "rss").exists()
    # longer, and evaluated differently: the same run goes on
    out = train(
        env,
        "--algo",
        "tree_grpo",
        "--steps",
        "3",
        "--eval_every",
        "3",
        "--run_name",
        "rs",
        "--resume",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert [r["step"] for r in metrics(env, "rs") if "train/loss" in r] == [1, 2, 3]


# ---- 3. caches written whole: a torn one is named and rebuilt ------------------------------------


class FullDisk:
    """A file opened for writing that takes a few bytes, then finds the disk full."""

    def __init__(self, name, mode):
        self.f = open(name, mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, text):
        self.f.write(text[:3])
        raise OSError(28, "No space left on device")


def test_files_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    files.write_json(path, {"lr": 1})

    monkeypatch.setattr(files, "open", FullDisk, raising=False)
    with pytest.raises(OSError, match="No space"):
        files.write_json(path, {"lr": 2})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"lr": 1} and os.listdir(tmp_path) == ["config.json"]

    def fails(d):
        Path(d, "model.safetensors").write_bytes(b"part")
        raise OSError(28, "No space left on device")

    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "model.safetensors").write_bytes(b"whole")
    with pytest.raises(OSError, match="No space"):
        files.write_dir(tmp_path / "final", fails)
    assert (tmp_path / "final" / "model.safetensors").read_bytes() == b"whole"
    assert sorted(os.listdir(tmp_path)) == ["config.json", "final"]


def test_a_lock_probe_refuses_a_held_lock_and_writes_nothing(tmp_path):
    # before: compare.py probed a running arm's run.lock with hold_lock, which truncates the file
    # and writes its own PID in it when the lock is free
    lock = tmp_path / "run.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from infra import files; "
            f"f = files.hold_lock({str(lock)!r}, 'a run'); print('held', flush=True); "
            "time.sleep(60)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        was = lock.read_text()
        with pytest.raises(SystemExit, match=rf"a run is in use by process {holder.pid} "):
            files.refuse_if_held(lock, "a run")
        assert lock.read_text() == was
    finally:
        holder.kill()
        holder.wait()
    files.refuse_if_held(lock, "a run")  # free now: nothing refused, nothing written
    assert lock.read_text() == was


def test_a_directory_write_killed_between_its_renames_is_finished(tmp_path):
    # before: after a SIGKILL between the two renames only final.old and final.tmp remained: the
    # run looked unfinished and the next write deleted both
    final = tmp_path / "final"
    for name, text in (("final.old", "previous"), ("final.tmp", "new")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_text(text)
    said = files.finish_swap(final)
    assert "killed between its renames was finished" in said
    assert os.listdir(tmp_path) == ["final"] and (final / "model.safetensors").read_text() == "new"
    (tmp_path / "final.old").mkdir()  # killed after the swap: the previous version only goes
    assert files.finish_swap(final) == "" and os.listdir(tmp_path) == ["final"]
    final.rename(tmp_path / "final.old")  # no new version to finish with: the previous comes back
    assert "was undone" in files.finish_swap(final) and os.listdir(tmp_path) == ["final"]
    assert (final / "model.safetensors").read_text() == "new"


def test_a_warm_start_save_cut_short_leaves_nothing_and_a_torn_cache_is_retrained(
    env, tmp_path, monkeypatch, capsys
):
    # before: a full disk while writing warmstart.json left it empty, and every later run stopped
    # on a bare "JSONDecodeError: Expecting value" naming no file, never retraining
    import rollout
    from scripts import warmstart as driver  # the warm start's train and ensure

    class FullDisk:  # warmstart.json's writer: a few bytes, then the disk is full
        load = staticmethod(json.load)

        @staticmethod
        def dump(obj, f, **kw):
            f.write("")
            raise OSError(28, "No space left on device")

    cfg = warmstart.WarmConfig(copy_steps=2, sft_steps=2, warm_batch_size=2, target_em=0)
    world, out = str(env / "out" / "world"), str(tmp_path / "warmstart")
    monkeypatch.setattr(warmstart, "json", FullDisk)
    with pytest.raises(OSError, match="No space left"):
        driver.train(out, world, cfg, rollout.AgentConfig(), 0)
    assert not os.path.exists(out)  # before: out/warmstart.json, 0 bytes
    monkeypatch.undo()

    # a torn cache (as an earlier version left it) is named, and trained again
    os.makedirs(out)
    Path(out, "warmstart.json").write_text("")
    trained = []
    monkeypatch.setattr(driver, "train", lambda *a, **kw: trained.append(a[0]))
    driver.ensure(out, world, cfg, rollout.AgentConfig(), 0)
    said = capsys.readouterr().out
    assert f"{out}/warmstart.json cannot be read (JSONDecodeError" in said, said
    assert "training it again" in said and trained == [out]


# ---- 4. a retrieval outage's steps are never checkpointed ----------------------------------------


class Outage:
    """BM25 over the shared world's corpus that fails every search but the start's health check
    while `down` is set."""

    def __init__(self, corpus_path):
        from infra.search import BM25Retriever, load_corpus

        self.bm25, self.down = BM25Retriever(load_corpus(corpus_path)), False

    def search(self, queries, k):
        if self.down and list(queries) != ["health check"]:
            raise ConnectionError("the index is gone")
        return self.bm25.search(queries, k)


ALWAYS_SEARCHES = """
import os, runpy, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[1])))
from infra import engines
def search(self, prompts, sampling):  # a policy that always searches (a random one rarely does)
    ids = self.tokenizer.encode("<search> kalo </search>", add_special_tokens=False)
    return [engines.Completion(ids, [-1.0] * len(ids), "stop") for _ in prompts]
engines.HFEngine.generate = search
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def train_with(env, preamble, *args):
    """train.py (as `train`) under `preamble`, which patches the library, then runs the script."""
    cmd = [sys.executable, "-c", preamble, str(ROOT / "train.py"), "--model", str(env / "tiny")]
    cmd += ["--out_dir", str(env / "out"), *FAST, *args]
    return subprocess.run(cmd, cwd=env, capture_output=True, text=True, timeout=600)


def test_a_retrieval_outage_is_not_checkpointed_and_resume_runs_its_steps_again(env):
    from infra.server import SearchServer

    retriever = Outage(str(env / "out" / "world" / "corpus.jsonl"))
    server = SearchServer(retriever, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    flags = (
        "--algo",
        "grpo",
        "--eval_every",
        "0",
        "--run_name",
        "outage",
        "--retriever_url",
        url,
        "--retriever_retries",
        "0",
        "--checkpoint_every",
        "1",
    )
    run = env / "out" / "runs" / "outage"
    try:
        out = train_with(env, ALWAYS_SEARCHES, *flags, "--steps", "1")
        assert out.returncode == 0, out.stderr[-3000:]
        retriever.down = True
        out = train_with(
            env, ALWAYS_SEARCHES, *flags, "--steps", "5", "--resume", "--env_error_patience", "2"
        )
        assert out.returncode != 0 and "stopping: abnormal/env_error" in out.stderr
        # before: checkpoint-2, saved in the outage, was what --resume went on from
        assert (run / "latest").read_text() == "checkpoint-1"
        assert "goes on from the last checkpoint before the outage" in out.stderr
        for step in (2, 3):
            said = f"step {step}: 100% of its trajectories lost to retrieval errors"
            assert said in out.stdout, out.stdout[-3000:]
        retriever.down = False
        out = train_with(env, ALWAYS_SEARCHES, *flags, "--steps", "3", "--resume")
        assert out.returncode == 0 and "resumed from" in out.stdout, out.stderr[-3000:]
        rows = [r for r in metrics(env, "outage") if "train/loss" in r]
        assert [(r["step"], r["abnormal/env_error"]) for r in rows] == [(1, 0), (2, 0), (3, 0)]
    finally:
        server.shutdown()
        server.server_close()


def test_treepo_rides_out_an_outage_as_the_other_credits_do(env):
    # before: a prompt whose every leaf was lost to retrieval errors made TreePO's credit average
    # an empty list, and the run died with a raw "StatisticsError: fmean requires at least one
    # data point" at step 1; now it says what GRPO says of such steps and stops the same way
    from infra.server import SearchServer

    retriever = Outage(str(env / "out" / "world" / "corpus.jsonl"))
    retriever.down = True  # every search but the start's health check fails
    server = SearchServer(retriever, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    flags = ("--algo", "tree_grpo", "--tree_mode", "treepo", "--eval_every", "0", "--steps", "3")
    flags += ("--run_name", "treepo_outage", "--retriever_url", url, "--retriever_retries", "0")
    try:
        out = train_with(env, ALWAYS_SEARCHES, *flags, "--env_error_patience", "2")
    finally:
        server.shutdown()
        server.server_close()
    assert "StatisticsError" not in out.stderr, out.stderr[-3000:]
    assert out.returncode != 0 and "stopping: abnormal/env_error" in out.stderr, out.stderr[-3000:]
    for step in (1, 2):
        said = f"step {step}: 100% of its trajectories lost to retrieval errors"
        assert said in out.stdout, out.stdout[-3000:]


def test_the_last_line_names_degraded_steps_and_a_run_that_trained_nothing():
    rows = [
        {"step": 1, "abnormal/env_error": 0.0, "train/tokens_trained": 0.0},
        {"step": 2, "abnormal/env_error": 0.75, "train/tokens_trained": 0.0},
    ]
    said = summary(rows, {}, 1.0, "runs/x")
    assert "DEGRADED: steps 2 (75%) lost trajectories to retrieval errors" in said
    assert "NOTHING WAS TRAINED" in said and "--max_traj_tokens" in said


def test_a_run_whose_rollouts_never_differed_says_nothing_was_trained(env):
    # before: --temperature 0 or --grpo_G 1 gave every advantage 0, and the run ended "done"
    rows = [
        {"step": s, "rollout/effective_groups": 0.0, "train/tokens_trained": 9.0} for s in (1, 2)
    ]
    said = summary(rows, {}, 1.0, "runs/x")
    assert "NOTHING WAS TRAINED: at every step each prompt's rollouts had one reward" in said
    assert "--temperature 0, --grpo_G 1" in said
    rows[1]["rollout/effective_groups"] = 0.5
    assert "NOTHING" not in summary(rows, {}, 1.0, "runs/x")
    out = train(env, *ONE_STEP, "--run_name", "g1", "--grpo_G", "1")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "NOTHING WAS TRAINED: at every step" in out.stdout, out.stdout[-2000:]


def test_max_traj_tokens_1_says_nothing_was_trained(env):
    # before: the run ended "done in ..." as if it had trained
    out = train(env, *ONE_STEP, "--run_name", "nothing", "--max_traj_tokens", "1")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "NOTHING WAS TRAINED" in out.stdout, out.stdout[-2000:]


# ---- 6. --overwrite deletes the old run only once the new one's inputs loaded --------------------


def test_overwrite_keeps_the_old_run_when_the_new_one_cannot_start(env, tmp_path):
    first = train(env, *ONE_STEP, "--run_name", "ow")
    assert first.returncode == 0, first.stderr[-3000:]
    run = env / "out" / "runs" / "ow"
    held, config = sorted(os.listdir(run)), (run / "config.json").read_text()
    dup = tmp_path / "dupcorpus.jsonl"
    dup.write_text('{"id": "1", "contents": "a\\nb"}\n{"id": "1", "contents": "c\\nd"}\n')
    flags = files_flags(env)
    flags[flags.index("--corpus") + 1] = str(dup)
    out = train(env, *ONE_STEP, "--run_name", "ow", "--overwrite", *flags)
    assert out.returncode != 0 and "every passage needs its own id" in out.stderr
    # before: only config.json and run.lock were left
    assert sorted(os.listdir(run)) == sorted([*held, "config.next.json"])
    assert (run / "config.json").read_text() == config and (run / "final").is_dir()
    out = train(env, *ONE_STEP, "--run_name", "ow", "--overwrite", "--seed", "1")
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((run / "config.json").read_text())["seed"] == 1
    assert "config.next.json" not in os.listdir(run) and len(metrics(env, "ow")) == 1


# ---- 7. non-finite flags, weights and losses -----------------------------------------------------


def test_non_finite_flags_are_refused(env):
    # before: --lr inf saved an all-NaN final/ and exited 0 with "done"
    out = train(env, *ONE_STEP, "--run_name", "inf", "--lr", "inf", "--clip_high", "nan")
    assert out.returncode != 0
    assert "--lr inf: must be a finite number" in out.stderr, out.stderr[-2000:]
    assert "--clip_high nan: must be a finite number" in out.stderr
    assert not (env / "out" / "runs" / "inf").exists()


def test_a_run_whose_updates_become_nan_stops_and_saves_no_final(env):
    out = train(
        env,
        "--algo",
        "grpo",
        "--steps",
        "3",
        "--eval_every",
        "0",
        "--run_name",
        "nan",
        "--lr",
        "1e30",
        "--warmup_steps",
        "0",
    )
    assert out.returncode != 0 and "stopping at step" in out.stderr, out.stderr[-3000:]
    assert "nothing is saved as final/" in out.stderr
    assert not (env / "out" / "runs" / "nan" / "final").exists()


def test_check_finite_names_the_weights_and_the_step():
    # the names are shard.Weights.nonfinite's (tests/test_engines.py checks how they are found)
    health.check_finite([], 4, 2, 0)
    with pytest.raises(SystemExit, match="step 5: the loss or the gradient norm was NaN"):
        health.check_finite([], 5, 0, 2)
    with pytest.raises(SystemExit, match=r"stopping at step 6: .*1 weight tensors.*\(bias\)"):
        health.check_finite(["bias"], 6, 2, 0)


# ---- 8. final/ written whole; a failed save says what it needed ----------------------------------

FULL_DISK_AT_SAVE = """
import os, runpy, sys, transformers
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[1])))
def full(self, d, *a, **kw):
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, "model.safetensors"), "wb").write(b"part")
    raise OSError(28, "No space left on device")
transformers.PreTrainedModel.save_pretrained = full
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_full_disk_at_the_final_save_leaves_no_torn_final_and_says_what_is_needed(env):
    flags = ("--checkpoint_every", "0", "--run_name", "fullfinal")
    out = train_with(env, FULL_DISK_AT_SAVE, *ONE_STEP, *flags)
    assert out.returncode != 0, out.stdout[-2000:]
    # before: a raw error, and final/ held a torn model.safetensors
    assert "final failed (OSError: [Errno 28] No space left on device)" in out.stderr
    assert "The weights need about" in out.stderr and "MiB are free" in out.stderr
    assert "the last good state: none on disk" in out.stderr, out.stderr[-2000:]
    run = env / "out" / "runs" / "fullfinal"
    assert not (run / "final").exists() and not (run / "final.tmp").exists()


# ---- flags and directories that used to fail with a traceback ------------------------------------


def test_a_negative_seed_a_bad_url_and_an_unwritable_out_dir_stop_before_the_run_dir(env, tmp_path):
    out = train(env, *ONE_STEP, "--run_name", "neg", "--seed", "-1", "--retriever_url", "notaurl")
    assert out.returncode != 0 and "--seed -1: must be an integer >= 0" in out.stderr
    assert "--retriever_url 'notaurl': must be empty or a URL http://HOST:PORT" in out.stderr
    assert not (env / "out" / "runs" / "neg").exists()
    # before: passed the check, then failed in numpy's seeding with a traceback
    out = train(env, *ONE_STEP, "--run_name", "neg", "--seed", str(2**32))
    assert "--seed 4294967296: must be below 2**32 (numpy's seeds are 32-bit)" in out.stderr
    assert not (env / "out" / "runs" / "neg").exists()
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert "is a file, not a directory" in rundir.unwritable(str(blocker / "out"))
    assert rundir.unwritable(str(tmp_path / "new" / "out")) == ""
    if os.geteuid():  # root writes anywhere
        (tmp_path / "ro").mkdir(mode=0o555)
        assert "is not writable" in rundir.unwritable(str(tmp_path / "ro" / "out"))


def test_a_corpus_that_is_a_directory_or_missing_is_refused_before_the_run_dir(env, tmp_path):
    # before: --corpus DIR passed the start's checks, config.json and run.lock were written, and
    # the corpus read ended in a raw IsADirectoryError (a missing one without .jsonl: likewise)
    world = env / "out" / "world"
    for corpus, said in (
        (
            world,
            f"--corpus {str(world)!r}: is a directory, not a corpus file; pass the corpus "
            f"file in it, {world / 'corpus.jsonl'}",
        ),
        (tmp_path / "nothing", "does not exist; write the embedded one with"),
    ):
        flags = files_flags(env)
        flags[flags.index("--corpus") + 1] = str(corpus)
        out = train(env, *ONE_STEP, *flags, "--run_name", "corpus_dir")
        assert out.returncode != 0 and said in out.stderr, out.stderr[-2000:]
        assert "Traceback" not in out.stderr, out.stderr[-2000:]
        assert not (env / "out" / "runs" / "corpus_dir").exists()


def test_a_missing_data_path_is_refused_before_the_run_dir(env, tmp_path):
    # before: --data naming no file or directory, without a .jsonl/.json/.parquet suffix, passed
    # the start's checks as a datasets name; config.json and run.lock were written, then
    # datasets.load_dataset ended in its traceback
    missing, no_test = tmp_path / "questions", tmp_path / "no_test"
    no_test.mkdir()
    flags = files_flags(env)
    flags[flags.index("--data") + 1], flags[flags.index("--test_data") + 1] = missing, no_test
    out = train(env, *ONE_STEP, *map(str, flags), "--run_name", "no_data")
    assert out.returncode != 0, out.stdout[-2000:]
    said = f"--data {str(missing)!r}: does not exist: no file or directory of that name here"
    assert said in out.stderr, out.stderr[-2000:]
    said = f"--test_data {str(no_test)!r}: has no test.parquet or test.jsonl"
    assert said in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert not (env / "out" / "runs" / "no_data").exists()


# ---- 9. --resume refuses what config.json holds against it, checkpoint or not -------------------


def test_resume_of_a_finished_run_without_a_checkpoint_is_refused_and_flags_are_compared(env):
    # before: exit 0, config.json rewritten, metrics.jsonl dropped and final/ replaced by a run of
    # another algorithm, learning rate and seed
    flags = ("--algo", "grpo", "--steps", "2", "--eval_every", "0", "--run_name", "nock")
    first = train(env, *flags, "--checkpoint_every", "0")
    assert first.returncode == 0, first.stderr[-3000:]
    run = env / "out" / "runs" / "nock"
    config, rows = (run / "config.json").read_text(), metrics(env, "nock")
    final = (run / "final" / "model.safetensors").read_bytes()
    changed = ("--algo", "tree_grpo", "--lr", "1e-2", "--seed", "5", "--run_name", "nock")
    out = train(env, "--steps", "2", "--eval_every", "0", *changed, "--resume")
    assert out.returncode != 0, out.stdout[-2000:]
    assert (
        f"--resume: {run} holds a finished run (config.json, curve.png, final, metrics.jsonl)"
        in out.stderr
    )
    assert "no checkpoint to go on from" in out.stderr, out.stderr[-2000:]
    assert (run / "config.json").read_text() == config and metrics(env, "nock") == rows
    assert (run / "final" / "model.safetensors").read_bytes() == final
    # killed before its first checkpoint (no final/): the flags are compared all the same
    files.remove(run / "final")
    out = train(env, "--steps", "2", "--eval_every", "0", *changed, "--resume")
    assert out.returncode != 0, out.stdout[-2000:]
    for said in ("--lr 0.01 (the run: 5e-05)", "--algo tree_grpo (the run: grpo)"):
        assert said in out.stderr, out.stderr[-2000:]
    assert (run / "config.json").read_text() == config


def test_resume_refuses_a_changed_data_file_and_another_mixed_precision(env, tmp_path):
    # before: every answer changed and the rows reordered, or a float32 run resumed under bf16:
    # both resumed in silence
    world = env / "out" / "world"
    data = tmp_path / "train.jsonl"
    data.write_text((world / "train.jsonl").read_text())
    flags = [*files_flags(env), "--algo", "grpo", "--eval_every", "0", "--run_name", "fp"]
    flags[flags.index("--data") + 1] = str(data)
    first = train(env, *flags, "--steps", "1", "--checkpoint_every", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    bf16 = {**os.environ, "ACCELERATE_MIXED_PRECISION": "bf16"}
    cmd = train_command(env, *flags, "--steps", "2", "--resume")
    out = subprocess.run(cmd, cwd=env, capture_output=True, text=True, timeout=600, env=bf16)
    assert out.returncode != 0, out.stdout[-2000:]
    assert "mixed precision bf16 (the run: no;" in out.stderr, out.stderr[-2000:]
    lines = data.read_text().splitlines()
    data.write_text("\n".join(lines[::-1]) + "\n")  # the same rows, reordered
    out = train(env, *flags, "--steps", "2", "--resume")
    assert out.returncode != 0, out.stdout[-2000:]
    assert f"the contents of --data's file {data} (sha256" in out.stderr, out.stderr[-2000:]
    data.write_text("\n".join(lines) + "\n")
    out = train(env, *flags, "--steps", "2", "--resume")
    assert out.returncode == 0 and "resumed from" in out.stdout, out.stderr[-3000:]
    recorded = json.loads((env / "out" / "runs" / "fp" / "config.json").read_text())
    assert recorded["mixed_precision"] == "no" and recorded["inputs"]["data"]["file"] == str(data)


def test_a_latest_file_that_is_empty_or_garbage_falls_back_to_the_newest_readable_checkpoint(
    tmp_path, capsys
):
    # before: a bare ValueError (int() of the garbage), though the checkpoints were intact
    from test_train import WHOLE

    from infra.run import load_checkpoint

    class Loader:  # accelerate's load_state, recording what it loaded
        is_main_process, num_processes = True, 1
        loaded = []

        def load_state(self, path):
            self.loaded.append(os.path.basename(path))

        def print(self, *args):
            print(*args)

    for step in (2, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(
            json.dumps({"step": step, "files": {}})
        )
    for garbage in (b"", b"\xff\xfe garbage"):
        (tmp_path / "latest").write_bytes(garbage)
        assert load_checkpoint(Loader(), str(tmp_path), WHOLE)["step"] == 4
        said = capsys.readouterr().out
        assert f"resume: {tmp_path}/latest holds " in said and "not a checkpoint's name" in said
        assert "resume: fell back to checkpoint-4; the steps after 4 run again" in said
        assert (tmp_path / "latest").read_text() == "checkpoint-4"


def test_a_full_disk_at_the_metrics_or_the_curve_names_the_file_and_keeps_the_curve_whole(
    tmp_path, monkeypatch
):
    # before: a bare OSError that named no file, and a torn curve.png
    from types import SimpleNamespace

    from matplotlib.figure import Figure

    from infra import run

    rank0, args, history = SimpleNamespace(is_main_process=True), SimpleNamespace(log_with=""), []
    run.log({"step": 1, "rollout/reward": 0.5}, history, str(tmp_path), rank0, args)
    curve = (tmp_path / "curve.png").read_bytes()
    assert curve[:8] == b"\x89PNG\r\n\x1a\n"

    def torn(self, path, **kwargs):  # a few bytes, then the disk is full
        Path(path).write_bytes(curve[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", torn)
    with pytest.raises(OSError) as failed:
        run.log({"step": 2, "rollout/reward": 0.7}, history, str(tmp_path), rank0, args)
    said = str(failed.value)
    assert f"writing {tmp_path / 'curve.png'} failed (OSError: [Errno 28] No space left" in said
    assert "MiB free on the disk holding it: if it is full, free space, then --resume" in said
    assert (tmp_path / "curve.png").read_bytes() == curve  # the previous one, whole
    assert sorted(os.listdir(tmp_path)) == ["curve.png", "metrics.jsonl"]
    monkeypatch.undo()

    # metrics.jsonl takes a few bytes, then finds the disk full
    monkeypatch.setattr(run, "open", FullDisk, raising=False)
    with pytest.raises(OSError, match=re.escape(f"writing {tmp_path / 'metrics.jsonl'} failed")):
        run.log({"step": 3, "rollout/reward": 0.9}, history, str(tmp_path), rank0, args)
    monkeypatch.undo()
    assert [row["step"] for row in run.read_metrics(str(tmp_path / "metrics.jsonl"))] == [1, 2]
