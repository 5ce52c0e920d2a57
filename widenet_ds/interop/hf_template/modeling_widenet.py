"""WideNet ("Go Wider Instead of Deeper", Xue et al., AAAI 2022) for transformers: text and image models.

Written into every folder that `widenet-ds convert to-hf` exports; needs only torch and transformers (>= 5), and
loads with `trust_remote_code=True`. It re-implements widenet-ds's model (which runs on DeepSpeed's MoE) for one
device, from the same equations; widenet-ds's tests hold the two to the same outputs in eval mode.

The encoder: D blocks share ONE attention and ONE Mixture-of-Experts layer (router + experts); each block keeps
its own two LayerNorms (paper eq. 6-8). Post-LN (BERT/ALBERT): x = LN_att_i(x + MHA(x)); x = LN_moe_i(x + MoE(x)).
Pre-LN (the ViT form): x = x + MHA(LN_att_i(x)); x = x + MoE(LN_moe_i(x)), then a final LayerNorm. Sharing is a
module list of length 1 (shared) or D; ParaFormer's branches run N stacks of D / N blocks on the same input and
sum them.

Routing (paper eq. 1-5, 8), once per block (or per routing group, or per depth over all branches):
    logits = x W_router (fp32, no bias);  p = softmax(logits [+ eps, eps ~ N(0, 1/E^2) in training])
    choice j of a token = argmax of p over the experts its choices < j did not take;
    capacity B = ceil(K C T / E) slots per expert (T tokens of the call); slots go to every token's first
    choice before any second choice, in token order, and routes past B are dropped (the token keeps its
    residual only); `dispatch = "dropless"` keeps every route; padding (attention_mask 0) gets no route,
    no slot and no share of the balance loss or counts unless `route_padding` (B keeps T = all positions);
    output = sum_j w_j * expert_{e_j}(x), w = the kept routes' p (or renormalised to sum to 1);
    balance loss = E * sum_e m_e P_e (m: top-1 fraction, P: mean probability); `aux_loss` in the outputs,
    `loss` = task loss + balance_loss_weight * aux_loss, so transformers' Trainer optimises both.

Classes: WideNetModel, WideNetForMaskedLM, WideNetForPreTraining (MLM + sentence order),
WideNetForSequenceClassification, WideNetForQuestionAnswering; ViTWideNetModel, ViTWideNetForImageClassification.

Above each class and function a comment names the block of widenet-ds it mirrors: "Copied from" (the same code up
to the renames it lists; widenet-ds's tests keep the two equal), "Adapted from" (how it differs), or "Mirror only".
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput

from .configuration_widenet import ViTWideNetConfig, WideNetConfig, WideNetEncoderConfig


# --- outputs: transformers' fields, plus the routing ------------------------------------------------------
# Adapted from widenet_ds.model.widenet.EncoderOutput: transformers' ModelOutput (last_hidden_state, pooler_output,
#   aux_loss, hidden_states, router_logits), with RoutingStats' fields as fields of their own
@dataclass
class WideNetModelOutput(ModelOutput):
    last_hidden_state: Tensor | None = None          # [B, S, H]
    pooler_output: Tensor | None = None              # [B, H]: tanh(W [CLS]) (text), GAP or CLS token (images)
    aux_loss: Tensor | None = None                   # balance loss summed over the routing calls, unweighted
    hidden_states: tuple[Tensor, ...] | None = None  # the embeddings, then the output of every depth
    router_logits: tuple[Tensor, ...] | None = None  # [T, E] per routing call
    expert_counts: Tensor | None = None              # [calls, E] routes chosen per expert (before dropping)
    dropped_fraction: Tensor | None = None           # [calls] share of the routes dropped by capacity


# Adapted from widenet_ds.model.widenet.PreTrainingOutput: its masked-LM half, as transformers' MaskedLMOutput
#   plus the routing fields
@dataclass
class WideNetMaskedLMOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None                     # [B, S, V]
    aux_loss: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    router_logits: tuple[Tensor, ...] | None = None
    expert_counts: Tensor | None = None
    dropped_fraction: Tensor | None = None


# Adapted from widenet_ds.model.widenet.PreTrainingOutput: transformers' field names (prediction_logits,
#   sop_logits, aux_loss) plus the routing fields; no separate mlm / sop losses
@dataclass
class WideNetForPreTrainingOutput(ModelOutput):
    loss: Tensor | None = None
    prediction_logits: Tensor | None = None          # [B, S, V]
    sop_logits: Tensor | None = None                 # [B, 2]
    aux_loss: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    router_logits: tuple[Tensor, ...] | None = None
    expert_counts: Tensor | None = None
    dropped_fraction: Tensor | None = None


# Adapted from widenet_ds.model.widenet.ClassificationOutput: transformers' SequenceClassifierOutput plus the
#   routing fields (aux_loss for balance_loss); images use it too (ours: vision.model.ImageClassificationOutput)
@dataclass
class WideNetSequenceClassifierOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None                     # [B, num_labels] (images: [B, num_classes])
    aux_loss: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    router_logits: tuple[Tensor, ...] | None = None
    expert_counts: Tensor | None = None
    dropped_fraction: Tensor | None = None


# Adapted from widenet_ds.model.widenet.QuestionAnsweringOutput: transformers' QuestionAnsweringModelOutput plus
#   the routing fields (aux_loss for balance_loss)
@dataclass
class WideNetQuestionAnsweringOutput(ModelOutput):
    loss: Tensor | None = None
    start_logits: Tensor | None = None               # [B, S]
    end_logits: Tensor | None = None                 # [B, S]
    aux_loss: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    router_logits: tuple[Tensor, ...] | None = None
    expert_counts: Tensor | None = None
    dropped_fraction: Tensor | None = None


# Mirror only: the routing fields a task model's output takes over from the body's (transformers' outputs are flat)
def _routing_fields(body: WideNetModelOutput) -> dict:
    return dict(aux_loss=body.aux_loss, hidden_states=body.hidden_states, router_logits=body.router_logits,
                expert_counts=body.expert_counts, dropped_fraction=body.dropped_fraction)


# --- routing --------------------------------------------------------------------------------------------
# Adapted from widenet_ds.model.routing.Routing: what a one-device dispatch and the outputs read (no slots,
#   locations or capacity for DeepSpeed's all-to-all), plus the logits (router_logits) and the dropped routes
@dataclass
class Routing:
    """One routing call's decisions: route j of token t goes to expert_index[j, t] (-1: dropped) with weight[j, t]."""

    expert_index: Tensor   # int64 [K, T]
    weight: Tensor         # fp32 [K, T]
    balance_loss: Tensor   # scalar
    logits: Tensor         # fp32 [T, E]
    expert_counts: Tensor  # [E]
    dropped: Tensor        # scalar: routes dropped by capacity


