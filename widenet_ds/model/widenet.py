"""WideNet encoder and its heads (pretraining MLM + SOP, GLUE classification/regression, SQuAD spans).

Reads top-down: outputs, embeddings, attention, encoder (the sharing), heads, task models. Sharing is a
loop over one module (a ModuleList of length 1 when shared, D when not), never copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from widenet_ds.errors import ConfigError
from widenet_ds.model.base import EncoderModel
from widenet_ds.model.branches import BranchParallel, active_branches, branch_blocks, depth_step
from widenet_ds.model.config import EncoderConfig, ModelConfig
from widenet_ds.model.grouped_experts import ExpertWeights
from widenet_ds.model.moe import FeedForward, MoEFeedForward
from widenet_ds.model.routing import Routing, dropped_routes


# --- outputs ----------------------------------------------------------------------------------------
@dataclass
class RoutingStats:
    """Per routing call (one per block, or per routing group): how the shared MoE spread the tokens."""

    expert_counts: Tensor      # [calls, E] routes assigned per expert (before capacity dropping); real tokens'
    dropped_fraction: Tensor   # [calls] fraction of the (real tokens') routes dropped by capacity


@dataclass
class EncoderOutput:
    sequence: Tensor                     # [B, S, H]
    pooled: Tensor                       # [B, H]
    balance_loss: Tensor                 # sum over routing calls (unweighted)
    routing: RoutingStats | None


@dataclass
class PreTrainingOutput:
    loss: Tensor | None
    mlm_loss: Tensor | None
    sop_loss: Tensor | None
    balance_loss: Tensor
    mlm_logits: Tensor
    sop_logits: Tensor
    routing: RoutingStats | None = None


@dataclass
class ClassificationOutput:
    loss: Tensor | None
    task_loss: Tensor | None
    balance_loss: Tensor
    logits: Tensor                       # [B, num_labels] ([B, 1] for regression)
    routing: RoutingStats | None = None


@dataclass
class QuestionAnsweringOutput:
    loss: Tensor | None
    task_loss: Tensor | None
    balance_loss: Tensor
    start_logits: Tensor                 # [B, S]
    end_logits: Tensor                   # [B, S]
    routing: RoutingStats | None = None


# --- embeddings -------------------------------------------------------------------------------------
class FactorizedEmbeddings(nn.Module):
    """ALBERT's factorized embeddings: V x E_emb tables, LayerNorm(E_emb), then a projection E_emb -> H."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.embedding_size)
        self.position = nn.Embedding(cfg.max_position_embeddings, cfg.embedding_size)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.embedding_size)
        self.norm = nn.LayerNorm(cfg.embedding_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        self.projection = nn.Linear(cfg.embedding_size, cfg.hidden_size)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word(input_ids) + self.position(positions)[None] + self.token_type(token_type_ids)
        return self.projection(self.dropout(self.norm(x)))


class SelfAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.qkv_bias)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.qkv_bias)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.qkv_bias)
        self.output = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.attention_dropout = cfg.attention_dropout
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def context(self, query: Tensor, key: Tensor, value: Tensor, attend: Tensor | None) -> Tensor:
        """Scaled dot-product attention of projected [B, S, H] queries, keys and values -> [B, S, H]."""
        batch, seq, hidden = query.shape

        def heads(t: Tensor) -> Tensor:  # [B, S, H] -> [B, heads, S, head_dim]
            return t.view(batch, seq, self.num_heads, -1).transpose(1, 2)

        context = F.scaled_dot_product_attention(
            heads(query), heads(key), heads(value), attn_mask=attend,
            dropout_p=self.attention_dropout if self.training else 0.0)
        return context.transpose(1, 2).reshape(batch, seq, hidden)

    def forward(self, x: Tensor, attend: Tensor | None) -> Tensor:
        # x: [B, S, H]; attend: [B, 1, 1, S], additive (0 where a key may be attended, -inf where not) or bool
        # (True where it may); None: every key
        return self.dropout(self.output(self.context(self.query(x), self.key(x), self.value(x), attend)))


