"""The training loop's bookkeeping, so that train.py's loop shows the algorithm and names the rest:
a `Book` times the run's stages and each step's phases, gathers and logs the step's metrics over
every rank, stops a run whose retriever fails, evaluates every --eval_every steps, saves the
checkpoints (and one when a signal asks the run to stop), drives the progress bar and says the
run's last word. It stands on infra/run.py (the run directory, metrics.jsonl, checkpoints, signals)
and infra/health.py (what the metrics are); the evaluation it runs is given to it as a function.
"""

import contextlib
import json
import signal
import time
from collections import Counter
from pathlib import Path

from accelerate.utils import gather_object

from infra import flags, health, run


class Book:
    """One run's bookkeeping: made right after the run starts (`run.start`); `begin` once the
    policy, engine and agent exist (a checkpoint restored by `resume`, the starting policy
    evaluated); the loop then goes from `first_step` to --steps, marks each `lap`, ends each step
    with `step_done` and stops early when a signal set `stopped`; `end` closes the run."""

    def __init__(self, accelerator, run_dir: str, args, desc: str):
        self.accelerator, self.run_dir, self.args, self.desc = accelerator, run_dir, args, desc
        self.t_start, self.seconds = time.perf_counter(), {}  # seconds: wall time per stage
        # first_step: the loop's first, 0, or the step a resumed run's checkpoint holds (`resume`)
        self.first_step, self.history, self.skipped, self.done = 0, [], 0, 0
        self.asked, self.stopped = {}, None
        self.laps, self.clock, self.refined = {}, 0.0, Counter()
        self.first_row = {}  # metrics of the run's start (the data filter's), logged at step 0

    @contextlib.contextmanager
    def timed(self, stage: str):
        """Add the wall time of the `with` block to `stage`'s, printed in the run's last word."""
        t0 = time.perf_counter()
        yield
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t0

    def resume(self, rng, counters, engine, parts, evaluate, where: str, refiner=None):
        """With --resume and a checkpoint: restore it (run.resume: `parts`, the model, optimizer
        and scheduler; this rank's sampling stream `rng` and agent `counters`; the engine's
        weights) and the metrics logged up to it. Keeps what the steps need: `evaluate()` (the
        test questions' eval/ metrics, every rank calling), `where` (the retriever, for the
        env-error stop) and the refine agent (or None). A run from step 0 logs `first_row` there,
        if any."""
        a = self.accelerator, self.run_dir, self.args.resume, rng, counters, engine, parts
        self.first_step, self.history, self.skipped = run.resume(*a)
        self.done, self.rng, self.counters, self.parts = self.first_step, rng, counters, parts
        self.evaluate, self.where, self.refiner = evaluate, where, refiner
        if self.first_row and self.first_step == 0:
            self.log({"step": 0, **self.first_row})

    def log(self, row: dict):
        """Log one metrics row (run.log: the history, metrics.jsonl, trackers, curve.png)."""
        run.log(row, self.history, self.run_dir, self.accelerator, self.args)

    def eval(self, step: int):
        """Evaluate after `step` steps: rank 0 prints a line, every rank logs the eval/ row."""
        with self.timed("eval"):
            m = self.evaluate()
            hops = " ".join(f"{k[3:]} {v:.2f}" for k, v in m.items() if k.startswith("em_hop"))
            self.accelerator.print(
                f"step {step}: eval EM {m['em']:.3f} F1 {m['f1']:.3f} on {m['n']} questions"
                + (f" (by hops: {hops})" if hops else "")
                + (f" ({m['env_errors']} more lost to retrieval errors)" if m["env_errors"] else "")
            )
            if self.accelerator.is_main_process:  # each question's id, answer and EM: paired
                # analyses across runs (the same id is the same question)
                lines = "".join(json.dumps(q) + "\n" for q in m["questions"])
                Path(self.run_dir, f"eval_step{step}.jsonl").write_text(lines)
            row = {f"eval/{k}": v for k, v in m.items() if isinstance(v, (int, float))}
            self.log({"step": step, **row})

    def begin(self, rng, counters, engine, parts, evaluate, where: str, refiner=None):
        """Before the loop's first step: `resume` (its arguments), then the starting policy
        evaluated (--eval_start) unless the run resumes, SIGTERM / Ctrl-C set to stop the run after
        its step (with a checkpoint), the progress bar, the first step's clock."""
        self.resume(rng, counters, engine, parts, evaluate, where, refiner)
        args = self.args
        if self.first_step == 0 and args.eval_every and args.eval_start:
            self.eval(0)
        self.asked = run.stop_on_signals()
        self.bar = flags.progress(
            None,
            desc=self.desc,
            disable=not self.accelerator.is_main_process,
            initial=self.first_step,
            total=args.steps,
        )
        self.next_clock()

    def next_clock(self):
        """A step starts: its phases' clock, the refine agent's sums so far."""
        self.clock = time.perf_counter()
        self.refined = Counter(self.refiner.stats) if self.refiner else Counter()

    def lap(self, phase: str):
        """End the step's `phase` (rollout, logprob, update): its wall time is train/time_PHASE."""
        now = time.perf_counter()
        self.laps[phase], self.clock = now - self.clock, now

    def refine_metrics(self) -> Counter:
        """This rank's refine agent's sums over the step: summaries, summary tokens, seconds."""
        return Counter(self.refiner.stats) - self.refined if self.refiner else Counter()

    def step_done(self, step, tree_groups, trajectories, samples, updated, nonfinite):
        """After step `step` (0-based) of `tree_groups` (its trees, a list per prompt),
        `trajectories` and `samples` (what it trained), `updated` (train.Update: stats, gradient
        norms, losses, skipped mini-batches) and `nonfinite` (shard.Weights.nonfinite: the
        weights it left NaN or inf): the metrics over every rank's trees, samples and tokens (in
        rank order) logged, the env-error stop, the stop on non-finite weights, evaluation when
        due, a checkpoint when due (never of a step degraded by a retrieval outage) or asked for by
        a signal (on every rank alike), after which it sets `stopped`: the loop ends."""
        args, accelerator = self.args, self.accelerator
        self.skipped, self.done = self.skipped + updated.skipped, step + 1
        mine = {
            "tree_groups": tree_groups,
            "samples": health.sample_metrics(trajectories, samples),
            "stats": [{k: v.cpu() for k, v in s.items()} for s in updated.stats],
            "refine": self.refine_metrics(),
        }
        every = gather_object([mine])
        refine = sum((r["refine"] for r in every), Counter())
        metrics = {
            **health.metrics([trees for r in every for trees in r["tree_groups"]]),
            **{k: sum(r["samples"][k] for r in every) for k in every[0]["samples"]},
            **health.train_metrics(
                [s for r in every for s in r["stats"]], updated.grad_norms, updated.losses, args
            ),
            "train/skipped_steps": self.skipped,
            "train/lr": self.parts[2].get_last_lr()[0],
            **{f"train/time_{k}": v for k, v in self.laps.items()},
            **(health.refine_metrics(refine) if self.refiner else {}),
        }
        for k, v in self.laps.items():
            self.seconds[f"RL {k}"] = self.seconds.get(f"RL {k}", 0.0) + v
        self.log({"step": step + 1, **metrics})
        degraded = run.check_env_errors(self.history, args, self.where)  # an outage's step
        health.check_finite(nonfinite, step + 1, len(updated.grad_norms), updated.skipped)
        self.bar.set_postfix(
            reward=f"{metrics['rollout/reward']:.3f}",
            em=f"{metrics['rollout/em']:.2f}",
            kl=f"{metrics['train/kl']:.4f}",
            refresh=False,
        )
        if args.eval_every and ((step + 1) % args.eval_every == 0 or step + 1 == args.steps):
            self.eval(step + 1)
        stop = step + 1 < args.steps and run.stop_asked(accelerator, self.asked)
        due = args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and not degraded
        if stop or due:
            a = self.run_dir, step + 1, self.skipped, self.rng, self.counters, self.parts
            run.checkpoint(accelerator, *a)
        if stop:
            self.stopped = self.asked.get("signal", signal.SIGTERM)  # SIGTERM: another rank's
        self.bar.update(1)
        if stop or step + 1 == args.steps:
            self.bar.close()
        self.next_clock()

    def finished(self) -> bool:
        """Whether this is rank 0 of a run that was not stopped by a signal: it saves final/."""
        return self.accelerator.is_main_process and not self.stopped

    def end(self, engine):
        """The run's last word on rank 0 (the summary, or where a stopped run goes on from), then
        the engine closed and every process ended together (run.end)."""
        if self.accelerator.is_main_process and self.stopped:
            print(run.stopped_message(self.run_dir, self.stopped, self.done, self.args.steps))
        elif self.accelerator.is_main_process:
            wall = time.perf_counter() - self.t_start
            print(run.summary(self.history, self.seconds, wall, self.run_dir))
        run.end(self.accelerator, engine, self.stopped)
