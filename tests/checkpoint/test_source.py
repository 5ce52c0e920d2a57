"""The one route into a checkpoint (checkpoint/source.py): what each purpose opens and refuses, read off real
folders and tags, and, read off the package's code, that nothing else resolves a path to a tag, that no function
takes a path where the opened checkpoint is meant, and that the tokenizer's file name is spelled once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from widenet_ds.checkpoint.marker import LATEST_FILE, CheckpointMeta
from widenet_ds.checkpoint.source import CONVERT, INIT, RESUME, CheckpointSource
from widenet_ds.checkpoint.tags import MODEL_STATES
from widenet_ds.data.tokenizer import TokenizerFiles
from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.model.config import ModelConfig
from widenet_ds.model.widenet import WideNetForPreTraining
from widenet_ds.portable.format import PortableCheckpoint, save_folder

PACKAGE = Path(__file__).resolve().parents[2] / "widenet_ds"
MIRROR = PACKAGE / "interop" / "hf_template"  # ships inside HF folders: it may not import us


def package_trees():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def folder(tmp_path: Path, vocab: bool = True) -> Path:
    cfg = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=64, max_position_embeddings=16)
    tokenizer = TokenizerFiles()
    if vocab:
        (tmp_path / "vocab.txt").write_text("".join(f"{t}\n" for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")))
        tokenizer = TokenizerFiles((tmp_path / "vocab.txt",))
    return save_folder(PortableCheckpoint(cfg, "WideNetForPreTraining", WideNetForPreTraining(cfg).state_dict()),
                       tmp_path / "folder", tokenizer=tokenizer)


def tag(run: Path, step: int = 2, **marker) -> Path:
    """A complete tag as far as opening reads one (its marker, DeepSpeed's rank-0 file, a rank state file)."""
    tag_dir = run / "checkpoints" / f"step{step}"
    tag_dir.mkdir(parents=True)
    (tag_dir / MODEL_STATES).write_bytes(b"")
    (tag_dir / "rank_00000_state.pt").write_bytes(b"")
    cfg = ModelConfig.from_preset("widenet-tiny-e4", vocab_size=64, max_position_embeddings=16)
    CheckpointMeta(step=step, samples=8, world_size=1, ep_size=1, model_config=cfg.to_dict(), deepspeed_config={},
                   architecture="WideNetForPreTraining", task="pretrain", **marker).write(tag_dir)
    (run / "checkpoints" / LATEST_FILE).write_text(tag_dir.name)
    return tag_dir


def test_a_folder_opens_for_init_and_convert_with_its_tokenizer_and_model(tmp_path):
    path = folder(tmp_path)
    for purpose in (INIT, CONVERT):
        source = CheckpointSource.open(path, "--init-from", purpose=purpose)
        assert source.is_folder and source.path == path and source.verified.files == 3  # weights, vocab, README
        assert source.tokenizer_files().paths == (path / "vocab.txt",)
        assert source.model_config(ModelConfig).hidden_size == 128
        assert set(source.read_weights().state) == set(WideNetForPreTraining(source.model_config(ModelConfig))
                                                       .state_dict())
    with pytest.raises(CheckpointError, match="is a checkpoint folder, which has no tags; drop the tag 'step1'"):
        CheckpointSource.open(path, "source", tag="step1", purpose=CONVERT)
    with pytest.raises(CheckpointError, match="no widenet-ds checkpoint at"):  # no optimizer state to continue
        CheckpointSource.open(path, "--resume", purpose=RESUME)


def test_a_run_folder_opens_its_latest_tag_and_a_resume_needs_the_whole_state(tmp_path):
    run = tmp_path / "run"
    latest = tag(run)
    for given in (run, run / "checkpoints", latest):
        source = CheckpointSource.open(given, "--resume", purpose=RESUME)
        assert source.tag_dir == latest and source.meta.step == 2 and not source.is_folder
    (run / "tokenizer.json").write_text("{}")  # pretraining copies the data's tokenizer into its run folder
    assert CheckpointSource.open(run, "--init-from").tokenizer_files().paths == (run / "tokenizer.json",)
    bare = tag(tmp_path / "bare", optimizer_states=False)
    assert CheckpointSource.open(bare, "--init-from").meta.optimizer_states is False  # its weights start a run
    with pytest.raises(CheckpointError, match="holds model states only .* --init-from"):
        CheckpointSource.open(bare, "--resume", purpose=RESUME)


def test_a_directory_that_is_no_checkpoint_gets_the_flag_s_advice(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"--init-from .*empty is a directory but not a checkpoint"):
        CheckpointSource.open(tmp_path / "empty", "--init-from")
    with pytest.raises(CheckpointError, match="no widenet-ds checkpoint at"):
        CheckpointSource.open(tmp_path / "empty", "source", purpose=CONVERT)


def test_only_the_one_route_resolves_a_path_to_a_tag():
    callers = sorted(str(path.relative_to(PACKAGE)) for path, tree in package_trees() for node in ast.walk(tree)
                     if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "resolve_tag_dir")
    # CheckpointSource.open, and `latest` of a run's own checkpoints folder (tags.latest_checkpoint)
    assert callers == ["checkpoint/source.py", "checkpoint/tags.py"], callers


def test_no_function_takes_a_path_or_an_opened_checkpoint():
    """A consumer takes the opened `CheckpointSource`; a union with a path would be a second route in."""
    unions = []
    for path, tree in package_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.annotation is not None:
                text = ast.unparse(node.annotation)
                if "CheckpointSource" in text and ("Path" in text or "str" in text):
                    unions.append(f"{path.relative_to(PACKAGE)}: {node.arg}: {text}")
    assert not unions, unions


def test_the_tokenizer_file_names_are_spelled_in_one_module():
    spelled = sorted({str(path.relative_to(PACKAGE)) for path, tree in package_trees()
                      if not path.is_relative_to(MIRROR) for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and node.value in ("tokenizer.json", "vocab.txt")})
    assert spelled == ["data/tokenizer.py"], spelled
