"""Parity with HF transformers' ALBERT through our weight map (the one the converters use)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from widenet_ds.interop.albert import albert_config, config_from_albert, from_albert_state_dict, to_albert_state_dict
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import WideNetForPreTraining

SHARINGS = {
    # ALBERT: everything shared, LayerNorms included -> num_hidden_groups = 1
    "albert": dict(share_attention=True, share_ffn=True, share_layernorm=True),
    # WideNet's sharing with a dense FFN: individual LayerNorms -> G = D, shared weights repeated
    "widenet-dense": dict(share_attention=True, share_ffn=True, share_layernorm=False),
    # nothing shared: BERT with factorized embeddings
    "bert-factorized": dict(share_attention=False, share_ffn=False, share_layernorm=False),
}


def _randomise(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def _inputs(vocab: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (3, 24), generator=gen)
    types = torch.zeros_like(ids)
    types[:, 12:] = 1
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0   # padding
    mask[2, 9:] = 0
    return ids, types, mask


@pytest.mark.parametrize("activation", ["gelu_new", "gelu"])
@pytest.mark.parametrize("sharing", list(SHARINGS))
def test_mlm_and_sop_logits_match_hf_albert(sharing, activation):
    cfg = ModelConfig(vocab_size=97, embedding_size=16, hidden_size=32, num_layers=3, num_heads=4,
                      intermediate_size=48, max_position_embeddings=40, ffn="dense", activation=activation,
                      **SHARINGS[sharing])
    torch.manual_seed(0)
    ours = WideNetForPreTraining(cfg).eval()
    _randomise(ours, seed=1)
    hf_cfg = transformers.AlbertConfig(**{k: v for k, v in albert_config(cfg).items() if k != "architectures"})
    assert hf_cfg.num_hidden_groups == (1 if sharing == "albert" else cfg.num_layers)
    theirs = transformers.AlbertForPreTraining(hf_cfg).eval()
    missing, unexpected = theirs.load_state_dict(to_albert_state_dict(ours.state_dict(), cfg), strict=False)
    assert not unexpected and all("position_ids" in k for k in missing)

    ids, types, mask = _inputs(cfg.vocab_size, seed=2)
    with torch.no_grad():
        a = ours(ids, types, mask)
        b = theirs(input_ids=ids, token_type_ids=types, attention_mask=mask)
    assert (a.mlm_logits - b.prediction_logits).abs().max().item() <= 1e-4
    assert (a.sop_logits - b.sop_logits).abs().max().item() <= 1e-4
    # and the map is not trivially passing: perturbing one shared tensor changes our logits
    with torch.no_grad():
        ours.widenet.encoder.ffn[0].fc_in.weight.add_(0.5)
        assert (ours(ids, types, mask).mlm_logits - b.prediction_logits).abs().max().item() > 1e-3


@pytest.mark.parametrize("sharing", list(SHARINGS))
def test_from_albert_then_to_albert_is_identity_and_recovers_sharing(sharing):
    cfg = ModelConfig(vocab_size=50, embedding_size=8, hidden_size=16, num_layers=2, num_heads=2,
                      intermediate_size=24, max_position_embeddings=32, ffn="dense", **SHARINGS[sharing])
    torch.manual_seed(3)
    ours = WideNetForPreTraining(cfg)
    _randomise(ours, seed=4)
    hf_state = to_albert_state_dict(ours.state_dict(), cfg)
    back_cfg = config_from_albert(albert_config(cfg), hf_state)
    assert (back_cfg.share_attention, back_cfg.share_ffn, back_cfg.share_layernorm) == \
        (cfg.share_attention, cfg.share_ffn, cfg.share_layernorm)
    back = from_albert_state_dict(hf_state, back_cfg)
    again = to_albert_state_dict(back, back_cfg)
    assert again.keys() == hf_state.keys()
    assert all(torch.equal(again[k], hf_state[k]) for k in hf_state)


def test_moe_model_is_refused_by_the_albert_map():
    from widenet_ds.errors import CheckpointError
    with pytest.raises(CheckpointError, match="Mixture-of-Experts.*`widenet-ds convert to-hf`"):
        albert_config(ModelConfig.from_preset("widenet-tiny-e4"))
