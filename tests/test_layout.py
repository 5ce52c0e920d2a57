"""The package's shape, checked from its own imports: no import cycles between modules, no package
importing a package above it, and no function-local imports of our own modules (they hide cycles). And the
tests' shape: they mirror the package, `tests/<package>/test_<module>[_<aspect>].py` for each module (or a
reason, in COVERED_BY, why another file covers it), with multi-rank, Slurm, golden-curve and end-to-end
runs in `tests/integration/`."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "widenet_ds"

# Each package may import only from packages of a lower layer (and from itself).
# `vision` is a domain package beside `model` (its config, model, datasets, loader, augmentation), which the
# checkpoint stack registers; its trainer is a task (`tasks/classify/`). `training` is the loop and the planner,
# `tasks` the tasks they drive (one package each: settings, results, task, data), `run` what starts a task in a
# rank (above the tasks: the one list of what trains each).
LAYERS = [
    {"widenet_ds", "widenet_ds.errors", "widenet_ds.formats", "widenet_ds.fs", "widenet_ds.run_folder",
     "widenet_ds.results", "widenet_ds.seeds"},
    {"widenet_ds.data", "widenet_ds.model", "widenet_ds.engine", "widenet_ds.vision"},
    {"widenet_ds.distributed"},
    {"widenet_ds.portable"},
    {"widenet_ds.checkpoint"},
    {"widenet_ds.training"},
    {"widenet_ds.tasks"},
    {"widenet_ds.run", "widenet_ds.interop", "widenet_ds.report"},
    {"widenet_ds.launch"},
    {"widenet_ds.cli", "widenet_ds.train", "widenet_ds.commands"},
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def own_imports(tree: ast.Module, known: set[str]) -> list[tuple[str, bool]]:
    """(imported module, imported at module level?) for every import of a widenet_ds module."""
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("widenet_ds"):
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("widenet_ds")]
        found += [(name, id(node) in top) for name in names]
    return found


def graph() -> dict[str, set[str]]:
    trees = modules()
    return {name: {dep for dep, _ in own_imports(tree, set(trees)) if dep != name} for name, tree in trees.items()}


def layer_of(module: str) -> int:
    # longest matching prefix, down to a top-level module or package (never the bare root)
    for parts in range(module.count(".") + 1, 1 if module != "widenet_ds" else 0, -1):
        prefix = ".".join(module.split(".")[:parts])
        for index, layer in enumerate(LAYERS):
            if prefix in layer:
                return index
    raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS in {__file__}")


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Depth-first search; each back edge closes one cycle, returned as its path."""
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == "open":
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return cycles


