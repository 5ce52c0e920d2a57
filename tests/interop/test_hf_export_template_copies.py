"""The HF mirror against our model: `# Copied from` marks, checked as transformers checks its (utils/check_copies.py).

`convert to-hf` ships the files of hf_export.TEMPLATE (hf_template/) into every HF folder: our model written again for
one device, importable by transformers without widenet_ds. Each of its top-level classes and functions says, in a
comment right above it (above its decorators), which block of ours it mirrors:

    # Copied from widenet_ds.model.widenet.FactorizedEmbeddings with cfg->config, ModelConfig->WideNetConfig
        our block, renamed: both sources without docstrings and comments (ast.unparse), the renames applied to ours
        as whole words in order, must be equal; a rename that matches nothing in ours is an error too
    # Adapted from widenet_ds.model.moe.MoEFeedForward: how it differs
        a re-implementation: the block named must exist, and the reason be given; test_hf_export.py's parity tests
        hold the two to the same numbers
    # Mirror only: why
        transformers' plumbing, no block of ours

A mark may go on over the comment lines that follow it. A method may carry a mark of its own (inside an Adapted
class, the methods that are copies do). Marks name blocks by dotted path (`widenet_ds.<package>.<module>.<Name>
[.<method>]`), resolved to source files under the repository and read with ast, never imported.
"""

from __future__ import annotations

import ast
import copy
import difflib
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import widenet_ds
from widenet_ds.interop.hf_export import TEMPLATE

MIRROR = TEMPLATE  # the mirror's folder: named once, by the exporter that ships it
ROOT = Path(widenet_ds.__file__).resolve().parents[1]  # where `widenet_ds.model.widenet` is widenet_ds/model/widenet.py
MIRROR_MODULE = ".".join(MIRROR.relative_to(ROOT).parts)  # a mark never names the mirror's own blocks
KINDS = ("Copied from", "Adapted from", "Mirror only")
MARK = re.compile(rf"^\s*#\s*({'|'.join(KINDS)})\b\s*(.*)$")
COPIED = re.compile(r"^(?P<target>widenet_ds(?:\.\w+)+)(?:\s+with\s+(?P<renames>\S.*))?$")
ADAPTED = re.compile(r"^(?P<target>widenet_ds(?:\.\w+)+):\s*(?P<reason>\S.*)$")
RENAME = re.compile(r"^(?P<old>\w+(?:\.\w+)*)->(?P<new>\w+(?:\.\w+)*)$")
Definition = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class Block:
    """A class or function of the mirror and the mark above it (kind None: unmarked)."""

    file: Path
    name: str                  # dotted inside its file: "WideNetMoE.route"
    node: Definition = field(repr=False)
    top_level: bool
    kind: str | None = None    # one of KINDS
    text: str = ""             # what follows the kind: target, renames, reason
    mark_lines: tuple[int, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.file.name}:{self.node.lineno} {self.name}"


def _definitions(body: list[ast.stmt]) -> list[Definition]:
    return [node for node in body if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]


def _mark_above(node: Definition, lines: list[str]) -> tuple[str | None, str, tuple[int, ...]]:
    """The mark in the comment lines right above the block (its decorators included), with its continuation lines."""
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    comments, number = [], first - 1
    while number >= 1 and lines[number - 1].strip().startswith("#"):
        comments.insert(0, number)
        number -= 1
    for i, line_number in enumerate(comments):
        match = MARK.match(lines[line_number - 1])
        if match:
            rest = [lines[n - 1].strip().lstrip("#").strip() for n in comments[i + 1:]]
            return match[1], " ".join([match[2].strip(), *rest]).strip(), tuple(comments[i:])
    return None, "", ()


