"""The training entry: `python -m widenet_ds.train TASK [options]`, one process per rank.

    deepspeed --module widenet_ds.train pretrain --model-config widenet-base-e4 --data data/phase1 ...
    srun python -m widenet_ds.train glue --task sst2 --data glue/SST-2 --init-from runs/e8 ...
    widenet-ds launch classify --num-ranks 2 -- --model-config widenet-vit-tiny ...

TASK: pretrain (MLM + SOP), glue, squad (finetuning), classify (images). `TASK --help` lists its options.
"""

from __future__ import annotations

import sys

from widenet_ds.runtime.quiet import quiet_third_party

TASKS = {
    "pretrain": "MLM + sentence-order pretraining (WideNet, ALBERT, BERT)",
    "glue": "finetuning on a GLUE task (seeds, median)",
    "squad": "finetuning on SQuAD v1.1 / v2.0",
    "classify": "image classification (ViT-WideNet, ViT, ViT-MoE, ParaFormer)",
}


def usage() -> str:
    return "\n".join(["usage: python -m widenet_ds.train TASK [options]", "", "tasks:"]
                     + [f"  {name:<10} {help_}" for name, help_ in TASKS.items()]
                     + ["", "`python -m widenet_ds.train TASK --help` lists the options of one task."])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `deepspeed --module` puts `--local_rank=N` before TASK; LOCAL_RANK in the environment says the same.
    while argv and argv[0].startswith(("--local_rank=", "--local-rank=")):
        argv.pop(0)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    task, rest = argv[0], argv[1:]
    if task not in TASKS:
        print(f"python -m widenet_ds.train: unknown task {task!r}.\n\n{usage()}", file=sys.stderr)
        return 2
    quiet_third_party()  # before DeepSpeed is imported
    # Until the one trainer lands: the task's existing entry.
    if task == "pretrain":
        from pretrain.run_pretrain import main as entry
        return entry(rest)
    if task == "classify":
        from vision.run_classify import main as entry
        return entry(rest)
    from widenet_ds.training.finetune import main as finetune_main
    if task == "glue":
        from finetune.run_glue import parser
        from widenet_ds.training.finetune_tasks import GlueTaskRun as run_class
    else:
        from finetune.run_squad import parser
        from widenet_ds.training.finetune_tasks import SquadTaskRun as run_class
    return finetune_main(parser(), run_class, rest)


if __name__ == "__main__":
    sys.exit(main())