def test_no_import_cycles():
    cycles = find_cycles(graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_finds_cycles():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_package_imports_a_package_above_it():
    upward = [f"{module} -> {dep}" for module, deps in graph().items() for dep in deps
              if package_of(dep) != package_of(module) and layer_of(dep) > layer_of(module)]
    assert not upward, "upward imports: " + ", ".join(sorted(upward))


def test_no_function_local_imports_of_our_modules():
    trees = modules()
    local = [f"{name} imports {dep} inside a function" for name, tree in trees.items()
             for dep, top in own_imports(tree, set(trees)) if not top]
    assert not local, "; ".join(local)


# The script forms of the entry (pretrain/run_pretrain.py, finetune/*.py): thin, over `widenet_ds.train` only.
SCRIPT_FOLDERS = ("pretrain", "finetune")


def test_the_entry_scripts_import_only_the_one_entry():
    scripts = sorted(p for folder in SCRIPT_FOLDERS for p in (PACKAGE.parent / folder).glob("*.py"))
    assert len(scripts) == 3, scripts
    for script in scripts:
        tree = ast.parse(script.read_text(), str(script))
        imported = {node.module if isinstance(node, ast.ImportFrom) else alias.name
                    for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for alias in node.names}
        assert imported == {"widenet_ds.train"}, f"{script.name} imports {imported}: a script form holds no logic"


def test_launcher_sh_stays_small():
    """launcher.sh only sets up, tests and starts the demos; everything else is `widenet-ds`."""
    lines = (PACKAGE.parent / "launcher.sh").read_text().splitlines()
    assert len(lines) <= 80, f"launcher.sh has {len(lines)} lines; move logic into widenet-ds"


# --- the tests mirror the package -----------------------------------------------------------------------
TESTS = PACKAGE.parent / "tests"
# A module without a test file of its own name, and the test files that cover it instead (with why).
COVERED_BY = {
    "widenet_ds/cli.py": ["integration/test_bad_inputs.py"],  # every `widenet-ds` command's errors, the dispatch
    "widenet_ds/train.py": ["integration/test_golden_losses.py", "integration/test_bad_inputs.py"],  # every run
    "widenet_ds/commands/demo.py": ["integration/test_demo.py"],
    "widenet_ds/commands/branches.py": ["portable/test_branches.py"],
    "widenet_ds/commands/verify.py": ["checkpoint/test_verify.py"],
    "widenet_ds/data/prepared.py": ["data/test_loader.py", "tasks/pretrain/test_task.py"],  # opened once, counted
    "widenet_ds/training/new_shape.py": ["integration/test_resume_new_shape.py"],  # real resumes on other shapes
    "widenet_ds/checkpoint/deepspeed.py": ["commands/test_convert.py", "portable/test_weights_image_models.py"],
    # the model card of `convert to-hf`, read from real runs' folders
    "widenet_ds/interop/hf_model_card.py": ["integration/test_hf_fresh_venv.py", "interop/test_hf_export.py"],
    # the files `convert to-hf` writes into HF folders, loaded through transformers' Auto classes
    "widenet_ds/interop/hf_template/configuration_widenet.py": ["interop/test_hf_export.py"],
    "widenet_ds/interop/hf_template/image_processing_widenet.py": ["interop/test_hf_export.py",
                                                                      "integration/test_hf_fresh_venv.py"],
    "widenet_ds/interop/hf_template/modeling_widenet.py": ["interop/test_hf_export.py",
                                                              "integration/test_hf_fresh_venv.py"],
    "widenet_ds/checkpoint/reshard.py": ["commands/test_convert.py", "portable/test_weights_image_models.py"],
    # the state put into real engines of every layout and precision (and resumed from), under the launcher
    "widenet_ds/checkpoint/relayout.py": ["checkpoint/test_shape_free.py", "integration/test_resume_new_shape.py"],
    "widenet_ds/checkpoint/tokenizer_check.py": ["integration/test_bad_inputs.py", "commands/test_convert.py"],
    "widenet_ds/engine/ds_sections.py": ["engine/test_ds_config.py"],
    "widenet_ds/launch/options.py": ["launch/test_launcher.py"],
    # a job's bytes per device, held to real engines: their tensors on 2 launched ranks, the profiler's peak
    "widenet_ds/launch/job_memory.py": ["integration/test_dry_run_memory.py", "engine/test_activation_memory.py"],  # the launch command line, parsed and refused there
    "widenet_ds/engine/quiet.py": ["launch/test_signals.py"],  # the console of a real run, checked line by line
    # two real gloo ranks: a stopped peer's collective ends at the training bound; every rank's problems at once
    "widenet_ds/distributed/collective_timeouts.py": ["distributed/test_peer_watch.py"],
    "widenet_ds/distributed/every_rank.py": ["distributed/test_peer_watch.py"],
    "widenet_ds/distributed/timeouts.py": ["distributed/test_peer_watch.py"],  # the bounds those collectives get
    # the seeds derived with its spacing: the experts' (by value), every run's curve (the golden ones)
    "widenet_ds/seeds.py": ["model/test_base.py", "integration/test_golden_losses.py"],
    "widenet_ds/training/branch_schedule.py": ["model/test_branches.py", "integration/test_paraformer_training.py"],
    "widenet_ds/distributed/console.py": ["launch/test_signals.py", "integration/test_bad_inputs.py"],
    "widenet_ds/training/flags.py": ["training/test_command_line.py"],
    "widenet_ds/training/model_source.py": ["tasks/pretrain/test_task.py", "integration/test_bad_inputs.py"],
    # starting a rank: every task's in-process runs, and their real launches
    "widenet_ds/run/run_task.py": ["tasks/pretrain/test_task.py", "tasks/finetune/test_task.py"],
    "widenet_ds/run/sweep.py": ["tasks/finetune/test_task.py", "integration/test_finetune_resume.py"],
    # each task's settings: their values, what they name on the machine, their command lines
    "widenet_ds/tasks/pretrain/config.py": ["training/test_run_config.py", "training/test_environment.py"],
    "widenet_ds/tasks/finetune/config.py": ["tasks/finetune/test_task.py", "launch/test_task_options.py"],
    "widenet_ds/tasks/classify/config.py": ["training/test_run_config.py", "integration/test_bad_inputs.py"],
    # every task's results.json, written and read back, of this version and of older ones: one parametrised file
    "widenet_ds/tasks/pretrain/results.py": ["test_results.py"],
    "widenet_ds/tasks/classify/results.py": ["test_results.py"],
    "widenet_ds/tasks/finetune/results.py": ["test_results.py"],
    "widenet_ds/tasks/classify/task.py": ["integration/test_classify.py", "integration/test_golden_losses.py"],
    # finetuning on GLUE and SQuAD: the shared tests of a seed, and real runs under the launcher
    "widenet_ds/tasks/finetune/finetuning.py": ["tasks/finetune/test_task.py"],
    "widenet_ds/tasks/glue/finetuning.py": ["tasks/finetune/test_task.py", "integration/test_finetune.py"],
    "widenet_ds/tasks/squad/finetuning.py": ["tasks/finetune/test_task.py", "integration/test_finetune.py"],
    "widenet_ds/tasks/finetune/weights.py": ["tasks/finetune/test_task.py", "interop/test_hf_export.py"],
    "widenet_ds/tasks/finetune/predict.py": ["tasks/finetune/test_task.py", "integration/test_finetune.py"],
    "widenet_ds/tasks/glue/recipes.py": ["tasks/finetune/test_recipe.py"],
    "widenet_ds/tasks/squad/recipes.py": ["tasks/finetune/test_recipe.py"],
    "widenet_ds/tasks/squad/features.py": ["tasks/squad/test_data.py"],
    "widenet_ds/tasks/squad/postprocess.py": ["tasks/squad/test_data.py"],
    # `from widenet_ds.model import WideNetForPreTraining`, resolved when asked
    "widenet_ds/model/__init__.py": ["model/test_widenet.py"],
    "widenet_ds/vision/config.py": ["vision/test_model.py", "model/test_config_presets.py"],
    "widenet_ds/vision/loader.py": ["vision/test_datasets.py"],
}


def defines_names(path: Path) -> bool:
    """A module that defines something (a package's __init__.py may hold only its docstring and imports)."""
    return any(isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign))
               for node in ast.parse(path.read_text()).body)


