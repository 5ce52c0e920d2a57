"""Finetune on SQuAD v1.1 / v2.0 with DeepSpeed; writes predictions.json (+ null_odds.json for v2.0).

    deepspeed finetune/run_squad.py --version 2.0 --data squad/ --init-from runs/e8 \\
        --deepspeed_config ds_configs/finetune_squad20.json --output-dir runs/e8-squad2
"""

import argparse
import sys

from widenet_ds.runtime.quiet import quiet_third_party

quiet_third_party()  # before DeepSpeed is imported

from widenet_ds.training.finetune import main  # noqa: E402
from widenet_ds.training.finetune_config import add_common_arguments  # noqa: E402
from widenet_ds.training.finetune_tasks import SquadOptions, SquadTaskRun  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", choices=("1.1", "2.0"), required=True)
    p.add_argument("--train-file", default=SquadOptions.train_file,
                   help="SQuAD JSON to train on (default: --data/train-v<version>.json)")
    p.add_argument("--dev-file", default=SquadOptions.dev_file,
                   help="SQuAD JSON to evaluate on (default: --data/dev-v<version>.json)")
    p.add_argument("--doc-stride", type=int, default=SquadOptions.doc_stride,
                   help="tokens shared by consecutive windows (default: 128, at most a quarter of the max length)")
    add_common_arguments(p)
    return p


if __name__ == "__main__":
    sys.exit(main(parser(), SquadTaskRun))
