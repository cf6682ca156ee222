from pypto_testing.folders import folder_bytes


def test_any_change_under_the_folder_changes_the_snapshot(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "sub" / "b.bin").write_bytes(b"\0\1")
    before = folder_bytes(tmp_path)
    assert before == {"a.json": b"{}", "sub/b.bin": b"\0\1"}
    assert folder_bytes(tmp_path) == before
    (tmp_path / "sub" / "b.bin").write_bytes(b"\0\2")
    assert folder_bytes(tmp_path) != before
    (tmp_path / "sub" / "b.bin").write_bytes(b"\0\1")
    (tmp_path / "sub" / "b.bin").rename(tmp_path / "sub" / "c.bin")
    assert folder_bytes(tmp_path) != before