def module_paths() -> list[str]:
    """Every module, and the __init__.py of a package that defines something (widenet_ds/tasks/: the table of tasks)."""
    return sorted(str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")
                  if p.name != "__init__.py" or (p.parent != PACKAGE and defines_names(p)))


def module_id(module: str) -> Path:
    """A module's path in the package without its suffix; a package's __init__.py is the package's (widenet_ds/tasks/
    __init__.py is `tasks`: its tests are tests/test_tasks.py)."""
    path = Path(module).relative_to("widenet_ds").with_suffix("")
    return path.parent if path.name == "__init__" else path


def module_of_test(test_file: Path, modules: list[Path]) -> Path | None:
    """The module a test file is named after: `<folder>/test_<module>[_<aspect>].py`, the longest such name
    (tests/training/test_run_config.py is run_config's, not run's)."""
    relative = test_file.relative_to(TESTS)
    stem = test_file.stem.removeprefix("test_")
    named = [m for m in modules if m.parent == relative.parent and (stem == m.name or stem.startswith(f"{m.name}_"))]
    return max(named, key=lambda m: len(m.name), default=None)


def own_test_files(module: str) -> list[Path]:
    """tests/<package>/test_<module>[_<aspect>].py (a top-level module's: tests/test_<module>*.py)."""
    modules = [module_id(m) for m in module_paths()]
    target = module_id(module)
    return [p for p in TESTS.joinpath(*target.parts[:-1]).glob("test_*.py") if module_of_test(p, modules) == target]


def test_every_module_has_its_test_file_or_a_reason():
    missing = [m for m in module_paths() if not own_test_files(m) and m not in COVERED_BY]
    assert not missing, f"modules without tests/<package>/test_<module>.py or a COVERED_BY entry: {missing}"
    stale = [m for m in COVERED_BY if m not in module_paths() or own_test_files(m)]
    assert not stale, f"COVERED_BY entries of modules that are gone or have their own test file now: {stale}"
    absent = [t for files in COVERED_BY.values() for t in files if not (TESTS / t).is_file()]
    assert not absent, f"COVERED_BY names test files that do not exist: {absent}"


def test_every_test_file_is_named_after_a_module_of_its_folder():
    modules = [module_id(m) for m in module_paths()]
    stray = [str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")
             if p.relative_to(TESTS).parts[0] not in ("integration", "scripts") and p.name != "test_layout.py"
             and module_of_test(p, modules) is None]
    assert not stray, f"test files named after no module of their package (move them, or to integration/): {stray}"
