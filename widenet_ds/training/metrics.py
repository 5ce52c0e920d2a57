"""What a training task measures over a logging window (or an evaluation), summed on every rank and
reduced over the ranks with one all-reduce when the window closes.

The sums stay on the training device while the window is open: adding a micro-batch's figures reads
nothing back to the host (no synchronisation per micro-step on a GPU); `reduce` moves them once.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as torch_dist


class WindowSums:
    """Per-rank sums over a window, and the routing of each routing call; a subclass names its sums (`SUMS`,
    "micro_batches" among them) and turns them into scalars.

    Losses are averaged over micro-batches and ranks; accuracies are correct / counted over all of them;
    expert load is the fraction of routes per expert of each routing call (summed counts), the dropped
    fraction the mean over micro-batches and ranks. `replicas`: ranks that compute on the same examples
    (branch parallelism), whose counts are one example's, not several.
    """

    SUMS: tuple[str, ...] = ()

    def __init__(self, blocks_of_calls: list[int], num_experts: int, replicas: int = 1) -> None:
        self.blocks_of_calls = blocks_of_calls  # block index of each routing call
        self.num_experts = num_experts
        self.replicas = replicas
        self.reset()

    def reset(self) -> None:
        self.sums = torch.zeros(len(self.SUMS), dtype=torch.float64)
        self.expert_counts = torch.zeros(len(self.blocks_of_calls), self.num_experts, dtype=torch.float64)
        self.dropped = torch.zeros(len(self.blocks_of_calls), dtype=torch.float64)

    @torch.no_grad()
    def _add(self, values: dict[str, Any], routing) -> None:
        device = next((v.device for v in values.values() if isinstance(v, torch.Tensor)), self.sums.device)
        if self.sums.device != device:  # the first micro-batch of a window on an accelerator
            self.sums, self.expert_counts, self.dropped = (t.to(device) for t in
                                                           (self.sums, self.expert_counts, self.dropped))
        self.sums += torch.stack([torch.as_tensor(values[name], device=device).to(torch.float64) for name in self.SUMS])
        if routing is not None and self.blocks_of_calls:
            self.expert_counts += routing.expert_counts.detach().to(torch.float64)
            self.dropped += routing.dropped_fraction.detach().to(torch.float64)

    def _reduce(self, prefix: str) -> tuple[dict[str, float], dict[str, float]]:
        """Collective: every rank must call it at the same point. The sums over ranks, and (for the "train"
        prefix) each routing call's expert load and dropped fraction as scalars; then a new window."""
        flat = torch.cat([self.sums, self.expert_counts.flatten(), self.dropped])
        if torch_dist.is_initialized() and torch_dist.get_world_size() > 1:
            flat = flat.to("cuda" if torch_dist.get_backend() == "nccl" else "cpu")
            torch_dist.all_reduce(flat)
        flat = flat.cpu()
        raw = dict(zip(self.SUMS, flat[: len(self.SUMS)].tolist()))
        sums = raw if self.replicas == 1 else {name: value / self.replicas for name, value in raw.items()}
        routing = {}
        if prefix == "train":
            counts = flat[len(self.SUMS): len(self.SUMS) + self.expert_counts.numel()].view(self.expert_counts.shape)
            dropped = flat[len(self.SUMS) + self.expert_counts.numel():] / max(raw["micro_batches"], 1.0)
            for call, block in enumerate(self.blocks_of_calls):
                load = counts[call] / counts[call].sum().clamp(min=1.0)
                for expert in range(self.num_experts):
                    routing[f"moe/block_{block:02d}/expert_{expert:02d}_load"] = load[expert].item()
                routing[f"moe/block_{block:02d}/dropped_fraction"] = dropped[call].item()
        self.reset()
        return sums, routing

    def reduce(self, prefix: str) -> tuple[dict[str, float], dict[str, float]]:
        """Collective. The scalars (named `prefix/...`) and the window's counts over all ranks ("samples",
        "tokens" where counted) for the throughput figures."""
        raise NotImplementedError


