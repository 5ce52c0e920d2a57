"""ViT-WideNet / ViT / ViT-MoE image classification on DeepSpeed.

    deepspeed vision/run_classify.py --model-config widenet-vit-b16 --dataset imagenet-folder \
        --data-dir /data/imagenet --deepspeed_config ds_configs/vision_imagenet_lamb_linear.json \
        --output-dir runs/widenet-b16 --randaugment 2,15 --inception-crop --flip --mixup-alpha 0.5 \
        --label-smoothing 0.1

Also started by launcher.sh (`./launcher.sh vision-demo`), srun and mpiexec. Options: `--help`; the
details: docs/vision.md.
"""

import sys

from widenet_ds.errors import WideNetError
from widenet_ds.vision.train import parse_args, run


def main(argv: list[str] | None = None) -> int:
    try:
        return run(parse_args(argv))
    except WideNetError as err:
        print(f"run_classify.py: error: {err}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
