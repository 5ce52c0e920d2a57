"""The report's HTML: one page, inline CSS, no script and nothing fetched from outside; the plots are
PNG files beside it (`<img src="name.png">`), so the folder is the report: copy or serve it as a whole.

(Named `page`, not `html`, so that `import html` keeps meaning the standard library's module.)
Every number in a table carries `data-run`, `data-row` and `data-key` attributes naming where it came
from (the run, the seed or step, the metrics key), so that a reader or a test can check it.
"""

from __future__ import annotations

import html
import os
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from widenet_ds.report.branches import BranchCurve, branch_curves, by_measure, widest
from widenet_ds.report.metrics import FinetuneRun, ImageRun, LoggedRun, PretrainRun, Problem, Run
from widenet_ds.report.plots import Plot
from widenet_ds.results import is_number, numbers
from widenet_ds.run_folder import RESULTS_FILE

PRETRAIN_COLUMNS = (
    ("train/mlm_loss", "train MLM loss"), ("valid/mlm_loss", "held-out MLM loss"),
    ("train/mlm_accuracy", "train MLM acc"), ("train/sop_loss", "train SOP loss"),
    ("valid/sop_loss", "held-out SOP loss"), ("train/sop_accuracy", "train SOP acc"),
    ("train/balance_loss", "balance loss"), ("optim/lr", "learning rate"),
    ("perf/tokens_per_second", "tokens/s"),
)
IMAGE_COLUMNS = (
    ("train/accuracy", "train accuracy"), ("test/accuracy", "test accuracy"), ("train/task_loss", "train loss"),
    ("test/task_loss", "test loss"), ("train/balance_loss", "balance loss"), ("optim/lr", "learning rate"),
    ("optim/grad_norm", "grad norm"), ("perf/samples_per_second", "images/s"), ("data/epoch", "epoch"),
)
# results.json of an image run: (key, label); the text fields are shown as they are
IMAGE_RESULTS = (("test/accuracy", "test accuracy"), ("test/task_loss", "test loss (cross-entropy)"),
                 ("test/balance_loss", "test balance loss"), ("parameters", "trainable parameters"),
                 ("step", "steps"))

CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2em auto; max-width: 1150px;
       padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 1.6em; }