# Copied from widenet_ds.model.routing.expert_capacity
def expert_capacity(num_tokens: int, num_experts: int, k: int, capacity_factor: float,
                    rounding: str = "ceil") -> int:
    """B = ceil(K * C * T / E) (or floor: the authors' vision code, int(T * C * K // E)) in exact arithmetic,
    so float rounding never adds or removes a slot."""
    num, den = Fraction(str(capacity_factor)).as_integer_ratio()
    if rounding == "floor":
        return (k * num_tokens * num) // (den * num_experts)
    return -(-(k * num_tokens * num) // (den * num_experts))


# Copied from widenet_ds.model.routing._capacity with cfg->config, MoEConfig->WideNetEncoderConfig,
#   top_k->num_experts_per_tok
def _capacity(config: WideNetEncoderConfig, num_tokens: int, num_experts: int, training: bool) -> int:
    """Slots per expert of a call that may drop routes (`dispatch` "dropless" has no capacity)."""
    if config.drop_tokens:
        factor = config.capacity_factor if training else config.eval_capacity_factor
        return torch.sym_max(expert_capacity(num_tokens, num_experts, config.num_experts_per_tok, factor,
                                             config.capacity_rounding), config.min_capacity)
    # No dropping: an expert gets at most one route per token (a token's choices are distinct experts), so T
    # slots always suffice.
    return num_tokens


# Copied from widenet_ds.model.routing.gumbel_noise
def gumbel_noise(shape: torch.Size, device: torch.device) -> Tensor:
    """Gumbel(0, 1) noise: -log(-log(u)), u uniform in [tiny, 1 - eps) (DeepSpeed's form)."""
    info = torch.finfo(torch.float32)
    low = torch.tensor(info.tiny, device=device)
    high = torch.tensor(1.0 - info.eps, device=device)
    uniform = low + torch.rand(shape, device=device) * (high - low)
    return -torch.log(-torch.log(uniform))


# Copied from widenet_ds.model.routing.multiplicative_jitter
def multiplicative_jitter(x: Tensor, epsilon: float = 1e-2) -> Tensor:
    """x * U(1 - epsilon, 1 + epsilon): DeepSpeed's `multiplicative_jitter` (same numbers for the same RNG state)."""
    low = torch.tensor(1.0 - epsilon, device=x.device)
    high = torch.tensor(1.0 + epsilon, device=x.device)
    return x * (low + torch.rand(x.shape, device=x.device) * (high - low))


# Adapted from widenet_ds.model.routing.route_tokens: the same decisions written plainly for one device (an argmax
#   per choice and a cumsum per choice where ours takes one top-k and one scan, no slot numbers for DeepSpeed's
#   dispatch); the parity tests compare the two
def route_tokens(logits: Tensor, config: WideNetEncoderConfig, *, training: bool,
                 token_mask: Tensor | None = None) -> Routing:
    """Top-k routing with capacity; logits: fp32 [T, E], one row per position of the call; token_mask: bool [T],
    False for padding (None: every position is a token).

    The one place routing is decided, as `route_tokens` in widenet-ds's widenet_ds/model/routing.py is there:
    a padding position gets no route and no slot, and the balance loss (mean probability, top-1 fraction) and
    the counts are over the real tokens; the capacity still counts every position (a size from the shape).
    A change to which tokens are routed belongs in both functions together (the parity tests compare them)."""
    num_tokens, num_experts = logits.shape
    k = config.num_experts_per_tok
    if training and config.noise == "gaussian":
        logits = logits + torch.randn_like(logits) / num_experts  # eps ~ N(0, 1/E^2)
    probs = F.softmax(logits, dim=1)
    first_scores = logits + gumbel_noise(logits.shape, logits.device) if training and config.noise == "rsample" \
        else probs
    later_scores = logits + gumbel_noise(logits.shape, logits.device) if training and config.second_expert_sampling \
        else logits

    # Choice j: the best expert the token's earlier choices did not take.
    masks, indices = [], []
    taken = torch.zeros_like(probs, dtype=torch.bool)
    for choice in range(k):
        scores = first_scores if choice == 0 else later_scores.masked_fill(taken, float("-inf"))
        index = scores.argmax(dim=1)
        hit = F.one_hot(index, num_experts).bool()
        taken |= hit
        if token_mask is not None:
            hit &= token_mask[:, None]
        masks.append(hit.long())
        indices.append(index)

    # Slot of each route in its expert: every token's choice j after all choices < j, in token order.
    locations, offset = [], torch.zeros(num_experts, dtype=torch.long, device=logits.device)
    for mask in masks:
        locations.append(torch.cumsum(mask, dim=0) - 1 + offset)
        offset = offset + mask.sum(dim=0)

    if token_mask is None:
        top1_fraction = masks[0].float().mean(dim=0) if config.balance_loss == "switch" \
            else torch.stack(masks).float().sum(dim=0).mean(dim=0) / k  # the authors' TF code: every choice / k
        balance_loss = num_experts * torch.sum(probs.mean(dim=0) * top1_fraction)
    else:  # over the real tokens
        real = token_mask.sum().clamp(min=1)
        routed = masks[0] if config.balance_loss == "switch" else torch.stack(masks).sum(dim=0)
        top1_fraction = routed.sum(dim=0) / real if config.balance_loss == "switch" else routed.sum(dim=0) / real / k
        balance_loss = num_experts * torch.sum(probs.masked_fill(~token_mask[:, None], 0.0).sum(dim=0) / real
                                               * top1_fraction)

    capacity = None if config.dispatch == "dropless" else _capacity(config, num_tokens, num_experts, training)
    kept = masks if capacity is None else [mask * (location < capacity) for mask, location in zip(masks, locations)]
    weight = torch.stack([(probs * mask.float()).sum(dim=1) for mask in kept])      # [K, T], 0 if dropped
    if config.combine_weights == "renormalize":
        weight = weight / torch.clamp(weight.sum(dim=0, keepdim=True), min=torch.finfo(weight.dtype).eps)
    expert_index = torch.stack([torch.where(mask.any(dim=1), index, torch.full_like(index, -1))
                                for mask, index in zip(kept, indices)])
    dropped = (sum(mask.sum() for mask in masks) - sum(mask.sum() for mask in kept)).detach()
    return Routing(expert_index, weight, balance_loss, logits, torch.stack(masks).sum(dim=(0, 1)).detach(), dropped)


# --- layers ---------------------------------------------------------------------------------------------
# Copied from widenet_ds.model.moe.FeedForward
class FeedForward(nn.Module):
    """H -> F -> H with GELU (exact, or tanh for gelu_new): a dense FFN, and the shape of every expert."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str) -> None:
        super().__init__()
        self.fc_in = nn.Linear(hidden_size, intermediate_size)
        self.fc_out = nn.Linear(intermediate_size, hidden_size)
        self.approximate = "tanh" if activation == "gelu_new" else "none"

    def forward(self, x: Tensor) -> Tensor:
        return self.fc_out(F.gelu(self.fc_in(x), approximate=self.approximate))


# Adapted from widenet_ds.model.moe.MoEFeedForward: a router Linear and a list of experts, run one expert after
#   the other over its routes, where ours sits in DeepSpeed's MoE container (expert parallelism, all-to-all,
#   grouped GEMMs over stacked expert weights)
class WideNetMoE(nn.Module):
    """Router + E experts. Called once per block that uses it; `routing` reuses an earlier call's decisions."""

    def __init__(self, config: WideNetEncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.router = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(config.hidden_size, config.experts_width, config.activation)
                                     for _ in range(config.num_experts))

    # Copied from widenet_ds.model.moe.WideNetGate.forward with forward->route, cfg->config, wg->router
    def route(self, tokens: Tensor, token_mask: Tensor | None = None) -> Routing:
        """tokens [T, H]; token_mask: bool [T], False for padding (None: all real; see `route_tokens`)."""
        tokens = tokens.float()
        if self.training and self.config.noise == "jitter":  # DeepSpeed's multiplicative jitter, x * U(0.99, 1.01)
            tokens = multiplicative_jitter(tokens)
        logits = F.linear(tokens, self.router.weight.float())
        return route_tokens(logits, self.config, training=self.training, token_mask=token_mask)

    def forward(self, hidden: Tensor, routing: Routing | None = None,
                token_mask: Tensor | None = None) -> tuple[Tensor, Routing]:
        # token_mask: bool, hidden's leading shape, False for padding
        tokens = hidden.reshape(-1, hidden.shape[-1])                   # [T, H]
        if routing is None:
            routing = self.route(tokens, None if token_mask is None else token_mask.reshape(-1))
        k, num_tokens = routing.expert_index.shape
        flat_expert = routing.expert_index.reshape(-1)                  # route r = j * T + t
        token_of_route = torch.arange(k * num_tokens, device=tokens.device) % num_tokens
        per_route = tokens.new_zeros(k * num_tokens, tokens.shape[1])   # dropped routes stay 0
        for e, expert in enumerate(self.experts):
            routes = torch.nonzero(flat_expert == e).squeeze(1)
            per_route[routes] = expert(tokens[token_of_route[routes]])
        # Weighted sum over the K routes in fp32 (the combine weights are fp32).
        combined = (per_route.view(k, num_tokens, -1) * routing.weight.unsqueeze(-1)).sum(dim=0)
        return combined.to(hidden.dtype).view_as(hidden), routing


# Copied from widenet_ds.model.widenet.SelfAttention with cfg->config, EncoderConfig->WideNetEncoderConfig
class SelfAttention(nn.Module):
    def __init__(self, config: WideNetEncoderConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size, bias=config.qkv_bias)
        self.key = nn.Linear(config.hidden_size, config.hidden_size, bias=config.qkv_bias)
        self.value = nn.Linear(config.hidden_size, config.hidden_size, bias=config.qkv_bias)
        self.output = nn.Linear(config.hidden_size, config.hidden_size)
        self.attention_dropout = config.attention_dropout
        self.dropout = nn.Dropout(config.hidden_dropout)

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
        # x: [B, S, H]; attend: bool [B, 1, 1, S], True where a key may be attended (None: every key); widenet-ds
        # passes the additive form, which scaled_dot_product_attention makes of a boolean one
        return self.dropout(self.output(self.context(self.query(x), self.key(x), self.value(x), attend)))


# --- the encoder ----------------------------------------------------------------------------------------
# Adapted from widenet_ds.model.widenet.WideNetEncoder: one loop over depths of [N, B, S, H] streams for every
#   layout (ours: a block loop, and widenet_ds.model.branches.depth_step's stacked GEMMs for branches), a per-block
#   loop for unshared modules, a boolean attention mask; no activation checkpointing, branch parallelism or
#   branch prefixes; the FFN list is built here (ours: the image model's _feed_forwards)
class WideNetEncoder(nn.Module):
    """D blocks over (possibly) shared attention and FFN/MoE, each block with its own two LayerNorms; ParaFormer's
    N branches of D / N blocks run as N streams of the same input, summed at the end."""

    def __init__(self, config: WideNetEncoderConfig) -> None:
        super().__init__()
        self.config = config
        blocks = config.num_layers

        def copies(make, shared: bool) -> nn.ModuleList:
            return nn.ModuleList(make() for _ in range(1 if shared else blocks))

        def layer_norm() -> nn.LayerNorm:
            return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

        moe_blocks = set(config.moe_block_indices)
        self.attention = copies(lambda: SelfAttention(config), config.share_attention)
        self.ffn = nn.ModuleList(  # an MoE where the config puts one (every block, or ViT-MoE's last ones)
            WideNetMoE(config) if i in moe_blocks
            else FeedForward(config.hidden_size, config.intermediate_size, config.activation)
            for i in ([0] if config.share_ffn else range(blocks)))
        self.attention_norm = copies(layer_norm, config.share_layernorm)
        self.ffn_norm = copies(layer_norm, config.share_layernorm)
        self.final_norm = layer_norm() if config.norm_position == "pre" else None
        self.ffn_dropout = nn.Dropout(config.hidden_dropout)

    @staticmethod
    def _per_stream(modules: nn.ModuleList, blocks: list[int], streams: Tensor, *args) -> Tensor:
        """streams [N, B, S, H]: stream i through block blocks[i]'s module; a shared module runs once on all."""
        if len(modules) == 1:
            n, batch = streams.shape[:2]
            return modules[0](streams.reshape(n * batch, *streams.shape[2:]), *args).view_as(streams)
        return torch.stack([modules[block](stream, *args) for block, stream in zip(blocks, streams)])

    def _feed_forward(self, blocks: list[int], h: Tensor, routing: Routing | None,
                      token_mask: Tensor | None = None) -> tuple[Tensor, Routing | None]:
        if len(self.ffn) == 1 and isinstance(self.ffn[0], WideNetMoE):
            # The shared MoE routes the tokens of every stream in one call.
            mask = None if token_mask is None else token_mask.repeat(h.shape[0], 1)
            out, routing = self.ffn[0](h.reshape(-1, *h.shape[2:]), routing, mask)
            return self.ffn_dropout(out.view_as(h)), routing
        if len(self.ffn) > 1 and isinstance(self.ffn[blocks[0]], WideNetMoE):  # an MoE per block: one stream
            out, routing = self.ffn[blocks[0]](h[0], routing, token_mask)
            return self.ffn_dropout(out[None]), routing
        return self.ffn_dropout(self._per_stream(self.ffn, blocks, h)), None

    def _depth(self, blocks: list[int], x: Tensor, attend: Tensor | None, routing: Routing | None,
               token_mask: Tensor | None = None) -> tuple[Tensor, Routing | None]:
        """One block of every stream; x: [N, B, S, H]."""
        norm = self._per_stream
        if self.config.norm_position == "post":
            x = norm(self.attention_norm, blocks, x + norm(self.attention, blocks, x, attend))
            out, routing = self._feed_forward(blocks, x, routing, token_mask)
            return norm(self.ffn_norm, blocks, x + out), routing
        h = norm(self.attention_norm, blocks, x)
        normed = self.config.residual == "normed"  # ParaFormer's sub-layer: LN(x) + f(LN(x))
        x = (h if normed else x) + norm(self.attention, blocks, h, attend)
        h = norm(self.ffn_norm, blocks, x)
        out, routing = self._feed_forward(blocks, h, routing, token_mask)
        return (h if normed else x) + out, routing

    def forward(self, x: Tensor, attention_mask: Tensor | None, output_hidden_states: bool = False,
                output_router_logits: bool = False) -> WideNetModelOutput:
        # x: [B, S, H]; attention_mask: [B, S], 1 for tokens, 0 for padding (None: all tokens)
        config = self.config
        streams = x.unsqueeze(0).expand(config.num_branches, *x.shape)  # every branch reads the embedded input
        attend = None
        if attention_mask is not None:
            attend = attention_mask.bool()[:, None, None, :]
            if config.num_branches > 1 and len(self.attention) == 1:
                attend = attend.repeat(config.num_branches, 1, 1, 1)
        # [B, S], False for padding: no route, no slot, no balance loss (route_tokens) unless route_padding
        token_mask = None if attention_mask is None or config.route_padding else attention_mask.bool()
        hidden_states, routings, routing = [x], [], None
        for depth in range(config.layers_per_branch):
            blocks = [branch * config.layers_per_branch + depth for branch in range(config.num_branches)]
            # Routing groups: the group's first block routes, the others reuse its decisions.
            reuse = routing if depth % config.blocks_per_routing_group else None
            streams, routing = self._depth(blocks, streams, attend, reuse, token_mask)
            if routing is not None and reuse is None:
                routings.append(routing)
            if output_hidden_states:
                hidden_states.append(streams.sum(dim=0))
        out = streams.sum(dim=0)
        if self.final_norm is not None:
            out = self.final_norm(out)
        result = WideNetModelOutput(last_hidden_state=out, aux_loss=out.new_zeros(()),
                                    hidden_states=tuple(hidden_states) if output_hidden_states else None)
        if routings:
            result.aux_loss = torch.stack([r.balance_loss for r in routings]).sum()
            result.expert_counts = torch.stack([r.expert_counts for r in routings])
            result.dropped_fraction = torch.stack([r.dropped.float() / r.expert_counts.sum().clamp(min=1)
                                                   for r in routings])
            if output_router_logits:
                result.router_logits = tuple(r.logits for r in routings)
        return result


# Adapted from widenet_ds.model.base.EncoderModel: transformers' PreTrainedModel, whose _init_weights draws
#   N(0, initializer_range) module by module (ours: one pass, then each expert from its own seed whatever the
#   ep_size); no DeepSpeed process groups or activation-checkpointing switch
class WideNetPreTrainedModel(PreTrainedModel):
    """N(0, initializer_range) weights, zero biases, unit LayerNorms (BERT/ALBERT/ViT)."""

    config_class = WideNetEncoderConfig
    supports_gradient_checkpointing = False

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, MaskedLMHead):
            init.zeros_(module.bias)
        elif isinstance(module, PatchEmbeddings):
            init.normal_(module.position, std=self.config.initializer_range)
            if module.cls is not None:
                init.normal_(module.cls, std=self.config.initializer_range)

    # Copied from widenet_ds.model.base.EncoderModel._total_loss with cfg.moe->config, cfg->config
    def _total_loss(self, task_loss: Tensor | None, balance: Tensor) -> Tensor | None:
        """The loss Trainer optimises: the task's plus balance_loss_weight x the balance loss (MoE models)."""
        if task_loss is None:
            return None
        if self.config.is_moe:
            return task_loss + self.config.balance_loss_weight * balance
        return task_loss


