"""Every command of README.md and docs/*.md as a user types it after the README's set-up. Each is parsed by the
parser of the program it runs, nothing trained: a training task's options by the launcher's own check
(launch/task_options.check_task_options, the task's parser and its settings' checks), the other `widenet-ds`
commands, DeepSpeed's runner and the project's scripts by their own argparse parsers; `./launcher.sh test` and
pytest lines by the test paths they name. The cheap ones also run as written. A command of a kind this file
cannot check fails, so that no page shows a command nobody checks. README names every program by the set-up's
path (`./launcher.sh`, `.venv/bin/...`); a docs page says once, at its top, how the venv's commands are reached.
Dated records (docs/benchmarks/YYYY-MM-DD-*.md) keep each command as it ran at its commit: they are not held to
today's options."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.launching import REPO, child_env

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
VENV_LINE = "source .venv/bin/activate"
CHEAP = [".venv/bin/widenet-ds params"]  # run as written, in the checkout
SCRIPT_TASKS = {"pretrain/run_pretrain.py": "pretrain", "finetune/run_glue.py": "glue",
                "finetune/run_squad.py": "squad"}
LAUNCHER_ALIASES = {"vision": "classify"}  # launcher.sh's older name of a task
SBATCH_ADDS = ["--output-dir", "runs/sbatch-job", "--resume", "--no-progress-bar"]  # what slurm/train.sbatch adds


def commands(page: Path) -> list[str]:
    """Every command of the page's bash blocks: continuation lines joined, comments left out, a
    `for V in A B; do ... done` loop as its body once per value."""
    found: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.DOTALL):
        lines = [line.strip() for line in re.sub(r"\s*\\\n\s*", " ", block).splitlines()]
        lines = [line for line in lines if line and not line.startswith("#")]
        while lines:
            line = lines.pop(0)
            loop = re.fullmatch(r"for (\w+) in (.+); do", line)
            if loop is None:
                found.append(line)
                continue
            body = []
            while (inner := lines.pop(0)) != "done":
                body.append(inner)
            for value in shlex.split(loop[2]):
                found += [re.sub(rf"\$\{{?{loop[1]}\}}?", value, inner) for inner in body]
    return found


def words(command: str) -> list[list[str]]:
    """The command's words as the shell splits them (a trailing comment dropped), one list per `&&` part."""
    parts: list[list[str]] = [[]]
    for word in shlex.split(command, comments=True):
        if word == "&&":
            parts.append([])
        else:
            parts[-1].append(word)
    return [part for part in parts if part]


class _Parsed(Exception):
    pass


@contextlib.contextmanager
def _stop_after_parsing():
    """Every ArgumentParser.parse_args returns its namespace by raising _Parsed: a command is checked by its own
    parser and then stops, before it reads or writes anything."""
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    argparse.ArgumentParser.parse_args = parse_and_stop
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original


