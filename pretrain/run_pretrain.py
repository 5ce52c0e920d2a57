"""WideNet / ALBERT MLM+SOP pretraining on DeepSpeed.

    deepspeed pretrain/run_pretrain.py --model-config widenet-base-e4 \
        --deepspeed_config ds_configs/pretrain_phase1_seq128_lamb.json \
        --data data/wiki_books_seq128 --output-dir runs/widenet-e4-phase1

Also started by launcher.sh, srun and mpiexec. Options: `--help`; the details: docs/pretraining.md.
"""

import sys

from widenet_ds.runtime.quiet import quiet_third_party

quiet_third_party()  # before DeepSpeed is imported

from widenet_ds.errors import WideNetError  # noqa: E402
from widenet_ds.training.console import report_error  # noqa: E402
from widenet_ds.training.pretrain import run  # noqa: E402
from widenet_ds.training.pretrain_config import parse_args  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    try:
        return run(parse_args(argv))
    except WideNetError as err:
        report_error("run_pretrain.py", err)
        return 2


if __name__ == "__main__":
    sys.exit(main())
