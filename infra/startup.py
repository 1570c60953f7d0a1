"""What train.py's init asks of several processes (accelerate launch): the questions (one rank
writes the embedded world, the others wait for it), a step on rank 0 alone, the policy and its
frozen reference (checkpointing, the reference's dtype), and each rank's rollout engine (whether
its log-probs can be pi_old is train.py's rule: `old_from_engine`).
"""

import torch
from accelerate import Accelerator

from infra import data, engines, loaders, run, shard


def accelerator(args, run_dir: str) -> Accelerator:
    """The run's Accelerator (one process, DDP or FSDP2, as `accelerate launch` set it up; `args`:
    train.py's Args, for --log_with). Its learning-rate schedule counts optimizer steps (prepared
    with step_scheduler_with_optimizer on, it would step once per process per call); under FSDP2
    with mixed precision its gradients reduce in float32 (shard.fsdp_plugin)."""
    return Accelerator(
        project_dir=run_dir,
        log_with=args.log_with or None,
        step_scheduler_with_optimizer=False,
        fsdp_plugin=shard.fsdp_plugin(),
    )


def questions(accelerator, args, world: str) -> tuple[list, list]:
    """The training questions and the test questions the evaluations score (--eval_n spread over
    the test split; none without --eval_every). The embedded world (`world`, when --data and
    --corpus do not replace it) is written first, by rank 0, the others waiting for it."""
    if world and accelerator.is_main_process:
        data.ensure_world(world)
    accelerator.wait_for_everyone()
    train_rows = loaders.load_rows(args.data or world, "train")
    test_rows = (
        data.spread(loaders.load_rows(args.test_data or args.data or world, "test"), args.eval_n)
        if args.eval_every
        else []
    )  # train.validate made sure this is a real test split, never the training rows
    return train_rows, test_rows


def on_main(accelerator, step, *args):
    """`step(*args)` on rank 0, the other ranks waiting until it is done."""
    if accelerator.is_main_process:
        step(*args)
    accelerator.wait_for_everyone()


def policies(accelerator, args, load) -> tuple:
    """The policy (float32; --gradient_checkpointing: its activations recomputed in the backward
    pass), the frozen reference on this rank's device (--ref_dtype "compute": the mixed-precision
    dtype, bf16 or fp16, else float32) and the tokenizer; `load(dtype)`: (model, tokenizer) from
    the run's model path."""
    model, tok = load()
    if args.gradient_checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    compute = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(accelerator.mixed_precision)
    ref_model, _ = load(compute if compute and args.ref_dtype == "compute" else torch.float32)
    ref_model.requires_grad_(False).eval().to(accelerator.device)
    return model, ref_model, tok


def engine(accelerator, args, model, tokenizer, model_path: str, load):
    """This rank's rollout engine (--engine; vLLM: one per GPU, in the launcher's process group)
    over the prepared policy `model` (under FSDP2 the HF engine samples from a full copy, `load()`:
    infra/shard.py)."""
    ranks = accelerator.num_processes
    kind = engines.choose(args.engine)[0]
    with run.quiet(not accelerator.is_main_process):
        made = engines.make_engine(
            args.engine,
            shard.rollout_model(accelerator, model, lambda: load()[0], kind),
            tokenizer,
            model_path,
            dtype=args.vllm_dtype,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            sleep=args.vllm_sleep,
            **({"distributed_executor_backend": "external_launcher"} if ranks > 1 else {}),
        )
    return made