def _mean_losses(sums: dict[str, float], prefix: str, names: tuple[str, ...]) -> dict[str, float]:
    n = max(sums["micro_batches"], 1.0)
    return {f"{prefix}/{name}": sums[name] / n for name in names}


class PretrainMetrics(WindowSums):
    """MLM + SOP pretraining."""

    SUMS = ("loss", "mlm_loss", "sop_loss", "balance_loss", "mlm_correct", "mlm_count", "sop_correct",
            "sop_count", "samples", "tokens", "micro_batches")

    @torch.no_grad()
    def add(self, output, batch: dict[str, torch.Tensor]) -> None:
        """One micro-batch: `output` of WideNetForPreTraining with labels, `batch` its inputs."""
        mlm_labels, sop_labels = batch["mlm_labels"], batch["sop_labels"]
        predicted = mlm_labels != -100
        mlm_correct = (output.mlm_logits.argmax(-1) == mlm_labels) & predicted
        self._add({
            "loss": output.loss, "mlm_loss": output.mlm_loss, "sop_loss": output.sop_loss,
            "balance_loss": output.balance_loss, "mlm_correct": mlm_correct.sum(), "mlm_count": predicted.sum(),
            "sop_correct": (output.sop_logits.argmax(-1) == sop_labels).sum(), "sop_count": sop_labels.numel(),
            "samples": sop_labels.numel(), "tokens": batch["attention_mask"].sum(), "micro_batches": 1,
        }, output.routing)

    def reduce(self, prefix: str) -> tuple[dict[str, float], dict[str, float]]:
        sums, routing = self._reduce(prefix)
        scalars = _mean_losses(sums, prefix, ("loss", "mlm_loss", "sop_loss", "balance_loss"))
        scalars[f"{prefix}/mlm_accuracy"] = sums["mlm_correct"] / max(sums["mlm_count"], 1.0)
        scalars[f"{prefix}/sop_accuracy"] = sums["sop_correct"] / max(sums["sop_count"], 1.0)
        return {**scalars, **routing}, {"samples": sums["samples"], "tokens": sums["tokens"]}


class ClassifyMetrics(WindowSums):
    """Image classification (accuracy weighted: mixed-up targets and padding rows count by their weight)."""

    SUMS = ("loss", "task_loss", "balance_loss", "correct", "count", "micro_batches")

    @torch.no_grad()
    def add(self, output, batch: dict[str, torch.Tensor]) -> None:
        labels = batch["labels"]
        weight = batch.get("weight")
        if weight is None:
            weight = torch.ones_like(labels, dtype=torch.float32)
        correct = ((output.logits.argmax(-1) == labels).float() * weight).sum()
        self._add({"loss": output.loss, "task_loss": output.task_loss, "balance_loss": output.balance_loss,
                   "correct": correct, "count": weight.sum(), "micro_batches": 1}, output.routing)

    def reduce(self, prefix: str) -> tuple[dict[str, float], dict[str, float]]:
        sums, routing = self._reduce(prefix)
        scalars = _mean_losses(sums, prefix, ("loss", "task_loss", "balance_loss"))
        scalars[f"{prefix}/accuracy"] = sums["correct"] / max(sums["count"], 1.0)
        return {**scalars, **routing}, {"samples": sums["count"]}


class FinetuneMetrics(WindowSums):
    """Finetuning's training losses (its evaluations are the task's metrics over whole splits)."""

    SUMS = ("loss", "task_loss", "balance_loss", "samples", "micro_batches")

    @torch.no_grad()
    def add(self, output, batch: dict[str, torch.Tensor]) -> None:
        self._add({"loss": output.loss, "task_loss": output.task_loss, "balance_loss": output.balance_loss,
                   "samples": batch["input_ids"].shape[0], "micro_batches": 1}, output.routing)

    def reduce(self, prefix: str) -> tuple[dict[str, float], dict[str, float]]:
        sums, routing = self._reduce(prefix)
        return ({**_mean_losses(sums, prefix, ("loss", "task_loss", "balance_loss")), **routing},
                {"samples": sums["samples"]})