# Mirror only: transformers' return_dict convention (a ModelOutput, or its tuple)
def _as_tuple(output: ModelOutput, return_dict: bool | None, config) -> ModelOutput | tuple:
    return output if (return_dict if return_dict is not None else config.return_dict) else output.to_tuple()


# --- text -----------------------------------------------------------------------------------------------
# Copied from widenet_ds.model.widenet.FactorizedEmbeddings with cfg->config, ModelConfig->WideNetConfig
class FactorizedEmbeddings(nn.Module):
    """ALBERT's factorized embeddings: V x E_emb tables, LayerNorm(E_emb), dropout, a projection E_emb -> H."""

    def __init__(self, config: WideNetConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.embedding_size)
        self.position = nn.Embedding(config.max_position_embeddings, config.embedding_size)
        self.token_type = nn.Embedding(config.type_vocab_size, config.embedding_size)
        self.norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.projection = nn.Linear(config.embedding_size, config.hidden_size)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word(input_ids) + self.position(positions)[None] + self.token_type(token_type_ids)
        return self.projection(self.dropout(self.norm(x)))


# Adapted from widenet_ds.model.widenet.MaskedLMHead: the tied decoder weight is an argument of forward (the
#   model passes its current word embeddings, as transformers' tying and resize_token_embeddings expect) where
#   ours keeps the embedding module in a list
class MaskedLMHead(nn.Module):
    """H -> E_emb, GELU, LayerNorm, then the decoder tied to the word embeddings (+ bias)."""

    def __init__(self, config: WideNetConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.approximate = "tanh" if config.activation == "gelu_new" else "none"

    def forward(self, sequence: Tensor, word_embeddings: Tensor) -> Tensor:
        h = self.norm(F.gelu(self.dense(sequence), approximate=self.approximate))
        return F.linear(h, word_embeddings, self.bias)


# Adapted from widenet_ds.model.widenet.WideNetPreTrainedModel: transformers' class attributes of the text
#   family (config class, the body's prefix "widenet"); each task model builds the body itself
class WideNetTextPreTrainedModel(WideNetPreTrainedModel):
    config_class = WideNetConfig
    base_model_prefix = "widenet"
    main_input_name = "input_ids"


# Adapted from widenet_ds.model.widenet.WideNetModel: transformers' base model (post_init, input-embedding
#   accessors, output_hidden_states / output_router_logits / return_dict, its output class); no branch prefixes
class WideNetModel(WideNetTextPreTrainedModel):
    """Embeddings + encoder + pooler (tanh of a Linear on [CLS]): the body every text task model shares."""

    def __init__(self, config: WideNetConfig) -> None:
        super().__init__(config)
        self.embeddings = FactorizedEmbeddings(config)
        self.encoder = WideNetEncoder(config)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word = value

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                output_hidden_states: bool | None = None, output_router_logits: bool | None = None,
                return_dict: bool | None = None) -> WideNetModelOutput | tuple:
        # input_ids: [B, S]
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings = "
                             f"{self.config.max_position_embeddings}; truncate the inputs (tokenizer(..., "
                             f"truncation=True)).")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)
        out = self.encoder(x, attention_mask, bool(output_hidden_states if output_hidden_states is not None
                                                   else self.config.output_hidden_states),
                           bool(output_router_logits))
        out.pooler_output = torch.tanh(self.pooler(out.last_hidden_state[:, 0]))
        return _as_tuple(out, return_dict, self.config)


