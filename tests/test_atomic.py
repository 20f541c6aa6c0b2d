"""atomic_files: the one atomic writer of files and folders every floor uses."""

import os

import pytest

from atomic_files import write_file, write_folder


def test_write_file_text_and_bytes_and_a_failed_rename_leaves_nothing(tmp_path, monkeypatch):
    assert write_file(tmp_path / "a.txt", "text").read_text() == "text"
    assert write_file(tmp_path / "b.bin", b"\x00\x01").read_bytes() == b"\x00\x01"
    write_file(tmp_path / "a.txt", "new")  # replaces
    assert (tmp_path / "a.txt").read_text() == "new"

    def broken(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        write_file(tmp_path / "c.txt", "lost")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin"]


def test_write_folder_appears_whole_or_not_at_all(tmp_path):
    def fill(folder):
        (folder / "x").write_text("1")

    assert write_folder(tmp_path / "set", fill) is True
    assert write_folder(tmp_path / "set", fill) is False  # taken: the second copy is discarded

    def killed(folder):
        (folder / "half").write_text("")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_folder(tmp_path / "other", killed)
    assert [p.name for p in tmp_path.iterdir()] == ["set"]


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_files_and_folders_get_the_mode_a_plain_open_gives_under_the_umask(tmp_path, mask):
    """Results on a shared filesystem are readable by the group as any file the user writes (issue 61:
    mkstemp made every table, claims report and cache entry mode 600)."""
    old = os.umask(mask)
    try:
        with open(tmp_path / "plain", "w"):
            pass
        os.mkdir(tmp_path / "plain-dir")
        write_file(tmp_path / "atomic", "x")
        write_folder(tmp_path / "atomic-dir", lambda folder: (folder / "x").write_text("1"))
    finally:
        os.umask(old)
    mode = lambda name: (tmp_path / name).stat().st_mode & 0o777  # noqa: E731
    assert mode("atomic") == mode("plain") == 0o666 & ~mask
    assert mode("atomic-dir") == mode("plain-dir") == 0o777 & ~mask