def mirror_blocks(mirror: Path) -> list[Block]:
    """Every top-level class and function of the mirror's files and every method of those classes, with its mark."""
    blocks = []
    for path in sorted(mirror.glob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for node in _definitions(ast.parse(source).body):
            members = _definitions(node.body) if isinstance(node, ast.ClassDef) else []
            for member, name, top in [(node, node.name, True)] + [(m, f"{node.name}.{m.name}", False) for m in members]:
                blocks.append(Block(path, name, member, top, *_mark_above(member, lines)))
    return blocks


def resolve(target: str, root: Path) -> tuple[Definition, Path] | str:
    """The class or function a dotted path names, read from its module's source file; else why not."""
    if target.startswith(MIRROR_MODULE + "."):
        return f"{target} is in the mirror itself; name the block of ours it mirrors"
    parts = target.split(".")
    if root.joinpath(*parts).with_suffix(".py").is_file():
        return f"{target} names a module; name the class or function in it"
    for cut in range(len(parts) - 1, 0, -1):
        path = root.joinpath(*parts[:cut]).with_suffix(".py")
        if path.is_file():
            break
    else:
        return f"{target} names no module under {root}"
    body: list[ast.stmt] = ast.parse(path.read_text()).body
    node = None
    for name in parts[cut:]:
        node = next((d for d in _definitions(body) if d.name == name), None)
        if node is None:
            return f"{target} names no block: {path.relative_to(root)} has no {'.'.join(parts[cut:])}"
        body = node.body
    return node, path


def normalised(node: Definition, renames: list[tuple[str, str]] = ()) -> str:
    """The block's source without docstrings and comments, in ast.unparse's layout, with `renames` applied (whole
    words, in order)."""
    node = copy.deepcopy(node)
    for inner in ast.walk(node):
        if isinstance(inner, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and inner.body \
                and isinstance(inner.body[0], ast.Expr) and isinstance(inner.body[0].value, ast.Constant) \
                and isinstance(inner.body[0].value.value, str):
            inner.body = inner.body[1:] or [ast.Pass()]
    text = ast.unparse(node)
    for old, new in renames:
        text = re.sub(rf"(?<!\w){re.escape(old)}(?!\w)", new, text)
    return text


def parse_renames(text: str) -> list[tuple[str, str]] | str:
    renames = []
    for item in text.split(","):
        match = RENAME.match(item.strip())
        if not match:
            return f"rename {item.strip()!r} is not Old->New"
        renames.append((match["old"], match["new"]))
    return renames


def copy_problems(block: Block, root: Path) -> list[str]:
    """Why a "Copied from" block is not its original, renamed (a unified diff), or why its mark is unreadable."""
    match = COPIED.match(block.text)
    if not match:
        return [f"{block.where}: '# Copied from {block.text}' is not 'widenet_ds.<module>.<Name> [with Old->New, ...]'"]
    found = resolve(match["target"], root)
    if isinstance(found, str):
        return [f"{block.where}: {found}"]
    original, path = found
    renames = parse_renames(match["renames"]) if match["renames"] else []
    if isinstance(renames, str):
        return [f"{block.where}: {renames}"]
    problems = []
    theirs = normalised(original)
    for old, new in renames:
        if not re.search(rf"(?<!\w){re.escape(old)}(?!\w)", theirs):
            problems.append(f"{block.where}: rename {old}->{new} matches nothing in {match['target']}")
    expected, actual = normalised(original, renames), normalised(block.node)
    if expected != actual:
        diff = difflib.unified_diff(expected.splitlines(), actual.splitlines(), lineterm="",
                                    fromfile=f"{match['target']} ({path.relative_to(root)}, renamed)",
                                    tofile=f"{block.file.name} {block.name}")
        problems.append(f"{block.where} is no longer a copy of {match['target']}:\n" + "\n".join(diff))
    return problems


def mark_problems(mirror: Path, root: Path) -> list[str]:
    """Unmarked top-level blocks, marks attached to no block, Adapted marks without a target or a reason."""
    blocks = mirror_blocks(mirror)
    problems = [f"{b.where} carries no mark: say above it '# Copied from widenet_ds...', '# Adapted from "
                f"widenet_ds...: <how it differs>' or '# Mirror only: <why>'"
                for b in blocks if b.top_level and not b.kind]
    attached = {(b.file, line) for b in blocks for line in b.mark_lines[:1]}
    for path in sorted(mirror.glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if MARK.match(line) and (path, number) not in attached:
                problems.append(f"{path.name}:{number}: a mark that stands above no class or function: {line.strip()}")
    for block in blocks:
        if block.kind == "Adapted from":
            match = ADAPTED.match(block.text)
            if not match:
                problems.append(f"{block.where}: '# Adapted from {block.text}' is not 'widenet_ds.<module>.<Name>: "
                                f"<how it differs>'")
            elif isinstance(found := resolve(match["target"], root), str):
                problems.append(f"{block.where}: {found}")
        elif block.kind == "Mirror only" and not block.text.lstrip(":").strip():
            problems.append(f"{block.where}: '# Mirror only' says not why")
    return problems


def problems(mirror: Path = MIRROR, root: Path = ROOT) -> list[str]:
    """Everything the check finds: the marks, then every copy against its original."""
    found = mark_problems(mirror, root)
    for block in mirror_blocks(mirror):
        if block.kind == "Copied from":
            found += copy_problems(block, root)
    return found


COPIES = [b for b in mirror_blocks(MIRROR) if b.kind == "Copied from"]


# --- the mirror as it is --------------------------------------------------------------------------------
@pytest.mark.parametrize("block", COPIES, ids=[b.name for b in COPIES])
def test_every_copy_is_still_its_original(block):
    found = copy_problems(block, ROOT)
    assert not found, "\n".join(found)


def test_every_block_of_the_mirror_is_marked_and_every_mark_names_a_block_of_ours():
    found = mark_problems(MIRROR, ROOT)
    assert not found, "\n".join(found)
    assert {b.file.name for b in mirror_blocks(MIRROR)} == {"configuration_widenet.py", "modeling_widenet.py",
                                                            "image_processing_widenet.py"}
    assert len(COPIES) >= 8  # the copies' test is not parametrised over nothing


def test_the_mirror_imports_nothing_of_widenet_ds():
    """A mark names our blocks in a comment; the code stays self-contained (transformers loads it alone)."""
    for path in MIRROR.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        assert not {name for name in imported if name.split(".")[0] == "widenet_ds"}, path.name


# --- the check catches drift ------------------------------------------------------------------------------
def _mirror_copy(tmp_path: Path) -> Path:
    return Path(shutil.copytree(MIRROR, tmp_path / "mirror", ignore=shutil.ignore_patterns("__pycache__")))


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {path}"
    path.write_text(text.replace(old, new))


def _new(before: list[str], after: list[str]) -> list[str]:
    """The problems an edit added (line numbers aside), so that these tests hold whatever state the tree is in."""
    def key(problem: str) -> str:
        return re.sub(r"^([\w.]+\.py):\d+", r"\1", problem)
    return [problem for problem in after if key(problem) not in {key(b) for b in before}]


def test_a_copy_that_drifts_fails_with_the_diff(tmp_path):
    mirror = _mirror_copy(tmp_path)
    before = problems(mirror)
    # Dropout after the projection instead of before it: one line of FactorizedEmbeddings.forward.
    _edit(mirror / "modeling_widenet.py", "return self.projection(self.dropout(self.norm(x)))",
          "return self.dropout(self.projection(self.norm(x)))")
    [problem] = _new(before, problems(mirror))
    assert "FactorizedEmbeddings is no longer a copy of widenet_ds.model.widenet.FactorizedEmbeddings" in problem
    assert "-        return self.projection(self.dropout(self.norm(x)))" in problem
    assert "+        return self.dropout(self.projection(self.norm(x)))" in problem


def test_a_copied_method_inside_an_adapted_class_that_drifts_fails(tmp_path):
    mirror = _mirror_copy(tmp_path)
    before = problems(mirror)
    _edit(mirror / "modeling_widenet.py", "return task_loss + self.config.balance_loss_weight * balance",
          "return task_loss + balance")
    [problem] = _new(before, problems(mirror))
    assert problem.startswith("modeling_widenet.py:")
    assert "WideNetPreTrainedModel._total_loss is no longer a copy of widenet_ds.model.base.EncoderModel" in problem


def test_an_original_that_drifts_fails(tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "widenet_ds", root / "widenet_ds", ignore=shutil.ignore_patterns("__pycache__"))
    before = problems(MIRROR, root)
    _edit(root / "widenet_ds" / "model" / "routing.py", "high = torch.tensor(1.0 - info.eps, device=device)",
          "high = torch.tensor(1.0 - 2 * info.eps, device=device)")
    [problem] = _new(before, problems(MIRROR, root))
    assert "gumbel_noise is no longer a copy of widenet_ds.model.routing.gumbel_noise" in problem
    assert "-    high = torch.tensor(1.0 - 2 * info.eps, device=device)" in problem


def test_docstrings_comments_and_layout_do_not_count_but_renames_must_be_whole_and_used(tmp_path):
    mirror = _mirror_copy(tmp_path)
    before = problems(mirror)
    # FeedForward.forward with a docstring, a comment and the same call over three lines.
    line = "        return self.fc_out(F.gelu(self.fc_in(x), approximate=self.approximate))"
    _edit(mirror / "modeling_widenet.py", line, '''        """Another docstring."""
        # a comment
        return self.fc_out(
            F.gelu(self.fc_in(x), approximate=self.approximate)
        )''')
    assert _new(before, problems(mirror)) == []
    _edit(mirror / "modeling_widenet.py", "# Copied from widenet_ds.model.moe.FeedForward\n",
          "# Copied from widenet_ds.model.moe.FeedForward with fc->layer\n")  # `fc` is no whole word there
    [problem] = _new(before, problems(mirror))
    assert problem.endswith(" FeedForward: rename fc->layer matches nothing in widenet_ds.model.moe.FeedForward")
    names = [("cfg", "config")]
    assert normalised(ast.parse("def f(cfg, cfgs):\n    return cfg.x + cfgs").body[0], names) == \
        "def f(config, cfgs):\n    return config.x + cfgs"


def test_a_new_block_without_a_mark_fails(tmp_path):
    mirror = _mirror_copy(tmp_path)
    before = problems(mirror)
    with (mirror / "modeling_widenet.py").open("a") as file:
        file.write("\n\ndef helper(x: Tensor) -> Tensor:\n    return x\n")
    [problem] = _new(before, problems(mirror))
    assert problem.startswith("modeling_widenet.py:") and "helper carries no mark" in problem


def test_marks_that_name_nothing_or_stand_nowhere_fail(tmp_path):
    mirror = _mirror_copy(tmp_path)
    before = problems(mirror)
    path = mirror / "modeling_widenet.py"
    _edit(path, "# Adapted from widenet_ds.model.moe.MoEFeedForward: a router",
          "# Adapted from widenet_ds.model.moe.SharedMoE: a router")
    _edit(path, "# Copied from widenet_ds.model.routing.gumbel_noise\n", "# Copied from widenet_ds.model.routing\n")
    _edit(path, "# Copied from widenet_ds.model.routing.multiplicative_jitter\n",
          f"# Copied from {MIRROR_MODULE}.modeling_widenet.multiplicative_jitter\n")
    _edit(path, "        hidden_states, routings, routing = [x], [], None\n",
          "        # Copied from widenet_ds.model.widenet.WideNetEncoder.forward\n"
          "        hidden_states, routings, routing = [x], [], None\n")
    found = _new(before, problems(mirror))
    assert len(found) == 4, found
    assert "a mark that stands above no class or function: # Copied from widenet_ds.model.widenet" in found[0]
    assert "WideNetMoE: widenet_ds.model.moe.SharedMoE names no block: widenet_ds/model/moe.py has no SharedMoE" \
        in found[1]
    assert "gumbel_noise: widenet_ds.model.routing names a module; name the class or function in it" in found[2]
    assert f"multiplicative_jitter: {MIRROR_MODULE}.modeling_widenet.multiplicative_jitter is in the " \
        "mirror itself" in found[3]