# Adapted from widenet_ds.model.widenet.WideNetForPreTraining: its masked-LM half alone, for transformers'
#   AutoModelForMaskedLM and fill-mask pipelines
class WideNetForMaskedLM(WideNetTextPreTrainedModel):
    """Masked LM (the pretraining checkpoint's MLM head; its SOP head is left unused)."""

    def __init__(self, config: WideNetConfig) -> None:
        super().__init__(config)
        self.widenet = WideNetModel(config)
        self.mlm_head = MaskedLMHead(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.widenet.embeddings.word

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                labels: Tensor | None = None, output_hidden_states: bool | None = None,
                output_router_logits: bool | None = None,
                return_dict: bool | None = None) -> WideNetMaskedLMOutput | tuple:
        """labels: [B, S] token ids at the masked positions, -100 elsewhere."""
        body = self.widenet(input_ids, attention_mask, token_type_ids, output_hidden_states, output_router_logits,
                            return_dict=True)
        logits = self.mlm_head(body.last_hidden_state, self.widenet.embeddings.word.weight)  # [B, S, V]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        out = WideNetMaskedLMOutput(loss=self._total_loss(loss, body.aux_loss), logits=logits, **_routing_fields(body))
        return _as_tuple(out, return_dict, self.config)


# Adapted from widenet_ds.model.widenet.WideNetForPreTraining: transformers' argument names (labels,
#   sentence_order_label), outputs and loss (one sum, no separate MLM / SOP losses)
class WideNetForPreTraining(WideNetTextPreTrainedModel):
    """ALBERT's pretraining heads: masked LM + sentence-order prediction on the pooled [CLS]."""

    def __init__(self, config: WideNetConfig) -> None:
        super().__init__(config)
        self.widenet = WideNetModel(config)
        self.mlm_head = MaskedLMHead(config)
        self.sop_dropout = nn.Dropout(config.classifier_dropout)
        self.sop_head = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.widenet.embeddings.word

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                labels: Tensor | None = None, sentence_order_label: Tensor | None = None,
                output_hidden_states: bool | None = None, output_router_logits: bool | None = None,
                return_dict: bool | None = None) -> WideNetForPreTrainingOutput | tuple:
        """labels: masked-LM targets [B, S] (-100 where not masked); sentence_order_label: [B], 1 = swapped."""
        body = self.widenet(input_ids, attention_mask, token_type_ids, output_hidden_states, output_router_logits,
                            return_dict=True)
        mlm_logits = self.mlm_head(body.last_hidden_state, self.widenet.embeddings.word.weight)
        sop_logits = self.sop_head(self.sop_dropout(body.pooler_output))
        losses = []
        if labels is not None:
            losses.append(F.cross_entropy(mlm_logits.reshape(-1, mlm_logits.shape[-1]), labels.reshape(-1),
                                          ignore_index=-100))
        if sentence_order_label is not None:
            losses.append(F.cross_entropy(sop_logits.float(), sentence_order_label))
        out = WideNetForPreTrainingOutput(loss=self._total_loss(sum(losses) if losses else None, body.aux_loss),
                                          prediction_logits=mlm_logits, sop_logits=sop_logits, **_routing_fields(body))
        return _as_tuple(out, return_dict, self.config)


