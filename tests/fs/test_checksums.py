"""File records: every file of a folder with its size and SHA-256, and each way a file can differ later."""

from __future__ import annotations

import hashlib

from widenet_ds.fs.checksums import file_problems, file_sha256, record_files, total_size


def test_records_name_every_file_and_each_kind_of_damage(tmp_path):
    (tmp_path / "sub").mkdir()
    for name, data in {"a.pt": b"a" * 1000, "b.pt": b"b" * 10, "sub/c.json": b"{}", "marker.json": b"{}"}.items():
        (tmp_path / name).write_bytes(data)
    records = record_files(tmp_path, skip=("marker.json",))
    assert sorted(records) == ["a.pt", "b.pt", "sub/c.json"]
    assert records["a.pt"] == {"size": 1000, "sha256": hashlib.sha256(b"a" * 1000).hexdigest()}
    assert total_size(records) == 1012 and file_sha256(tmp_path / "b.pt") == records["b.pt"]["sha256"]
    assert file_problems(tmp_path, records) == []

    (tmp_path / "a.pt").write_bytes(b"a" * 500)       # truncated
    (tmp_path / "b.pt").write_bytes(b"B" * 10)        # same size, other bytes
    (tmp_path / "sub" / "c.json").unlink()            # gone
    problems = file_problems(tmp_path, records)
    assert problems == [f"{tmp_path / 'a.pt'}: 500 bytes, written with 1,000 (truncated)",
                        f"{tmp_path / 'b.pt'}: content differs from what was written (SHA-256)",
                        f"{tmp_path / 'sub/c.json'}: missing"]
