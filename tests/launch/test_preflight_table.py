"""The preflight's table (launch/preflight_table.py): its columns, a failure's fix under its finding, the verdict."""

from __future__ import annotations

from widenet_ds.launch.preflight_table import failed, passed, skipped, table_lines, verdict


def test_rows_line_up_and_a_failure_names_its_nodes_and_fix_under_its_finding():
    rows = [passed("torch", "torch 2.13.0 on every node"),
            failed("DeepSpeed", "DeepSpeed 0.19.7 on node2; DeepSpeed 0.19.8 on node1", "install 0.19.8 on node2",
                   ["node2"]),
            skipped("checkpoint", "needs an output folder every node shares (above)")]
    lines = table_lines(rows)
    assert lines[0].split() == ["check", "result", "node", "found"]
    found_at = lines[0].index("found")
    assert [line[found_at:] for line in lines[1:3]] == ["torch 2.13.0 on every node",
                                                         "DeepSpeed 0.19.7 on node2; DeepSpeed 0.19.8 on node1"]
    assert lines[2].split()[:3] == ["DeepSpeed", "FAIL", "node2"] and lines[1].split()[:3] == ["torch", "ok", "-"]
    assert lines[3] == " " * found_at + "fix: install 0.19.8 on node2"
    assert lines[4].split()[:3] == ["checkpoint", "skipped", "-"]


def test_the_verdict_says_all_passed_or_which_failed_where():
    ok = [passed("torch", "x"), passed("CUDA", "y")]
    assert verdict(ok, 41.2) == "preflight: all 2 checks passed in 41 s; the job can start"
    bad = [*ok, failed("all-to-all", "rank 1 sent ...", "fix", ["node2"]), failed("start-up checks", "e", "f"),
           skipped("job's steps", "needs ...")]
    assert verdict(bad, 9) == ("preflight: 2 of 5 checks failed (all-to-all on node2; start-up checks), 1 could not "
                               "run, in 9 s; fix them and run the preflight again")
    assert not skipped("x", "y").passed and not failed("x", "y", "z").passed and passed("x", "y").passed