# Adapted from widenet_ds.model.widenet.WideNetForSequenceClassification: num_labels from the config, and
#   transformers' problem_type (multi-label classification too)
class WideNetForSequenceClassification(WideNetTextPreTrainedModel):
    """GLUE-style classification on the pooled [CLS]; num_labels = 1 is regression (STS-B)."""

    def __init__(self, config: WideNetConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.widenet = WideNetModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                labels: Tensor | None = None, output_hidden_states: bool | None = None,
                output_router_logits: bool | None = None,
                return_dict: bool | None = None) -> WideNetSequenceClassifierOutput | tuple:
        body = self.widenet(input_ids, attention_mask, token_type_ids, output_hidden_states, output_router_logits,
                            return_dict=True)
        logits = self.classifier(self.dropout(body.pooler_output))  # [B, num_labels]
        loss = None
        if labels is not None:
            if self.num_labels == 1 or self.config.problem_type == "regression":
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            elif self.config.problem_type == "multi_label_classification":
                loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels)
        out = WideNetSequenceClassifierOutput(loss=self._total_loss(loss, body.aux_loss), logits=logits,
                                              **_routing_fields(body))
        return _as_tuple(out, return_dict, self.config)


# Adapted from widenet_ds.model.widenet.WideNetForQuestionAnswering: transformers' loss convention (positions
#   outside the window clamped and ignored)
class WideNetForQuestionAnswering(WideNetTextPreTrainedModel):
    """SQuAD: start/end logits per token; position 0 ([CLS]) is the null answer of SQuAD 2.0."""

    def __init__(self, config: WideNetConfig) -> None:
        super().__init__(config)
        self.widenet = WideNetModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                start_positions: Tensor | None = None, end_positions: Tensor | None = None,
                output_hidden_states: bool | None = None, output_router_logits: bool | None = None,
                return_dict: bool | None = None) -> WideNetQuestionAnsweringOutput | tuple:
        body = self.widenet(input_ids, attention_mask, token_type_ids, output_hidden_states, output_router_logits,
                            return_dict=True)
        start_logits, end_logits = self.qa_outputs(body.last_hidden_state).float().unbind(dim=-1)
        if attention_mask is not None:  # padding can never be an answer boundary
            start_logits = start_logits.masked_fill(attention_mask == 0, -1e4)
            end_logits = end_logits.masked_fill(attention_mask == 0, -1e4)
        loss = None
        if start_positions is not None and end_positions is not None:
            ignored = start_logits.shape[1]  # positions outside the window (transformers' convention) are ignored
            loss = (F.cross_entropy(start_logits, start_positions.clamp(0, ignored), ignore_index=ignored)
                    + F.cross_entropy(end_logits, end_positions.clamp(0, ignored), ignore_index=ignored)) / 2
        out = WideNetQuestionAnsweringOutput(loss=self._total_loss(loss, body.aux_loss), start_logits=start_logits,
                                             end_logits=end_logits, **_routing_fields(body))
        return _as_tuple(out, return_dict, self.config)


