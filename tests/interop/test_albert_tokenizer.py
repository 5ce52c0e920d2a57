"""Issue 16 friction: the HF ALBERT export's tokenizer loads with `AutoTokenizer` and gives our ids;
exported files are readable by group and others."""

from __future__ import annotations

from pathlib import Path

import torch

from widenet_ds.checkpoint.source import CONVERT, CheckpointSource
from widenet_ds.data.tokenizer import TokenizerFiles, load_tokenizer
from widenet_ds.interop.albert import to_albert
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import WideNetForPreTraining
from widenet_ds.portable.format import PortableCheckpoint, save_folder


def test_albert_export_tokenizer_loads_with_autotokenizer(tmp_path, shared_data):
    from transformers import AutoTokenizer

    vocab = shared_data / "vocab" / "bert-base-uncased-vocab.txt"
    ours = load_tokenizer(vocab)
    cfg = ModelConfig.from_preset("albert-tiny", vocab_size=ours.get_vocab_size())
    torch.manual_seed(0)
    state = WideNetForPreTraining(cfg).state_dict()
    folder = save_folder(PortableCheckpoint(cfg, "WideNetForPreTraining", state), tmp_path / "folder",
                         tokenizer=TokenizerFiles((vocab,)))
    source = CheckpointSource.open(folder, "source", purpose=CONVERT)
    hf = to_albert(source.read_weights(), source, tmp_path / "hf", tokenizer=TokenizerFiles((vocab,)))
    tokenizer = AutoTokenizer.from_pretrained(str(hf))
    text = "The Quick brown fox's naïve résumé, unbelievably!"
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == ours.encode(text, add_special_tokens=False).ids
    assert tokenizer.cls_token == "[CLS]" and tokenizer.mask_token == "[MASK]"
    for path in list(Path(hf).iterdir()) + list(Path(folder).iterdir()):
        assert path.stat().st_mode & 0o044 == 0o044, f"{path} is not readable by group/others"
