"""Fashion-MNIST at CPU scale: ViT-WideNet-tiny vs the dense unshared ViT of the same dims vs the shared
dense (w/o MoE) ablation, same steps, same data order, same DeepSpeed config. Not a CI test.

    PYTHONPATH=. python bench/bench_vision_fmnist.py --steps 300 --ranks 2 --output runs/bench_vision

Each model trains through `widenet-ds launch classify` (launch_config: its ClassifyConfig; ep 2 for the MoE model on
2 ranks) and is evaluated on the whole test split (or --max-eval-examples); prints a Markdown table of
trainable parameters, test accuracy, train wall time and images/s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from widenet_ds.launch.launcher import launch_config  # noqa: E402
from widenet_ds.run_folder import RunFolder  # noqa: E402
from widenet_ds.tasks.classify.config import ClassifyConfig  # noqa: E402
from widenet_ds.tasks.classify.results import ClassifyResults  # noqa: E402
from widenet_ds.vision.config import VisionConfig  # noqa: E402
from widenet_ds.vision.model import build_model, count_trainable_parameters  # noqa: E402

MODELS = ("widenet-vit-tiny", "vit-tiny", "widenet-vit-tiny-no-moe")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--max-eval-examples", type=int, default=None)
    parser.add_argument("--output", type=Path, default=REPO / "runs" / "bench_vision")
    parser.add_argument("--data", default=None, help="the Fashion-MNIST IDX folder (the trainer's --data)")
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    ds = json.loads((REPO / "ds_configs" / "vision_cpu_small.json").read_text())
    ds["scheduler"]["params"].update(total_num_steps=args.steps, warmup_num_steps=max(1, args.steps // 10))
    ds_path = args.output / "ds.json"
    ds_path.write_text(json.dumps(ds))
    rows = []
    for name in MODELS:
        out = args.output / name
        ep = args.ranks if VisionConfig.from_preset(name).is_moe else 1
        cfg = ClassifyConfig(model_config=name, deepspeed_config=ds_path, output_dir=out, max_steps=args.steps,
                             ep_size=ep, log_interval=max(1, min(50, args.steps // 2)), eval_interval=0, save_interval=args.steps, workers=0,
                             progress_bar=False, flip=True, max_eval_examples=args.max_eval_examples, data=args.data)
        start = time.monotonic()
        status = launch_config(cfg, ranks_per_node=args.ranks)  # a free port, the cores shared between the ranks
        if status:
            return status
        wall = time.monotonic() - start
        run = RunFolder(out)
        train = [r for r in run.read_metrics().records if "train/loss" in r]
        result = run.read_results(ClassifyResults)
        params = count_trainable_parameters(build_model(VisionConfig.from_preset(name), device="meta"))
        speed = sum(r["perf/samples_per_second"] for r in train) / len(train)
        rows.append((name, params, result.accuracy, train[-1]["train/task_loss"], wall, speed))
    print(f"\nFashion-MNIST, {args.steps} steps x 64 images, {args.ranks} CPU ranks, ds_configs/vision_cpu_small.json "
          f"(schedule fitted to the steps)\n")
    print("| model | trainable params | test accuracy | last train loss | wall time (s, incl. start-up + eval) | images/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, params, acc, loss, wall, speed in rows:
        print(f"| {name} | {params:,} | {acc:.4f} | {loss:.3f} | {wall:.0f} | {speed:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