# --- images ---------------------------------------------------------------------------------------------
# Copied from widenet_ds.vision.model.PatchEmbedding with PatchEmbedding->PatchEmbeddings, cfg->config,
#   VisionConfig->ViTWideNetConfig
class PatchEmbeddings(nn.Module):
    """Conv2d(patch, stride patch) -> tokens, the CLS token first (the WideNet authors' constant zeros, or a
    learned one), + learned positions, dropout."""

    def __init__(self, config: ViTWideNetConfig) -> None:
        super().__init__()
        self.config = config
        self.projection = nn.Conv2d(config.num_channels, config.hidden_size, config.patch_size,
                                    stride=config.patch_size)
        self.position = nn.Parameter(torch.zeros(1, config.num_tokens, config.hidden_size))
        self.cls = nn.Parameter(torch.zeros(1, 1, config.hidden_size)) if config.cls_token == "learned" else None
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, pixels: Tensor) -> Tensor:
        # pixels: [B, C, H, W] in [-1, 1] -> [B, 1 + N, H_model]
        patches = self.projection(pixels).flatten(2).transpose(1, 2)
        if self.cls is None:  # the WideNet authors' CLS: zeros, not trained
            cls = patches.new_zeros(patches.shape[0], 1, patches.shape[2])
        else:
            cls = self.cls.expand(patches.shape[0], -1, -1)
        return self.dropout(torch.cat([cls, patches], dim=1) + self.position)


