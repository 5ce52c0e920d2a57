"""The script forms of the one entry (pretrain/run_pretrain.py, finetune/run_glue.py, finetune/run_squad.py):
the same command line as `python -m widenet_ds.train TASK`, and started by the real `deepspeed` launcher the way
DeepSpeed's and NVIDIA's BERT recipes start their scripts (`deepspeed SCRIPT --local_rank=0 ...`)."""

from __future__ import annotations

import runpy
import subprocess
import sys

import pytest

from tests.support.golden_curves import ASSETS, RUNS, VOCAB, beyond_tolerance, golden_args, read_asset
from tests.support.launching import REPO, child_env, free_port, run_deepspeed
from tests.support.pretrain_support import events, prepare_data, train_losses

SCRIPTS = {"pretrain": "pretrain/run_pretrain.py", "glue": "finetune/run_glue.py", "squad": "finetune/run_squad.py"}


def help_text(capsys, monkeypatch, argv: list[str], run) -> str:
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        run()
    assert exited.value.code == 0
    return capsys.readouterr().out


def words(text: str) -> list[str]:
    """A help text without its line wrapping (which the program's name shifts)."""
    return text.split()


@pytest.mark.parametrize("task", SCRIPTS)
def test_a_scripts_help_is_the_module_entrys(task, capsys, monkeypatch):
    from widenet_ds.train import main

    script = str(REPO / SCRIPTS[task])
    # the launcher's `--local_rank=0` comes first, as `deepspeed SCRIPT ...` passes it
    shown = help_text(capsys, monkeypatch, [script, "--local_rank=0", "--help"],
                      lambda: runpy.run_path(script, run_name="__main__"))
    expected = help_text(capsys, monkeypatch, ["-m"], lambda: main([task, "--help"]))
    assert f"python -m widenet_ds.train {task}" in expected
    # the same options and help, each entry named as it was started
    assert f"usage: {script} " in shown and "python -m widenet_ds.train" not in shown
    assert words(shown.replace(script, f"python -m widenet_ds.train {task}")) == words(expected)


@pytest.mark.multirank
def test_deepspeed_runs_the_pretraining_script_on_the_golden_curve(tmp_path):
    """`deepspeed pretrain/run_pretrain.py` on 1 rank: the first steps of the stored widenet-tiny-e4 curve; then
    `widenet-ds launch pretrain --config RUN -- --resume --max-steps 6` continues it from the settings the run saved
    (run_config.json) and stays on the curve."""
    steps, more = 4, 6
    data = prepare_data(tmp_path / "data", [], tokenizer=str(VOCAB))
    out = tmp_path / "run"
    args = golden_args(RUNS["widenet_tiny_e4_1rank"], out, {"data": data})
    run_deepspeed(REPO / SCRIPTS["pretrain"], [*args, "--max-steps", str(steps)], num_ranks=1, runner=True)
    curve = read_asset(ASSETS / "widenet_tiny_e4_1rank.txt")
    assert not beyond_tolerance({step: loss for step, loss in curve.items() if step <= steps}, train_losses(out))

    proc = subprocess.run([sys.executable, "-m", "widenet_ds.cli", "launch", "pretrain", "--num-ranks", "1",
                           "--master-port", str(free_port()), "--config", str(out), "--", "--resume", "--max-steps",
                           str(more)], cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints' / f'step{steps}'}" in events(out)
    assert sorted(train_losses(out)) == list(range(1, more + 1))
    assert not beyond_tolerance({step: loss for step, loss in curve.items() if step <= more}, train_losses(out))


@pytest.mark.multirank
def test_deepspeed_runs_the_glue_script(shared_data, tmp_path):
    """`deepspeed finetune/run_glue.py` on 1 rank: a 2-step SST-2 seed trains, evaluates and writes its results."""
    out = tmp_path / "run"
    run_deepspeed(REPO / SCRIPTS["glue"], [
        "--task", "sst2", "--data", str(shared_data / "glue/SST-2"), "--model-config", "widenet-tiny-e4",
        "--tokenizer", str(shared_data / "vocab/bert-base-uncased-vocab.txt"), "--allow-recipe-mismatch",
        "--deepspeed_config", str(REPO / "ds_configs/finetune_cpu_small.json"), "--output-dir", str(out),
        "--max-train-examples", "32", "--max-eval-examples", "16", "--max-seq-length", "32", "--max-steps", "2",
        "--seed", "1", "--log-interval", "1", "--no-progress-bar", "--no-tensorboard"], num_ranks=1, runner=True)
    assert sorted(train_losses(out / "seed1")) == [1, 2]
    assert (out / "results.json").is_file()


def test_the_train_command_of_widenet_ds_is_the_module_entry(capsys, monkeypatch):
    """One dispatcher: `widenet-ds train` runs what `python -m widenet_ds.train` runs, usage and errors alike, each
    named as it was started; a misspelt task gets a "did you mean"."""
    from widenet_ds.cli import main as widenet_ds
    from widenet_ds.train import main

    assert widenet_ds(["train"]) == main([]) == 0
    usage = capsys.readouterr().out
    assert usage.count("usage: python -m widenet_ds.train TASK") == 1 and usage.count("usage: widenet-ds train TASK") == 1
    assert words(help_text(capsys, monkeypatch, ["-m"], lambda: widenet_ds(["train", "--local_rank=0", "glue",
                                                                            "--help"]))
                 .replace("widenet-ds train glue", "python -m widenet_ds.train glue")) \
        == words(help_text(capsys, monkeypatch, ["-m"], lambda: main(["glue", "--help"])))
    assert widenet_ds(["train", "bogus"]) == main(["bogus"]) == 2
    assert capsys.readouterr().err.count("unknown task 'bogus'") == 2
    assert widenet_ds(["train", "pretrian"]) == 2
    assert "unknown task 'pretrian'. Did you mean 'pretrain'?" in capsys.readouterr().err
    assert main(["pretrain", "--model-config", "albert-tiny", "--deepspeed_config", "none.json", "--data", "d",
                 "--output-dir", "o", "--log-interval", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m widenet_ds.train pretrain: error: 3 problems with the pretrain settings:"), err
    assert "--log-interval must be positive" in err and "none.json does not exist" in err and "--data d does not" in err


@pytest.mark.multirank
def test_the_script_form_prints_a_command_line_error_once_for_all_ranks():
    """`deepspeed --num_gpus 2 finetune/run_glue.py` without --data: one error line naming the script, not argparse's
    usage and error once per rank."""
    proc = run_deepspeed(REPO / SCRIPTS["glue"], ["--task", "sst2", "--model-config", "widenet-tiny-e4",
                                                  "--deepspeed_config", "x.json", "--output-dir", "o"], check=False,
                         runner=True)
    output = proc.stdout + proc.stderr
    errors = [line for line in output.splitlines() if ": error" in line]  # (not the deepspeed runner's log lines)
    assert proc.returncode != 0 and len(errors) == 1, output[-3000:]
    assert errors[0].startswith(f"{REPO / SCRIPTS['glue']}: error: the following arguments are required: --data"), errors
    assert "usage:" not in output
