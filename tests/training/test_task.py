"""The one task protocol (widenet_ds/training/task.py), read off the code that drives it: the planner, the loop and
the finetuning sweep call only hooks `Task` declares, and none of them sets an attribute of a task from outside (every
task implements every hook `Task` leaves abstract: tests/run/test_trainers.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from widenet_ds.training.task import Task

PACKAGE = Path(__file__).resolve().parents[2] / "widenet_ds"
# The modules that drive a task, and the names a task goes by in them.
DRIVERS = {"training/plan.py": {"task"}, "training/trainer.py": {"task"}, "run/sweep.py": {"task", "first"},
           "run/trainers.py": {"task"}}


def task_uses(source: str, names: set[str]) -> tuple[set[str], list[str]]:
    """(attributes read of a task, attributes assigned on one) in `source`: `task.x` where `task` is one of
    `names` (a variable or `self.task`)."""
    read, assigned = set(), []

    def is_task(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in names) or (
            isinstance(node, ast.Attribute) and node.attr in names and isinstance(node.value, ast.Name)
            and node.value.id == "self")

    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and is_task(target.value):
                assigned.append(target.attr)
        if isinstance(node, ast.Attribute) and is_task(node.value) and isinstance(node.ctx, ast.Load):
            read.add(node.attr)
    return read, assigned


def declared() -> set[str]:
    """What `Task` declares: its methods and properties, and its annotated attributes (METRICS, RESULTS, plan...)."""
    return {name for name in dir(Task) if not name.startswith("__")} | set(Task.__annotations__) | {
        "cfg", "folder", "init_source"}  # set by Task.__init__


@pytest.mark.parametrize("module", sorted(DRIVERS))
def test_the_drivers_use_only_what_task_declares_and_set_nothing_of_it(module):
    read, assigned = task_uses((PACKAGE / module).read_text(), DRIVERS[module])
    undeclared = sorted(read - declared())
    assert not undeclared, f"{module} calls {undeclared} on a task, which training/task.py does not declare"
    assert not assigned, f"{module} sets {assigned} on a task from outside (pass it in instead)"


def test_the_check_catches_an_undeclared_hook_and_an_assignment():
    read, assigned = task_uses("def plan(task):\n    task.plan = 1\n    return task.prepare_twice()\n", {"task"})
    assert read - declared() == {"prepare_twice"} and assigned == ["plan"]