# Mirror only: transformers' class attributes of the image family (config class, the body's prefix, input name)
class ViTWideNetPreTrainedModel(WideNetPreTrainedModel):
    config_class = ViTWideNetConfig
    base_model_prefix = "vit_widenet"
    main_input_name = "pixel_values"


# Adapted from widenet_ds.vision.model.ViTWideNetForImageClassification: its body (embeddings, encoder, pooling)
#   as transformers' base model, which checks the pixel shape and names the image processor
class ViTWideNetModel(ViTWideNetPreTrainedModel):
    """Patch embeddings + the pre-LN encoder; pooler_output: the mean of all tokens (head "gap", the CLS token
    included, as the authors' code) or the CLS token (head "cls")."""

    def __init__(self, config: ViTWideNetConfig) -> None:
        super().__init__(config)
        self.embeddings = PatchEmbeddings(config)
        self.encoder = WideNetEncoder(config)
        self.post_init()

    def forward(self, pixel_values: Tensor, output_hidden_states: bool | None = None,
                output_router_logits: bool | None = None,
                return_dict: bool | None = None) -> WideNetModelOutput | tuple:
        size = self.config.image_size
        if tuple(pixel_values.shape[-3:]) != (self.config.num_channels, size, size):
            raise ValueError(f"pixel_values of shape {tuple(pixel_values.shape)}; the model takes [B, "
                             f"{self.config.num_channels}, {size}, {size}] in [-1, 1]: prepare images with the "
                             f"folder's image processor (AutoImageProcessor.from_pretrained(folder, "
                             f"trust_remote_code=True)).")
        x = self.embeddings(pixel_values)
        out = self.encoder(x, None, bool(output_hidden_states if output_hidden_states is not None
                                         else self.config.output_hidden_states), bool(output_router_logits))
        hidden = out.last_hidden_state
        out.pooler_output = hidden.mean(dim=1) if self.config.head == "gap" else hidden[:, 0]
        return _as_tuple(out, return_dict, self.config)


