"""The report's PNG plots (widenet_ds/report/plots.py) of run folders built here: one file per series some run
logged (none for a series no run has), each a real image, heatmaps with a panel per routed block, file names
that stay apart for runs of the same name."""

from __future__ import annotations

from PIL import Image

from widenet_ds.report.metrics import load_runs
from widenet_ds.report.plots import draw_all, slug

from tests.support.run_folders import finetune_folder, image_folder, pretrain_folder, routed, write_jsonl


def sizes(folder, names) -> dict[str, tuple[int, int]]:
    """name -> (width, height) of each PNG, checked to be a drawn image."""
    out = {}
    for name in names:
        with Image.open(folder / name) as image:
            assert image.format == "PNG", name
            colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
            assert colours is None or len(colours) > 20, f"{name} looks blank"
            out[name] = image.size
    return out


def test_a_plot_for_each_series_some_run_logged_and_none_for_the_rest(tmp_path):
    runs, _ = load_runs([pretrain_folder(tmp_path / "pre"), image_folder(tmp_path / "img"),
                         finetune_folder(tmp_path / "ft")])
    out = tmp_path / "out"
    out.mkdir()
    plots = draw_all(runs, out)
    # pretraining logged train/mlm_loss, optim/lr and drops, its final evaluation held-out MLM and SOP losses (no
    # train/sop_loss: the held-out curve alone); the image run train and test accuracy; no run logged throughput
    # or balance loss
    assert [(p.file, p.section) for p in plots] == [
        ("mlm_loss.png", "pretrain"), ("sop_loss.png", "pretrain"), ("lr.png", "pretrain"),
        ("dropped_fraction.png", "pretrain"), ("image_accuracy.png", "classify"), ("expert_load_pre.png", "experts"),
        ("accuracy_by_branches.png", "branches"), ("mlm_loss_by_branches.png", "branches"),
        ("finetune_loss.png", "finetune")]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.file for p in plots)
    drawn = sizes(out, [p.file for p in plots])
    assert all(width >= 600 and height >= 300 for width, height in drawn.values()), drawn
    assert plots[5].title == "Expert load: pre" and "dashed" in plots[0].caption


def test_the_heatmap_has_a_panel_per_routed_block(tmp_path):
    one = tmp_path / "one"
    write_jsonl(one / "metrics.jsonl", [routed(s, [[0.5, 0.5]], [0.0]) for s in (1, 2, 3)])
    four = tmp_path / "four"
    write_jsonl(four / "metrics.jsonl", [routed(s, [[0.5, 0.5]] * 4, [0.0] * 4) for s in (1, 2, 3)])
    out = tmp_path / "out"
    out.mkdir()
    plots = draw_all(load_runs([one, four])[0], out)
    heatmaps = sizes(out, ["expert_load_one.png", "expert_load_four.png"])
    assert heatmaps["expert_load_four.png"][1] > heatmaps["expert_load_one.png"][1] + 100
    assert {p.file for p in plots if p.section == "experts"} == {"expert_load_one.png", "expert_load_four.png"}


def test_runs_of_one_name_get_their_own_heatmap_files(tmp_path):
    folders = [tmp_path / group / "run" for group in ("a b", "a&b")]
    for folder in folders:
        write_jsonl(folder / "metrics.jsonl", [routed(s, [[0.5, 0.5]], [0.0]) for s in (1, 2)])
    out = tmp_path / "out"
    out.mkdir()
    runs = load_runs(folders)[0]
    assert [r.name for r in runs] == ["a b/run", "a&b/run"]
    assert slug("a b/run") == slug("a&b/run") == "a-b-run" and slug("///") == "run"
    plots = [p for p in draw_all(runs, out) if p.section == "experts"]
    assert [(p.file, p.title) for p in plots] == [("expert_load_a-b-run.png", "Expert load: a b/run"),
                                                  ("expert_load_a-b-run_2.png", "Expert load: a&b/run")]
    sizes(out, [p.file for p in plots])


def test_a_legend_of_many_runs_goes_beside_the_axes(tmp_path):
    """7 runs with a held-out curve each: 14 legend entries widen the figure; 3 runs' 6 stay inside it."""
    folders = [write_jsonl(tmp_path / f"run{i}" / "metrics.jsonl", [
        {"step": 1, "train/mlm_loss": 9.0 - i}, {"step": 2, "train/mlm_loss": 8.0 - i, "valid/mlm_loss": 8.5 - i}]
    ).parent for i in range(7)]
    runs = load_runs(folders)[0]
    widths = []
    for count in (3, 7):
        out = tmp_path / f"out{count}"
        out.mkdir()
        assert [p.file for p in draw_all(runs[:count], out)] == ["mlm_loss.png"]
        widths.append(sizes(out, ["mlm_loss.png"])["mlm_loss.png"][0])
    assert widths[1] >= widths[0] + 200, widths