# --- encoder ----------------------------------------------------------------------------------------
class WideNetEncoder(nn.Module):
    """D blocks over (possibly) shared attention and FFN/MoE, each block with its own two LayerNorms.

    post-LN (BERT/ALBERT): x = LN_att_i(x + MHA(x)); x = LN_ffn_i(x + FFN(x))
    pre-LN (paper eq. 6-8): x = x + MHA(LN_att_i(x)); x = x + FFN(LN_ffn_i(x)); final LayerNorm at the end.
    residual "normed" (ParaFormer): h = LN_att_i(x); x = h + MHA(h); h = LN_ffn_i(x); x = h + FFN(h).

    With num_branches > 1 the blocks form parallel branches whose outputs are summed before the final
    LayerNorm (widenet_ds/model/branches.py); `forward(..., branches=k)` runs the first k only.
    """

    def __init__(self, cfg: EncoderConfig, ep_size: int = 1, ffn: nn.ModuleList | None = None) -> None:
        """`ffn`: the FFN of each block (length 1 when shared), to mix dense and MoE blocks (ViT-MoE);
        default: built from cfg."""
        super().__init__()
        self.cfg = cfg
        # A run setting (memory for compute), switched on by the trainer: set_activation_checkpointing().
        self.activation_checkpointing = False
        blocks = cfg.num_layers

        def copies(make, shared: bool) -> nn.ModuleList:
            return nn.ModuleList(make() for _ in range(1 if shared else blocks))

        def layer_norm() -> nn.LayerNorm:
            return nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

        self.attention = copies(lambda: SelfAttention(cfg), cfg.share_attention)
        if ffn is not None:
            if len(ffn) not in (1, blocks):
                raise ValueError(f"ffn holds {len(ffn)} modules; pass 1 (shared) or one per block ({blocks}).")
            self.ffn = ffn
        elif cfg.is_moe:
            self.ffn = copies(lambda: MoEFeedForward(cfg, ep_size), cfg.share_ffn)
        else:
            self.ffn = copies(lambda: FeedForward(cfg.hidden_size, cfg.intermediate_size, cfg.activation),
                              cfg.share_ffn)
        self.attention_norm = copies(layer_norm, cfg.share_layernorm)
        self.ffn_norm = copies(layer_norm, cfg.share_layernorm)
        self.final_norm = layer_norm() if cfg.norm_position == "pre" else None
        self.ffn_dropout = nn.Dropout(cfg.hidden_dropout)
        self.blocks_per_routing_group = cfg.blocks_per_routing_group
        # Set by the caller to run this rank's share of the branches (widenet_ds/model/branches.py).
        self.branch_parallel: BranchParallel | None = None

    def _block(self, i: int, x: Tensor, attend: Tensor | None, routing: Routing | None,
               experts: ExpertWeights | None = None,
               token_mask: Tensor | None = None) -> tuple[Tensor, Routing | None]:
        pick = lambda modules: modules[0 if len(modules) == 1 else i]  # noqa: E731
        attention, ffn, ln_att, ln_ffn = (pick(self.attention), pick(self.ffn),
                                          pick(self.attention_norm), pick(self.ffn_norm))

        def feed_forward(h: Tensor) -> tuple[Tensor, Routing | None]:
            if isinstance(ffn, MoEFeedForward):
                out, used = ffn(h, routing, experts, token_mask)
                return self.ffn_dropout(out), used
            return self.ffn_dropout(ffn(h)), None

        if self.cfg.norm_position == "post":
            x = ln_att(x + attention(x, attend))
            out, routing = feed_forward(x)
            return ln_ffn(x + out), routing
        if self.cfg.residual == "normed":
            h = ln_att(x)
            x = h + attention(h, attend)
            h = ln_ffn(x)
            out, routing = feed_forward(h)
            return h + out, routing
        x = x + attention(ln_att(x), attend)
        out, routing = feed_forward(ln_ffn(x))
        return x + out, routing

    # -- branches ------------------------------------------------------------------------------------
    def branch_modules(self, branch: int) -> list[nn.Module]:
        """The modules only `branch` uses: its blocks' entries of every per-block list."""
        owned = []
        for modules in (self.attention, self.ffn, self.attention_norm, self.ffn_norm):
            if len(modules) > 1:
                owned.extend(modules[i] for i in branch_blocks(self.cfg.layers_per_branch, branch))
        return owned

    def set_trainable_branches(self, branches: int) -> None:
        """requires_grad on for the first `branches` branches, off for the others; call before the forward.

        A parameter without requires_grad gets no .grad, DeepSpeed's ZeRO-0 reduction skips it, and the
        optimizers (torch's, our LAMB) skip a parameter without a gradient: no moment, decay or trust-ratio
        update, its optimizer state untouched."""
        active_branches(self.cfg.num_branches, branches)  # range check
        for branch in range(self.cfg.num_branches):
            for module in self.branch_modules(branch):
                module.requires_grad_(branch < branches)

    def shared_expert_weights(self) -> ExpertWeights | None:
        """The shared MoE's expert weights stacked once for the whole forward (None: no shared MoE)."""
        if len(self.ffn) == 1 and isinstance(self.ffn[0], MoEFeedForward):
            return self.ffn[0].expert_weights()
        return None

    def _run_branches(self, x: Tensor, attend: Tensor | None, branches: int | None,
                      token_mask: Tensor | None) -> tuple[Tensor, list[Routing]]:
        active = active_branches(self.cfg.num_branches, branches)
        if self.branch_parallel is not None:
            x = self.branch_parallel.input(x)
            mine = set(self.branch_parallel.branches)
            active = [b for b in active if b in mine]
        routings: list[Routing] = []
        if active:
            if attend is not None:
                attend = attend.repeat(len(active), 1, 1, 1)
            if token_mask is not None:
                token_mask = token_mask.repeat(len(active), 1)                # [k B, S], as the stacked streams
            streams = x.unsqueeze(0).expand(len(active), *x.shape)
            experts = self.shared_expert_weights()
            for depth in range(self.cfg.layers_per_branch):
                if self.activation_checkpointing and self.training:
                    streams, used = checkpoint(depth_step, self, depth, active, streams, attend, experts,
                                               token_mask, use_reentrant=False)
                else:
                    streams, used = depth_step(self, depth, active, streams, attend, experts, token_mask)
                if used is not None:
                    routings.append(used)
            out = streams.sum(dim=0)
        else:  # this rank holds none of the active branches: zeros, still tied to x so that the input's
            out = x * 0  # backward all-reduce runs here too (the other ranks wait for it)
        if self.branch_parallel is not None:
            out = self.branch_parallel.sum(out)
        return out, routings

    def forward(self, x: Tensor, attention_mask: Tensor | None,
                branches: int | None = None) -> tuple[Tensor, Tensor, RoutingStats | None]:
        """`branches`: run the first k branches only (None: all; must be None without branches)."""
        # attention_mask None: every token attends to every token (images have no padding). The additive form
        # SDPA would make of a boolean mask in every call, made once: 0 where a key may be attended, else -inf.
        attend = None
        if attention_mask is not None:
            attend = x.new_zeros(attention_mask.shape).masked_fill_(attention_mask == 0, float("-inf"))
            attend = attend[:, None, None, :]
        # Padding gets no route, no capacity and no share of the balance loss (widenet_ds/model/routing.py)
        # unless the config routes it as the paper does.
        token_mask = None
        if attention_mask is not None and self.cfg.is_moe and not self.cfg.moe.route_padding:
            token_mask = attention_mask != 0
        if self.cfg.num_branches > 1:
            x, routings = self._run_branches(x, attend, branches, token_mask)
            return self._finish(x, routings)
        if branches not in (None, 1):
            raise ConfigError(f"branches = {branches}, but this model has one branch (num_branches = 1).")
        routings: list[Routing] = []
        routing = None
        experts = self.shared_expert_weights()
        for i in range(self.cfg.num_layers):
            # Routing groups: the group's first block routes, the others reuse its decisions.
            reuse = routing if i % self.blocks_per_routing_group else None
            if self.activation_checkpointing and self.training:
                # Non-reentrant: shared weights are used by every block, which reentrant checkpointing under
                # ZeRO 2 reports as "gradient computed twice".
                x, used = checkpoint(self._block, i, x, attend, reuse, experts, token_mask, use_reentrant=False)
            else:
                x, used = self._block(i, x, attend, reuse, experts, token_mask)
            if used is not None and reuse is None:
                routings.append(used)
            routing = used
        return self._finish(x, routings)

    def _finish(self, x: Tensor, routings: list[Routing]) -> tuple[Tensor, Tensor, RoutingStats | None]:
        if self.final_norm is not None:
            x = self.final_norm(x)
        if not routings:
            return x, x.new_zeros(()), None
        balance = torch.stack([r.balance_loss for r in routings]).sum()
        # Every call routes the same tokens with the same capacity: one reduction for all calls. The routes a
        # call counts (k T, or k T_real with padding masked) are the sum of its expert counts.
        counts = torch.stack([r.expert_counts for r in routings])
        dropped = dropped_routes(counts, routings[0].capacity) / counts.sum(dim=-1).clamp(min=1)
        stats = RoutingStats(expert_counts=counts, dropped_fraction=dropped)
        return x, balance, stats


