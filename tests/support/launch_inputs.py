"""Inputs for real launcher runs of pretraining (mpiexec, deepspeed, Slurm): a small
prepared corpus, a tiny MoE model config, and the run options."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.launching import REPO
from widenet_ds.data.prepare import cli as prepare_data
from widenet_ds.model.config import ModelConfig
from widenet_ds.tasks.pretrain.config import PretrainConfig

DS_CONFIG = REPO / "ds_configs" / "cpu_small.json"


def prepare_tiny_corpus(shared_data: Path, out: Path) -> Path:
    """Alice in Wonderland, seq 64, a 1000-word tokenizer trained on it: ~660 examples in ~4 s."""
    code = prepare_data(["--source", str(shared_data / "corpus" / "books" / "pg11.txt"), "--tokenizer", "train",
                         "--vocab-size", "1000", "--seq-length", "64", "--output", str(out), "--workers", "1",
                         "--no-progress"])
    assert code == 0, f"prepare-data failed with {code}"
    return out


def tiny_model_config(out: Path, num_experts: int = 4) -> Path:
    ModelConfig.from_preset("widenet-tiny-e4", vocab_size=1000, moe={"num_experts": num_experts}).to_json(out)
    return out


def pretrain_args(data: Path, model_config: Path, output_dir: Path, max_steps: int, **settings) -> list[str]:
    """The command line of a short pretraining run (`settings`: PretrainConfig's fields, e.g. ep_size=2)."""
    return PretrainConfig(model_config=str(model_config), deepspeed_config=DS_CONFIG, data=data, output_dir=output_dir,
                          max_steps=max_steps, log_interval=1, eval_interval=0, tensorboard=False, progress_bar=False,
                          seed=7, **settings).to_argv()


def train_losses(output_dir: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["train/loss"]) for r in records if "train/loss" in r]
