"""scripts/device_parts.py: a package cut into parts here, carried one part a device call,
kept there between calls, and joined only when every part is whole (issue 23, part 5)."""

import json
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import device_parts  # noqa: E402


def _archive(tmp: Path, name: str = "pkg.tar.xz", payload: bytes = b"") -> Path:
    """A small xz tar laid out as an unpacked wheel, with bytes that do not compress,
    so that the parts are of some size."""
    src = tmp / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("VALUE = 42\n")
    (src / "pkg" / "blob.bin").write_bytes(payload or bytes(range(256)) * 4000)
    (src / "pkg-1.0.dist-info").mkdir()
    (src / "pkg-1.0.dist-info" / "METADATA").write_text("Name: pkg\nVersion: 1.0\n")
    archive = tmp / name
    with tarfile.open(archive, "w:xz", preset=0) as t:
        t.add(src, arcname=".")
    shutil.rmtree(src)
    return archive


def _carry(parts: Path, names: list[str], to: Path) -> Path:
    """The tree one device call brings: the manifest and the parts it names."""
    to.mkdir(parents=True)
    shutil.copy(parts / device_parts.MANIFEST, to)
    for name in names:
        shutil.copy(parts / name, to)
    return to


def test_parts_carried_over_calls_join_into_the_package(tmp_path):
    archive = _archive(tmp_path)
    parts = tmp_path / "parts"
    manifest = device_parts.pack_archive(archive, parts, 3, "pkg-1.0.whl")
    sizes = [e["size"] for e in manifest["parts"]]
    assert len(sizes) == 3 and sum(sizes) == archive.stat().st_size
    assert max(sizes) - min(sizes) <= sizes[0] // 2 + 1  # cut evenly, not one big part

    store = tmp_path / "store"
    for i in range(3):  # one call each; each call's tree replaces the one before
        have = device_parts.stash(_carry(parts, [f"part-{i}"], tmp_path / f"call{i}"), store)
        assert have == [f"part-{k}" for k in range(i + 1)]
    site = device_parts.join(store, store / "site")
    assert (site / "pkg" / "__init__.py").read_text() == "VALUE = 42\n"
    assert (site / "pkg" / "blob.bin").read_bytes() == bytes(range(256)) * 4000
    assert (site / "pkg-1.0.dist-info" / "METADATA").exists()
    # a later call finds it joined and leaves it as it is
    (site / "pkg" / "mine.txt").write_text("kept")
    assert device_parts.join(store, store / "site") == site
    assert (site / "pkg" / "mine.txt").exists()


def test_join_names_the_missing_and_the_damaged_part(tmp_path):
    archive = _archive(tmp_path)
    parts = tmp_path / "parts"
    device_parts.pack_archive(archive, parts, 3, "pkg-1.0.whl")
    store = tmp_path / "store"
    damaged = _carry(parts, ["part-0", "part-2"], tmp_path / "call")
    with open(damaged / "part-2", "r+b") as f:
        f.seek(10)
        f.write(b"\xff\x00\xff")
    assert device_parts.stash(damaged, store) == ["part-0"]  # the damaged one not kept
    with pytest.raises(SystemExit, match=r"part-1 missing, part-2 missing"):
        device_parts.join(store, store / "site")
    assert not (store / "site").exists()


def test_a_part_damaged_in_the_store_is_refused_at_the_join(tmp_path):
    archive = _archive(tmp_path)
    parts = tmp_path / "parts"
    device_parts.pack_archive(archive, parts, 2, "pkg-1.0.whl")
    store = tmp_path / "store"
    device_parts.stash(parts, store)
    with open(store / "part-1", "ab") as f:
        f.write(b"x")
    with pytest.raises(SystemExit, match=r"part-1 \d+ bytes, not \d+"):
        device_parts.join(store, store / "site")


def test_parts_of_another_build_empty_the_store(tmp_path):
    """A store left by an older pack (another version, or the same one packed again) is
    not mixed with the new parts."""
    store = tmp_path / "store"
    old = tmp_path / "old"
    device_parts.pack_archive(_archive(tmp_path, "old.tar.xz", b"old" * 30000), old, 2,
                              "pkg-0.9.whl")
    device_parts.stash(old, store)
    new = tmp_path / "new"
    device_parts.pack_archive(_archive(tmp_path, "new.tar.xz"), new, 2, "pkg-1.0.whl")
    assert device_parts.stash(_carry(new, ["part-1"], tmp_path / "call"), store) == ["part-1"]
    kept = json.loads((store / device_parts.MANIFEST).read_text())
    assert kept["source"] == "pkg-1.0.whl"
    assert not (store / "part-0").exists()