class WideNetModel(nn.Module):
    """Embeddings + encoder + pooler: the body every task model shares."""

    def __init__(self, cfg: ModelConfig, ep_size: int = 1) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = FactorizedEmbeddings(cfg)
        self.encoder = WideNetEncoder(cfg, ep_size)
        self.pooler = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, branches: int | None = None) -> EncoderOutput:
        # input_ids: [B, S]; branches: the first k branches only (ParaFormer layout; None: all)
        if input_ids.shape[1] > self.cfg.max_position_embeddings:
            raise ConfigError(f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings = "
                              f"{self.cfg.max_position_embeddings}; truncate inputs to that length.")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)
        x, balance, routing = self.encoder(x, attention_mask, branches)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return EncoderOutput(x, pooled, balance, routing)


# --- heads ------------------------------------------------------------------------------------------
class MaskedLMHead(nn.Module):
    """H -> E_emb, activation, LayerNorm, then the decoder tied to the word embeddings (+ bias)."""

    def __init__(self, cfg: ModelConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.embedding_size)
        self.norm = nn.LayerNorm(cfg.embedding_size, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.approximate = "tanh" if cfg.activation == "gelu_new" else "none"
        self.word_embeddings = [word_embeddings]  # a list: tied, not registered a second time

    def forward(self, sequence: Tensor) -> Tensor:
        h = self.norm(F.gelu(self.dense(sequence), approximate=self.approximate))
        return F.linear(h, self.word_embeddings[0].weight, self.bias)


class WideNetPreTrainedModel(EncoderModel):
    """Base of the text task models: the body (embeddings, encoder, pooler) under the prefix `widenet.`."""

    ENCODER_PATH = "widenet.encoder"
    # Expert seeds as the text models have always drawn them: layer 0's for every MoE layer (the presets share
    # one MoE; an unshared one starts its layers as copies). Per-layer keys would change those weights.
    EXPERT_SEEDS_PER_LAYER = False

    def __init__(self, cfg: ModelConfig, ep_size: int = 1) -> None:
        super().__init__(cfg)
        self.widenet = WideNetModel(cfg, ep_size)


class WideNetForPreTraining(WideNetPreTrainedModel):
    """MLM + sentence-order prediction (ALBERT)."""

    def __init__(self, cfg: ModelConfig, ep_size: int = 1) -> None:
        super().__init__(cfg, ep_size)
        self.mlm_head = MaskedLMHead(cfg, self.widenet.embeddings.word)
        self.sop_dropout = nn.Dropout(cfg.classifier_dropout)
        self.sop_head = nn.Linear(cfg.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, mlm_labels: Tensor | None = None,
                sop_labels: Tensor | None = None, branches: int | None = None) -> PreTrainingOutput:
        body = self.widenet(input_ids, token_type_ids, attention_mask, branches)
        mlm_logits = self.mlm_head(body.sequence)                         # [B, S, V]
        sop_logits = self.sop_head(self.sop_dropout(body.pooled))         # [B, 2]
        mlm_loss = sop_loss = None
        if mlm_labels is not None:
            # In the logits' dtype, as HF ALBERT: an fp32 copy of the [B*S, V] logits costs memory, and
            # selecting the predicted positions by mask would stall the GPU queue on a host sync.
            mlm_loss = F.cross_entropy(mlm_logits.reshape(-1, mlm_logits.shape[-1]), mlm_labels.reshape(-1),
                                       ignore_index=-100)
        if sop_labels is not None:
            sop_loss = F.cross_entropy(sop_logits.float(), sop_labels)
        task = None
        if mlm_loss is not None or sop_loss is not None:
            task = sum(l for l in (mlm_loss, sop_loss) if l is not None)
        return PreTrainingOutput(self._total_loss(task, body.balance_loss), mlm_loss, sop_loss,
                                 body.balance_loss, mlm_logits, sop_logits, body.routing)


class WideNetForSequenceClassification(WideNetPreTrainedModel):
    """GLUE: classification on the pooled [CLS] (num_labels = 1 is regression, e.g. STS-B)."""

    def __init__(self, cfg: ModelConfig, num_labels: int, ep_size: int = 1) -> None:
        super().__init__(cfg, ep_size)
        self.num_labels = num_labels
        self.dropout = nn.Dropout(cfg.classifier_dropout)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        self.init_weights()

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, labels: Tensor | None = None,
                branches: int | None = None) -> ClassificationOutput:
        body = self.widenet(input_ids, token_type_ids, attention_mask, branches)
        logits = self.classifier(self.dropout(body.pooled))
        task_loss = None
        if labels is not None:
            if self.num_labels == 1:
                task_loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                task_loss = F.cross_entropy(logits.float(), labels)
        return ClassificationOutput(self._total_loss(task_loss, body.balance_loss), task_loss,
                                    body.balance_loss, logits, body.routing)