def _parse_with(run, what: str) -> None:
    """`run()` must reach its parser and pass it; an argparse error names the problem."""
    err = io.StringIO()
    with _stop_after_parsing(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            run()
        except _Parsed:
            return
        except SystemExit as exit_:
            raise AssertionError(f"{what}: refused by its parser ({exit_.code}): {err.getvalue().strip()}") from None
    raise AssertionError(f"{what}: returned without parsing a command line: this file cannot check it")


def check_task(task: str, args: list[str], what: str) -> None:
    from widenet_ds.errors import WideNetError
    from widenet_ds.launch.options import LaunchOptions
    from widenet_ds.launch.task_options import check_task_options

    with contextlib.redirect_stderr(io.StringIO()):
        try:
            check_task_options(LaunchOptions(task, tuple(args)))
        except WideNetError as err:
            raise AssertionError(f"{what}: {err}") from None


def check_launch(args: list[str], what: str) -> None:
    from widenet_ds.launch.options import parse_launch_args
    from widenet_ds.tasks import TASKS
    from widenet_ds.training.command_line import build_parser

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            options = parse_launch_args(args)
        except SystemExit:
            raise AssertionError(f"{what}: {err.getvalue().strip()}") from None
    if options.run_config is None:
        check_task(options.task, list(options.train_args), what)
        return
    # --config takes the task's options from a saved run: the ones given after `--` must be the task's
    known = build_parser(TASKS[options.task].config)._option_string_actions
    given = [arg.split("=")[0] for arg in options.train_args if arg.startswith("-")]
    unknown = [option for option in given if option not in known]
    assert not unknown, f"{what}: not options of {options.task}: {unknown}"


def check_widenet_ds(args: list[str], what: str) -> None:
    from widenet_ds.cli import SUBCOMMANDS
    from widenet_ds.tasks import TASKS

    assert args and (args[0] in SUBCOMMANDS or args[0] in TASKS), f"{what}: no such widenet-ds command"
    name, rest = args[0], args[1:]
    if name in TASKS:  # `widenet-ds TASK ...` is `widenet-ds launch TASK ...`
        check_launch(args, what)
    elif name == "launch":
        check_launch(rest, what)
    elif name == "train":
        check_task(rest[0], rest[1:], what)
    else:
        module, function = SUBCOMMANDS[name][0].split(":")
        _parse_with(lambda: getattr(importlib.import_module(module), function)(rest), what)


def check_test_paths(args: list[str], what: str) -> None:
    named = [arg.split("::")[0] for arg in args if arg.startswith("tests/")]
    missing = [path for path in named if not (REPO / path).exists()]
    assert not missing, f"{what}: no such test path: {missing}"


def check_python(args: list[str], what: str) -> None:
    if args[:2] == ["-m", "widenet_ds.train"]:
        check_task(args[2], args[3:], what)
    elif args[:2] == ["-m", "pytest"]:
        check_test_paths(args[2:], what)
    elif args[:1] == ["-m"]:
        with _argv([args[1], *args[2:]]):
            _parse_with(lambda: runpy.run_module(args[1], run_name="__main__", alter_sys=True), what)
    else:
        script = REPO / args[0]
        assert script.is_file(), f"{what}: no such script"
        with _argv([str(script), *args[1:]], path=script.parent):
            _parse_with(lambda: runpy.run_path(str(script), run_name="__main__"), what)


@contextlib.contextmanager
def _argv(argv: list[str], path: Path | None = None):
    """sys.argv as the program sees it, and a script's folder first on sys.path, as `python SCRIPT` puts it."""
    saved = sys.argv, list(sys.path)
    sys.argv = argv
    if path is not None:
        sys.path.insert(0, str(path))
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved


def check_deepspeed(args: list[str], what: str) -> None:
    from deepspeed.launcher.runner import parse_args

    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            ds = parse_args(args)
        except SystemExit:
            raise AssertionError(f"{what}: refused by DeepSpeed's runner: {err.getvalue().strip()}") from None
    if ds.module:
        assert ds.user_script == "widenet_ds.train", f"{what}: --module of another program"
        check_task(ds.user_args[0], ds.user_args[1:], what)
    else:
        assert ds.user_script in SCRIPT_TASKS, f"{what}: a script this file cannot check"
        check_task(SCRIPT_TASKS[ds.user_script], ds.user_args, what)


def check_launcher(args: list[str], what: str) -> None:
    name, rest = (args[0], args[1:]) if args else ("", [])
    if name == "setup" and rest[:1] == ["--gpu"]:  # its options and op names: tests/integration/test_gpu_page.py
        assert all(re.fullmatch(r"--prebuild-ops(=[a-z_]+(,[a-z_]+)*)?", arg) for arg in rest[1:]), what
    elif name in ("", "setup", "-h", "--help", "help"):
        assert not rest, what
    elif name == "test":
        check_test_paths([arg for arg in rest if arg != "--fast"], what)
    elif name in LAUNCHER_ALIASES:
        check_launch([LAUNCHER_ALIASES[name], *rest], what)
    else:
        check_widenet_ds(args, what)


def check(command: list[str], what: str) -> None:
    while command and re.fullmatch(r"[A-Za-z_]\w*=.*", command[0]):  # VAR=value before the program
        command = command[1:]
    if command[:1] == ["nice"]:
        command = command[3:] if command[1:2] == ["-n"] else command[1:]
    program, args = Path(command[0]).name, command[1:]
    if program in ("srun", "mpiexec"):  # their own options, then the program they start
        start = next(i for i, arg in enumerate(args) if Path(arg).name.startswith("python"))
        program, args = Path(args[start]).name, args[start + 1:]
    if program == "launcher.sh":
        check_launcher(args, what)
    elif program == "widenet-ds":
        check_widenet_ds(args, what)
    elif program == "deepspeed":
        check_deepspeed(args, what)
    elif program in ("python", "python3"):
        check_python(args, what)
    elif program == "sbatch":
        script = next(i for i, arg in enumerate(args) if arg.endswith(".sbatch"))
        assert args[script] == "slurm/train.sbatch", f"{what}: a batch script this file cannot check"
        assert not any(arg.startswith("--output-dir") for arg in args), f"{what}: the script refuses --output-dir"
        check_task(args[script + 1], [*args[script + 2:], *SBATCH_ADDS], what)
    else:
        raise AssertionError(f"{what}: a program this file cannot check")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_command_of_the_page_parses(page):
    problems = []
    for command in commands(page):
        for part in words(command):
            try:
                check(part, f"{page.relative_to(REPO)}: `{shlex.join(part)}`")
            except AssertionError as err:
                problems.append(str(err))
    assert not problems, "\n".join(problems)


def test_the_checker_refuses_what_the_parsers_refuse():
    """The check has teeth: a misspelt option, a task option before `--`, an unknown task and a command of no
    known program each fail."""
    bad = [".venv/bin/widenet-ds launch pretrain -- --data d --output-dir o --deepspeed_config c --max-stepz 3",
           ".venv/bin/widenet-ds launch pretrain --data d -- --output-dir o --deepspeed_config c",
           ".venv/bin/widenet-ds convert to-hff a b",
           ".venv/bin/deepspeed --num_gpus 2 --module widenet_ds.train pretrainn --data d",
           "sbatch slurm/train.sbatch glue --glue-task sst2 --data d --deepspeed_config c --output-dir o",
           "./launcher.sh test tests/no_such_test.py",
           "rm -rf runs"]
    for command in bad:
        with pytest.raises(AssertionError):
            for part in words(command):
                check(part, command)
    check(words(".venv/bin/widenet-ds launch glue --config runs/x -- --resume")[0], "a good one")


def test_a_loop_is_its_body_once_per_value(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```bash\nfor v in a b; do\n  run --x $v \\\n      --y ${v}\ndone\nlast\n```\n")
    assert commands(page) == ["run --x a --y a", "run --x b --y b", "last"]


def test_readme_names_every_program_by_the_set_ups_path():
    listed = commands(README)
    assert len(listed) > 5
    bare = [c for c in listed if not c.startswith(("./launcher.sh ", ".venv/bin/"))]
    assert not bare, f"commands that PATH would resolve (or not): {bare}"
    # DeepSpeed's launcher starts one rank on a CPU machine unless told how many: every call says it
    assert not [c for c in listed if c.startswith(".venv/bin/deepspeed ") and "--num_gpus" not in c]


@pytest.mark.parametrize("page", [p for p in PAGES if p != README and commands(p)],
                         ids=lambda page: str(page.relative_to(REPO)))
def test_a_page_with_commands_says_at_its_top_how_the_venvs_commands_are_reached(page):
    text = page.read_text()
    assert VENV_LINE in text[:text.index("```bash")], f"{page.name}: say `{VENV_LINE}` before its first command"


@pytest.mark.parametrize("command", CHEAP)
def test_the_cheap_commands_run_as_written(command):
    assert [command.split()] in [words(listed) for listed in commands(README)]
    if not (REPO / ".venv/bin/widenet-ds").is_file():
        pytest.skip(f"no .venv in {REPO} (WIDENET_VENV elsewhere): the README's paths are the default set-up's")
    proc = subprocess.run(command, shell=True, cwd=REPO, env=child_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "widenet-base-e8" in proc.stdout  # the preset the docs' GPU commands train


def test_requires_python_caps_only_what_is_known_to_break():
    """`>=3.11,<3.12` refused every newer Python that torch and DeepSpeed support; nothing above 3.11 is known to
    break (the README says where 3.11 is still needed: the package mirror's torch wheel)."""
    import tomllib

    spec = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert spec == ">=3.11"
    assert "tested on 3.11 only" in README.read_text()
