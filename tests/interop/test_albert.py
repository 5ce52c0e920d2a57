"""to-albert / from-albert through transformers' own AlbertForPreTraining, and upcycling into a WideNet."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from widenet_ds.checkpoint.source import load_pretrained  # noqa: E402
from widenet_ds.commands.convert import cli as convert  # noqa: E402
from widenet_ds.errors import CheckpointError  # noqa: E402
from widenet_ds.model.config import ModelConfig  # noqa: E402
from widenet_ds.model.widenet import WideNetForPreTraining  # noqa: E402
from widenet_ds.portable.format import PortableCheckpoint, read_folder, save_folder  # noqa: E402

pytestmark = pytest.mark.usefixtures("dist")
DIMS = dict(vocab_size=97, embedding_size=16, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=48,
            max_position_embeddings=40, ffn="dense", activation="gelu_new")
SHARINGS = {"albert": dict(share_layernorm=True), "widenet-dense": dict(share_layernorm=False)}


def randomised(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model.eval()


def inputs(seed: int = 2):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, DIMS["vocab_size"], (3, 24), generator=gen)
    types = torch.zeros_like(ids)
    types[:, 12:] = 1
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0
    return ids, types, mask


@pytest.mark.parametrize("sharing", list(SHARINGS))
def test_to_albert_loads_in_transformers_with_the_same_logits(sharing, tmp_path):
    cfg = ModelConfig(**DIMS, **SHARINGS[sharing])
    ours = randomised(WideNetForPreTraining(cfg), seed=1)
    save_folder(PortableCheckpoint(cfg, "WideNetForPreTraining", ours.state_dict()), tmp_path / "ours")
    assert convert(["to-albert", str(tmp_path / "ours"), str(tmp_path / "hf")]) == 0
    theirs, info = transformers.AlbertForPreTraining.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ids, types, mask = inputs()
    with torch.no_grad():
        a = ours(ids, types, mask)
        b = theirs.eval()(input_ids=ids, token_type_ids=types, attention_mask=mask)
    assert (a.mlm_logits - b.prediction_logits).abs().max().item() <= 1e-4
    assert (a.sop_logits - b.sop_logits).abs().max().item() <= 1e-4


@pytest.mark.parametrize("sharing", list(SHARINGS))
def test_from_albert_then_to_albert_is_the_identity_on_weights(sharing, tmp_path):
    hf_cfg = transformers.AlbertConfig(vocab_size=97, embedding_size=16, hidden_size=32, num_hidden_layers=3,
                                       num_attention_heads=4, intermediate_size=48, max_position_embeddings=40,
                                       num_hidden_groups=1 if sharing == "albert" else 3)
    torch.manual_seed(5)
    hf = transformers.AlbertForPreTraining(hf_cfg)
    if sharing == "widenet-dense":  # individual LayerNorms, attention and FFN equal in every group
        groups = hf.albert.encoder.albert_layer_groups
        with torch.no_grad():
            for g in groups[1:]:
                for name, p in g.named_parameters():
                    if "LayerNorm" not in name and "full_layer_layer_norm" not in name:
                        p.copy_(dict(groups[0].named_parameters())[name])
                    else:
                        p.normal_()
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    assert convert(["from-albert", str(tmp_path / "hf"), str(tmp_path / "ours")]) == 0
    assert read_folder(tmp_path / "ours").config.share_layernorm == (sharing == "albert")
    assert convert(["to-albert", str(tmp_path / "ours"), str(tmp_path / "back")]) == 0
    original = {k: v for k, v in hf.state_dict().items() if "position_ids" not in k}
    back = transformers.AlbertForPreTraining.from_pretrained(tmp_path / "back").state_dict()
    assert original.keys() <= back.keys()
    for key, tensor in original.items():
        assert torch.equal(back[key], tensor), key


def test_upcycling_copies_albert_into_every_expert(tmp_path):
    cfg = ModelConfig(**DIMS, share_layernorm=True)
    albert = randomised(WideNetForPreTraining(cfg), seed=3)
    save_folder(PortableCheckpoint(cfg, "WideNetForPreTraining", albert.state_dict()), tmp_path / "albert")
    assert convert(["to-albert", str(tmp_path / "albert"), str(tmp_path / "hf")]) == 0
    assert convert(["from-albert", str(tmp_path / "hf"), str(tmp_path / "wide0"), "--upcycle-experts", "4",
                    "--upcycle-noise", "0"]) == 0
    # Noise 0, renormalised top-2 weights, no dropping: every token gets ALBERT's FFN -> ALBERT's logits (at the
    # real tokens: padding gets no route, so its positions skip the FFN that ALBERT runs on them).
    exact = {"moe": {"combine_weights": "renormalize", "drop_tokens": False}}
    wide, report = load_pretrained(WideNetForPreTraining, tmp_path / "wide0", model_overrides=exact)
    assert wide.cfg.is_moe and wide.cfg.moe.num_experts == 4 and not wide.cfg.share_layernorm
    assert report.new == [] and report.unused == []
    wide.ensure_process_groups()
    ids, types, mask = inputs()
    real = mask.bool()
    assert not real.all()
    with torch.no_grad():
        torch.testing.assert_close(wide.eval()(ids, types, mask).mlm_logits[real],
                                   albert(ids, types, mask).mlm_logits[real], atol=1e-5, rtol=1e-5)
    assert convert(["from-albert", str(tmp_path / "hf"), str(tmp_path / "wide"), "--upcycle-experts", "4"]) == 0
    state = read_folder(tmp_path / "wide").state
    ffn = albert.widenet.encoder.ffn[0].fc_in.weight
    experts = [state[f"widenet.encoder.ffn.0.moe.deepspeed_moe.experts.deepspeed_experts.{e}.fc_in.weight"]
               for e in range(4)]
    for e in experts:
        assert 0 < (e - ffn).std() < 0.02 * ffn.std()  # close to ALBERT's FFN, yet not equal
    assert not torch.equal(experts[0], experts[1])
    assert "upcycled to 4 experts" in read_folder(tmp_path / "wide").provenance["conversion"]


def test_from_albert_refuses_a_pickle_only_folder(tmp_path):
    hf = transformers.AlbertForPreTraining(transformers.AlbertConfig(
        vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=24))
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "model.safetensors").unlink()  # the older transformers layout: a pickle only
    torch.save(hf.state_dict(), tmp_path / "hf" / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin: pickles are refused"):
        convert(["from-albert", str(tmp_path / "hf"), str(tmp_path / "ours")])
    assert not (tmp_path / "ours").exists()
