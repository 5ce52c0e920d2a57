"""Finetune on a GLUE task (CoLA SST-2 MRPC STS-B QQP MNLI QNLI RTE WNLI) with DeepSpeed.

    deepspeed finetune/run_glue.py --task sst2 --data glue_data/SST-2 --init-from runs/e8 \\
        --deepspeed_config ds_configs/finetune_sst2.json --output-dir runs/e8-sst2 --seeds 5

A stopped run (SIGTERM/SIGUSR1: saved, exit 0) continues with the same command plus --resume.
"""

import argparse
import sys

from widenet_ds.runtime.quiet import quiet_third_party

quiet_third_party()  # before DeepSpeed is imported

from widenet_ds.training.finetune import main  # noqa: E402
from widenet_ds.training.finetune_config import add_common_arguments  # noqa: E402
from widenet_ds.training.finetune_tasks import GlueOptions, GlueTaskRun  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", required=True, help="GLUE task name in any spelling (sst2, SST-2, mnli, ...)")
    p.add_argument("--predict-test", action="store_true", default=GlueOptions.predict_test,
                   help="also write test-set predictions in the GLUE submission format (e.g. SST-2.tsv, MNLI-m.tsv)")
    add_common_arguments(p)
    return p


if __name__ == "__main__":
    sys.exit(main(parser(), GlueTaskRun))