class WideNetForQuestionAnswering(WideNetPreTrainedModel):
    """SQuAD: start/end logits per token; position 0 ([CLS]) is the null answer of SQuAD 2.0."""

    def __init__(self, cfg: ModelConfig, ep_size: int = 1) -> None:
        super().__init__(cfg, ep_size)
        self.qa_outputs = nn.Linear(cfg.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, start_positions: Tensor | None = None,
                end_positions: Tensor | None = None, branches: int | None = None) -> QuestionAnsweringOutput:
        body = self.widenet(input_ids, token_type_ids, attention_mask, branches)
        start_logits, end_logits = self.qa_outputs(body.sequence).float().unbind(dim=-1)
        if attention_mask is not None:
            # Padding can never be an answer boundary.
            start_logits = start_logits.masked_fill(attention_mask == 0, -1e4)
            end_logits = end_logits.masked_fill(attention_mask == 0, -1e4)
        task_loss = None
        if start_positions is not None and end_positions is not None:
            task_loss = (F.cross_entropy(start_logits, start_positions)
                         + F.cross_entropy(end_logits, end_positions)) / 2
        return QuestionAnsweringOutput(self._total_loss(task_loss, body.balance_loss), task_loss,
                                       body.balance_loss, start_logits, end_logits, body.routing)