# Adapted from widenet_ds.vision.model.ViTWideNetForImageClassification: its head (pre-logits, classifier) on
#   ViTWideNetModel; plain cross-entropy (ours adds label smoothing and per-sample weights for training)
class ViTWideNetForImageClassification(ViTWideNetPreTrainedModel):
    """The pooled tokens -> optional pre-logits (Dense + tanh) -> classifier over num_classes."""

    def __init__(self, config: ViTWideNetConfig) -> None:
        super().__init__(config)
        self.vit_widenet = ViTWideNetModel(config)
        self.pre_logits = nn.Linear(config.hidden_size, config.hidden_size) if config.pre_logits else None
        self.classifier = nn.Linear(config.hidden_size, config.num_classes)
        self.post_init()

    def forward(self, pixel_values: Tensor, labels: Tensor | None = None, output_hidden_states: bool | None = None,
                output_router_logits: bool | None = None,
                return_dict: bool | None = None) -> WideNetSequenceClassifierOutput | tuple:
        """labels: int [B] class indices, or [B, num_classes] soft targets (mixup)."""
        body = self.vit_widenet(pixel_values, output_hidden_states, output_router_logits, return_dict=True)
        pooled = body.pooler_output
        if self.pre_logits is not None:
            pooled = torch.tanh(self.pre_logits(pooled))
        logits = self.classifier(pooled)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        out = WideNetSequenceClassifierOutput(loss=self._total_loss(loss, body.aux_loss), logits=logits,
                                              **_routing_fields(body))
        return _as_tuple(out, return_dict, self.config)