.meta { color: #666; font-size: 0.9em; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.median td { font-weight: 600; } tr.baseline td { color: #777; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(540px, 1fr)); gap: 0 1.5em; }
figure { margin: 1em 0 1.5em; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { color: #555; font-size: 0.9em; margin-top: 0.3em; }
.problems { background: #fff4f0; border: 1px solid #e8a08a; padding: 0.6em 1em; }
.notes { color: #8a5a00; font-size: 0.9em; margin: 0; padding-left: 1.2em; }
code { background: #f5f5f5; padding: 0 0.2em; }
"""


@dataclass(frozen=True)
class PagePaths:
    """How the page shows a path: relative to the folder holding every run on it (`root`), never as this machine's
    path (a report is copied and shared); a path outside that folder by its last parts."""

    root: Path

    @classmethod
    def of(cls, runs: list[Run], problems: list[Problem]) -> PagePaths:
        folders = [Path(os.path.abspath(r.path)) for r in runs] + [Path(os.path.abspath(p.path)) for p in problems]
        if not folders:
            return cls(Path.cwd())
        root = Path(os.path.commonpath(folders))
        return cls(root.parent if root in folders else root)  # a run itself is shown by its name

    def show(self, path: str | Path) -> str:
        absolute = Path(os.path.abspath(path))
        if absolute.is_relative_to(self.root) and absolute != self.root:
            return str(absolute.relative_to(self.root))
        return str(Path("…", *absolute.parts[-3:]))

    def in_text(self, text: str) -> str:
        """A message naming files under the runs' folder (a problem's): those paths relative to it, as `show` writes."""
        return text.replace(f"{self.root}{os.sep}", "")

    def init(self, init: str | None) -> str:
        """A finetuning run's start: its checkpoint shown as a path, a preset as it is."""
        return "?" if init is None else init if init.startswith("preset:") else self.show(init)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def fmt(value: object) -> str:
    """A number as shown in the tables (a reader parsing it back gets the value to 4 decimals or 4
    significant digits)."""
    if not is_number(value):  # missing, or not a number in a file edited by hand
        return "–"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    value = float(value)
    if value != 0 and abs(value) < 1e-3:
        return f"{value:.3e}"
    if abs(value) >= 1000:
        return f"{value:.1f}"
    return f"{value:.4f}"


def _num(value: object, run: str, row: str, key: str) -> str:
    return (f'<td class="num" data-run="{_e(run)}" data-row="{_e(row)}" data-key="{_e(key)}">'
            f"{_e(fmt(value))}</td>")


def _notes(notes: list[str]) -> str:
    return f'<ul class="notes">{"".join(f"<li>{_e(n)}</li>" for n in notes)}</ul>' if notes else ""


def _runs_table(runs: list[Run], paths: PagePaths) -> str:
    rows = []
    for run in runs:
        if isinstance(run, PretrainRun):
            what, step = run.model_summary(), run.last_step
            state = "being written (live)" if run.live_tail else ("finished" if _finished(run) else "running or stopped")
        elif isinstance(run, ImageRun):
            what = f"{run.dataset}, {run.model_name}: {run.model_summary()}"
            step = run.last_step
            state = (f"finished ({RESULTS_FILE})" if run.finished else
                     "being written (live)" if run.live_tail else "running or stopped")
        else:
            what = f"{run.task}, init {paths.init(run.init)}" if run.results else run.task
            step = run.results.steps if run.results else max(
                (s.records[-1]["step"] for s in run.seeds if s.records), default=None)
            state = f"finished ({RESULTS_FILE})" if run.finished else "running or stopped"
        rows.append(f"<tr><td>{_e(run.name)}</td><td>{_e(run.title)}</td><td><code>{_e(paths.show(run.path))}"
                    f"</code></td><td>{_e(what)}</td>{_num(step, run.name, 'last', 'step')}<td>{_e(state)}"
                    f"{_notes(run.notes)}</td></tr>")
    return ("<table><tr><th>run</th><th>kind</th><th>folder</th><th>model / task</th><th>last step</th>"
            f"<th>state</th></tr>{''.join(rows)}</table>")


def _finished(run: PretrainRun) -> bool:
    """The trainer logs a checkpoint at its last step; a run whose last event is a save at the last logged
    step has (very likely) ended. Without it, it is running or was stopped."""
    saves = [e for e in run.events if str(e.get("event", "")).startswith("checkpoint saved")]
    return bool(saves) and saves[-1].get("step") == run.last_step and not run.live_tail


def _last_values_table(runs: list[LoggedRun], columns: tuple[tuple[str, str], ...]) -> str:
    head = "".join(f"<th>{_e(label)}</th>" for _, label in columns)
    rows = []
    for run in runs:
        cells = []
        for key, _ in columns:
            last = run.last(key)
            cells.append(_num(last[1] if last else None, run.name, f"step {last[0]}" if last else "none", key))
        rows.append(f"<tr><td>{_e(run.name)}</td>{_num(run.last_step, run.name, 'last', 'step')}{''.join(cells)}</tr>")
    return (f"<p>Last logged value of each series (train values are the mean over the last logging window).</p>"
            f"<table><tr><th>run</th><th>last step</th>{head}</tr>{''.join(rows)}</table>")


def _image_results_table(runs: list[ImageRun]) -> str:
    """What each image run scored: results.json once finished, else the last evaluation logged."""
    head = "".join(f"<th>{_e(label)}</th>" for _, label in IMAGE_RESULTS)
    rows = []
    for run in runs:
        if run.results is not None:
            r = run.results
            values = {**r.test, "parameters": r.parameters, "step": r.step}
            row, origin = "results", RESULTS_FILE
            ranks = f"{r.world_size} rank(s), ep_size {r.ep_size}"
        else:
            last = run.last("test/accuracy")
            step = last[0] if last else None
            record = next((x for x in reversed(run.records) if x["step"] == step and "test/accuracy" in x), {})
            values = {key: record.get(key) for key, _ in IMAGE_RESULTS if key != "parameters"}
            row, origin = (f"step {step}", f"last evaluation (step {step})") if last else ("none", "no evaluation yet")
            ranks = "?"
        cells = "".join(_num(values.get(key), run.name, row, key) for key, _ in IMAGE_RESULTS)
        rows.append(f"<tr><td>{_e(run.name)}</td><td>{_e(run.dataset)}</td><td>{_e(run.model_name)}</td>"
                    f"<td>{_e(ranks)}</td>{cells}<td>{_e(origin)}</td></tr>")
    return ("<table><tr><th>run</th><th>dataset</th><th>model</th><th>ranks</th>"
            f"{head}<th>from</th></tr>{''.join(rows)}</table>")


def _expert_table(run: LoggedRun) -> str:
    """The load per expert of every block at the last logged step: the numbers behind the heatmap's right edge."""
    experts = run.num_experts
    last_steps = [run.expert_load(b)[0][-1] for b in run.blocks if run.expert_load(b)[0]]
    if not last_steps:
        return ""
    step = max(last_steps)
    record = next(r for r in reversed(run.records) if r["step"] == step and any(k.startswith("moe/") for k in r))
    head = "".join(f"<th>expert {e}</th>" for e in range(experts))
    rows = []
    for block in run.blocks:
        cells = "".join(_num(record.get(f"moe/block_{block:02d}/expert_{e:02d}_load"), run.name, f"step {step}",
                             f"moe/block_{block:02d}/expert_{e:02d}_load") for e in range(experts))
        dropped = f"moe/block_{block:02d}/dropped_fraction"
        rows.append(f"<tr><td>block {block}</td>{cells}{_num(record.get(dropped), run.name, f'step {step}', dropped)}</tr>")
    return (f"<p>{_e(run.name)}, step {step}: share of each block's routes per expert, and the fraction "
            f"dropped by capacity.</p><table><tr><th>block</th>{head}<th>dropped</th></tr>{''.join(rows)}</table>")


def _branches_section(curves: list[BranchCurve], plots: list[Plot]) -> list[str]:
    """Per measure, a row per run and a column per number of branches kept, then the plot."""
    body = ["<h2>ParaFormer compression: the first k branches</h2>",
            "<p>Each model cut to its first k branches, without retraining (what <code>compress --branches k"
            "</code> exports).</p>"]
    for measure, group in by_measure(curves):
        ks = range(1, widest(group) + 1)
        head = "".join(f"<th>k = {k}</th>" for k in ks)
        rows = "".join(f"<tr><td>{_e(c.run)}</td>" + "".join(_num(c.values.get(k), c.run, c.source, measure.key(k))
                                                             for k in ks) + "</tr>" for c in group)
        body.append(f"<h3>{_e(measure.label.capitalize())}</h3><table><tr><th>run</th>{head}</tr>{rows}</table>")
        body += [_figure(p) for p in plots if p.section == "branches" and p.file == measure.plot_file]
    return body


def _finetune_section(run: FinetuneRun, paths: PagePaths) -> str:
    per_seed = run.per_seed_metrics()
    columns = sorted({f"{split}/{metric}" for metrics in per_seed.values() for split, values in metrics.items()
                      for metric in values})
    parts = [f"<h3>{_e(run.name)}: {_e(run.task)}</h3>", _notes(run.notes)]
    if run.results:
        r = run.results
        ds = r.deepspeed
        parts.append(f"<p>init <code>{_e(paths.init(run.init))}</code>; {_e(r.steps)} steps; {_e(r.seeds)} "
                     f"seed(s); primary metric <b>{_e(r.primary_metric)}</b>; batch "
                     f"{_e(ds and ds.train_batch_size)}, peak lr {_e(ds and ds.lr)}; max length "
                     f"{_e(r.max_seq_length)}.</p>")
    if not columns:
        parts.append("<p>No evaluation logged yet.</p>")
        return "".join(parts)
    head = "".join(f"<th>{_e(c)}{_scale(run, c)}</th>" for c in columns)

    def row(label: str, row_id: str, values: dict[str, dict[str, float]], cls: str = "") -> str:
        cells = "".join(_num(values.get(c.split("/")[0], {}).get(c.split("/", 1)[1]), run.name, row_id, c)
                        for c in columns)
        return f'<tr class="{cls}"><td>{_e(label)}</td>{cells}</tr>'

    rows = []
    if run.results:
        rows.append(row(f"median of {len(per_seed)} seed(s)", "median", run.results.median, "median"))
    elif len(per_seed) > 1:
        median = {c: statistics.median(m[c.split("/")[0]][c.split("/", 1)[1]] for m in per_seed.values()
                                       if c.split("/", 1)[1] in m.get(c.split("/")[0], {})) for c in columns}
        rows.append(row(f"median of {len(per_seed)} seed(s) so far", "median",
                        _nest(median), "median"))
    for seed, metrics in sorted(per_seed.items()):
        rows.append(row(f"seed {seed}", f"seed{seed}", metrics))
    if run.results:
        numeric = numbers(run.results.baseline)
        if any(numeric.values()):
            rows.append(row("trivial baseline (majority class / empty answer)", "baseline", numeric, "baseline"))
    parts.append(f"<table><tr><th></th>{head}</tr>{''.join(rows)}</table>")
    return "".join(parts)


def _finetune_summary(runs: list[FinetuneRun], paths: PagePaths) -> str:
    """Finished runs side by side: the median of each task's primary metric, one row per initialisation (the
    checkpoint resolved: one model is one row however each run named it)."""
    finished = [r for r in runs if r.results]
    if len(finished) < 2:
        return ""
    tasks = sorted({r.task for r in finished})
    inits = list(dict.fromkeys(r.init for r in finished))
    rows = []
    for init in inits:
        cells = []
        for task in tasks:
            run = next((r for r in finished if r.task == task and r.init == init), None)
            if run is None:
                cells.append("<td></td>")
                continue
            key, value = run.results.primary_median()
            cells.append(_num(value, run.name, "median", key))
        rows.append(f"<tr><td><code>{_e(paths.init(init))}</code></td>{''.join(cells)}</tr>")
    primary = {r.task: (r, r.results.primary_median()[0]) for r in finished}
    head = "".join(f"<th>{_e(t)}{_scale(*primary[t])}</th>" for t in tasks)
    return (f"<p>Median over seeds of each task's primary metric, by initialisation.</p>"
            f"<table><tr><th>init</th>{head}</tr>{''.join(rows)}</table>")


def _scale(run: FinetuneRun, column: str) -> str:
    """A score column's scale, as the run's task gives it (SQuAD's percentages beside GLUE's fractions)."""
    scale = run.score_scale(column)
    return f" <small>({scale})</small>" if scale else ""


def _nest(flat: dict[str, float]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for key, value in flat.items():
        split, metric = key.split("/", 1)
        out.setdefault(split, {})[metric] = value
    return out


def _figure(plot: Plot) -> str:
    caption = _e(plot.caption).replace("`", "")
    return (f'<figure id="{_e(plot.file)}"><img src="{_e(plot.file)}" alt="{_e(plot.title)}">'
            f"<figcaption>{caption}</figcaption></figure>")


def render(runs: list[Run], problems: list[Problem], plots: list[Plot], title: str, sources: list[str]) -> str:
    pretrain = [r for r in runs if isinstance(r, PretrainRun)]
    images = [r for r in runs if isinstance(r, ImageRun)]
    finetune = [r for r in runs if isinstance(r, FinetuneRun)]
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    paths = PagePaths.of(runs, problems)
    body = [f"<h1>{_e(title)}</h1>",
            f'<p class="meta">widenet-ds report, {now}, of {_e(" ".join(map(paths.show, sources)))} (paths in '
            f'{_e(paths.root.name or paths.root)}/)</p>']
    if problems:
        items = "".join(f"<li><code>{_e(paths.show(p.path))}</code>: {_e(paths.in_text(p.message))}</li>" for p in problems)
        body.append(f'<div class="problems" id="problems"><b>Folders not used:</b><ul>{items}</ul></div>')
    body += ["<h2>Runs</h2>", _runs_table(runs, paths)]
    if pretrain:
        body += ["<h2>Pretraining</h2>", _last_values_table(pretrain, PRETRAIN_COLUMNS)]
        body.append('<div class="plots">' + "".join(_figure(p) for p in plots if p.section == "pretrain") + "</div>")
    if images:
        body += ['<h2 id="images">Image classification</h2>', _image_results_table(images),
                 _last_values_table(images, IMAGE_COLUMNS)]
        body.append('<div class="plots">' + "".join(_figure(p) for p in plots if p.section == "classify") + "</div>")
    moe = [r for r in pretrain + images if r.blocks]
    if moe:
        body.append("<h2>Expert load per block</h2>")
        for run in moe:
            body += [_figure(p) for p in plots if p.section == "experts" and p.title == f"Expert load: {run.name}"]
            body.append(_expert_table(run))
    curves = branch_curves(runs)
    if curves:
        body += _branches_section(curves, plots)
    if finetune:
        body += ["<h2>Finetuning</h2>", _finetune_summary(finetune, paths)]
        body += [_finetune_section(run, paths) for run in finetune]
        body += [_figure(p) for p in plots if p.section == "finetune"]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{_e(title)}</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
