"""docs/gpu.md's commands against what they call: the GPU set-up's options and DeepSpeed's op names and switches, the
Slurm recipe's sbatch options, variables and task options (the trainer's own parser, then the parallel layout and
the DeepSpeed JSON checked for the job's world size, as the ranks check them), and the op table against what the
engine builds. The set-up itself downloads GBs and compiles: scripts/check_gpu_install.sh runs it, by hand."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from tests.support.launching import REPO, child_env
from widenet_ds.distributed.parallel import ParallelPlan
from widenet_ds.engine.ds_config import load_ds_config, validate_ds_config
from widenet_ds.errors import ConfigError
from widenet_ds.model.config import ModelConfig
from widenet_ds.tasks import TASKS
from widenet_ds.training.command_line import parse

PAGE = REPO / "docs" / "gpu.md"
SBATCH = REPO / "slurm" / "train.sbatch"


def commands() -> list[list[str]]:
    """Every command of the page's bash blocks as words (continuation lines joined, comments left out)."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.DOTALL):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            if words := shlex.split(line, comments=True):
                found.append(words)
    return found


def program(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """(the VAR=value words before the program, the program and its arguments)."""
    at = next(i for i, word in enumerate(words) if not re.match(r"^[A-Z_]+=", word))
    return dict(word.split("=", 1) for word in words[:at]), words[at:]


def deepspeed_builders():
    from deepspeed.ops.op_builder.cpu.cpu_adam import CPUAdamBuilder
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder
    from deepspeed.ops.op_builder.fused_lamb import FusedLambBuilder

    return {b.NAME: b.BUILD_VAR for b in (FusedLambBuilder, FusedAdamBuilder, CPUAdamBuilder)}


def test_the_set_up_commands_use_the_set_ups_options_and_deepspeeds_op_names():
    script = (REPO / "scripts" / "setup_gpu.sh").read_text()
    builders = deepspeed_builders()
    setups = [program(words) for words in commands() if "./launcher.sh" in words]
    assert len(setups) >= 4
    for env, argv in setups:
        assert argv[:3] == ["./launcher.sh", "setup", "--gpu"], argv
        assert set(env) <= {"WIDENET_TORCH_INDEX", "TORCH_CUDA_ARCH_LIST"} and all(var in script for var in env)
        for option in argv[3:]:
            name, _, ops = option.partition("=")
            assert name == "--prebuild-ops", option
            assert ops == "" or set(ops.split(",")) <= set(builders), f"{ops}: not DeepSpeed's op names {builders}"
    default = re.search(r'--prebuild-ops\) PREBUILD="([^"]+)"', script).group(1)
    assert set(default.split(",")) == {"fused_lamb", "fused_adam"}
    assert "# fused_lamb and fused_adam" in PAGE.read_text()
    # the switches the page names are DeepSpeed's own (its builders' BUILD_VAR)
    for op, switch in builders.items():
        assert f"`{op}`" in PAGE.read_text() and f"{switch}=1" in PAGE.read_text(), op


def test_the_op_table_is_what_the_engine_builds_for_the_shipped_jsons():
    """scripts/gpu_ops.py, run as the page says (it decides with engine/build.py optimizer_op)."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_ops.py")], capture_output=True, text=True,
                          env=child_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = {line.split(":")[0].strip(): line for line in proc.stdout.splitlines()}
    fused_adam = lines["fused_adam (DS_BUILD_FUSED_ADAM=1)"]
    for name in ("finetune_sst2.json", "finetune_mnli.json", "finetune_squad11.json", "finetune_squad20.json"):
        assert name in fused_adam and name in PAGE.read_text()
    none = lines["no op (our LAMB under ZeRO, or torch's optimizer)"]
    assert "pretrain_phase1_seq128_lamb_zero1_bf16.json" in none and "pretrain_phase2_seq512_lamb_zero2_fp16.json" in none
    assert "fused_lamb (DS_BUILD_FUSED_LAMB=1): a Lamb JSON at ZeRO stage 0" in proc.stdout


def sbatch_options() -> set[str]:
    """The sbatch options slurm/train.sbatch's header documents, from "sbatch's own options override" on
    ("#   --nodes   nodes", "#   --time, --partition   ...") to its environment."""
    text = SBATCH.read_text()
    header = text[text.index("sbatch's own options override"):text.index("# Environment")]
    return {option for names in re.findall(r"^#\s+(--[a-z-]+(?:, --[a-z-]+)*)", header, re.MULTILINE)
            for option in names.split(", ")}


def sbatch_commands() -> list[tuple[dict[str, str], list[str]]]:
    return [(env, argv) for env, argv in map(program, commands()) if argv[0] == "sbatch"]


def the_recipe() -> tuple[dict[str, str], dict[str, str], str, list[str]]:
    """(the variables the job gets, sbatch options, task, the task's options) of the page's one sbatch command of the
    job (its preflight's is the same with PREFLIGHT=1)."""
    (exported, job), = [(env, argv) for env, argv in sbatch_commands() if "PREFLIGHT" not in env]
    at = job.index("slurm/train.sbatch")
    options = dict(option.split("=", 1) for option in job[1:at])
    return exported, options, job[at + 1], job[at + 2:]


def test_the_slurm_recipe_gives_every_variable_and_parses_as_its_ranks_parse_it():
    exported, options, task, task_args = the_recipe()
    assert set(exported) == {"PYTHON", "OUTPUT_DIR"}  # the two the script reads with a default that would guess
    assert exported["PYTHON"].endswith("/.venv/bin/python")
    assert set(options) <= sbatch_options(), set(options) - sbatch_options()
    assert {"--nodes", "--ntasks-per-node", "--gpus-per-node"} <= set(options)
    assert options["--ntasks-per-node"] == options["--gpus-per-node"] == "8"
    assert not [a for a in task_args if a.startswith("--output-dir")]  # the script refuses it
    # what every rank parses: the options plus what the script adds
    cfg = parse(TASKS[task].config, task_args + ["--output-dir", exported["OUTPUT_DIR"], "--resume", "--no-progress-bar"])
    assert cfg.deepspeed_config.name == "pretrain_phase1_seq128_lamb_zero1_bf16.json"  # the README's recipe
    model = ModelConfig.from_preset(cfg.model_config)
    per_node = int(options["--ntasks-per-node"])
    world = int(options["--nodes"]) * per_node
    parallel = ParallelPlan.plan(world, 0, cfg.ep_size, cfg.branch_parallel, model)
    assert per_node % cfg.ep_size == 0 and cfg.ep_size == model.moe.num_experts == 8  # one expert per GPU, in a node
    config = load_ds_config(REPO / cfg.deepspeed_config)
    settings = validate_ds_config(config, world_size=parallel.data_parallel_size, has_moe=True, cuda_available=True)
    assert settings.precision == "bf16" and settings.zero_stage == 1


def test_the_slurm_recipes_first_step_is_its_preflight_the_same_job_with_preflight_1():
    jobs = sbatch_commands()
    assert [env.get("PREFLIGHT") for env, _ in jobs] == ["1", None]  # the preflight first, then the job
    (preflight_env, preflight), (job_env, job) = jobs
    assert preflight == job and {**job_env, "PREFLIGHT": "1"} == preflight_env
    assert '"${PREFLIGHT:-0}" == 1' in SBATCH.read_text() and "-m widenet_ds.launch.preflight_rank" in SBATCH.read_text()
    assert "(cluster.md#check-the-cluster-before-the-job---preflight)" in PAGE.read_text()
    assert "## Check the cluster before the job: `--preflight`" in (REPO / "docs" / "cluster.md").read_text()


@pytest.mark.parametrize("nodes", [1, 2, 3, 4, 8])
def test_the_node_counts_the_page_allows_are_those_the_json_takes(nodes):
    """"N = 1, 2, 4 or 8": 8 x N GPUs must divide the recipe's 4096 / 64."""
    config = load_ds_config(REPO / "ds_configs" / "pretrain_phase1_seq128_lamb_zero1_bf16.json")
    assert "N = 1, 2, 4\n  or 8" in PAGE.read_text() or "N = 1, 2, 4 or 8" in PAGE.read_text()
    if nodes in (1, 2, 4, 8):
        validate_ds_config(config, world_size=8 * nodes, has_moe=True, cuda_available=True)
    else:
        with pytest.raises(ConfigError, match="train_batch_size"):
            validate_ds_config(config, world_size=8 * nodes, has_moe=True, cuda_available=True)


def test_the_cluster_page_sends_gpu_users_here():
    cluster = (REPO / "docs" / "cluster.md").read_text()
    assert "docs/gpu.md" in cluster
    assert "--ep-size 8" in cluster.split("## N nodes with Slurm")[1].split("##")[0]


def test_the_toolkit_check_refuses_a_cpu_build_of_torch_with_the_fix():
    """scripts/gpu_toolkit.py, which the set-up runs, where torch is the CPU set-up's (the rest of its checks need a
    CUDA build of torch: scripts/check_gpu_install.sh shows them)."""
    import torch

    if torch.version.cuda is not None:
        pytest.skip(f"torch {torch.__version__} is a CUDA build: the refusal is of CPU builds")
    proc = subprocess.run([sys.executable, "-W", "ignore", str(REPO / "scripts" / "gpu_toolkit.py")],
                          capture_output=True, text=True, env=child_env(), timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert (f"[gpu toolkit] torch {torch.__version__} is a CPU build: install a CUDA build (./launcher.sh setup --gpu)"
            in proc.stderr)
