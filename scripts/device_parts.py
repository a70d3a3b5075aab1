#!/usr/bin/env python3
"""A package too large for one device call (64 MiB, the project included), carried in
parts over several calls to one warm machine, and joined there (issue 23, part 5:
onnxruntime-gpu is 255 MB).

Here, once (downloads the wheel for the device's Python 3.12, unpacks it, packs it as one
xz tar, ~20% smaller than the wheel's zip, and cuts that into equal parts):

    scripts/device_parts.py pack onnxruntime-gpu==1.31.1 --parts 4

then one device call per part, back to back (the machine goes back after 30 s idle,
and with it what the calls left there), each carrying the manifest and its part:

    carry [".ortgpu/manifest.json", ".ortgpu/part-0"]   command: scripts/device_parts.py stash
    ...
    carry [".ortgpu/manifest.json", ".ortgpu/part-3"]   command: scripts/device_parts.py stash

`stash` checks each part it finds against the manifest and keeps it outside the
working tree (/tmp/ortgpu), so that the next call's tree can replace this one's. `join`
(which every step of `scripts/device_checks` runs first, when it finds parts) checks
that every part is there and whole, unpacks the tar into a folder (/tmp/ortgpu/site)
and prints it, for PYTHONPATH. The unpacked wheel is a complete install: its
`.dist-info` is there, and nothing is compiled at install time.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "manifest.json"
JOINED = ".joined"  # in the site folder: the digest of the archive unpacked there
CHUNK = 1 << 20
# what pip matches for the device: CPython 3.12 on x86-64 (its image's python3)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def part_name(i: int) -> str:
    return f"part-{i}"


def pack_archive(archive: Path, out: Path, parts: int, source: str) -> dict:
    """Cut `archive` into `parts` files of (nearly) equal size in `out`, with a manifest
    that names each part's size and digest and the whole's."""
    size = archive.stat().st_size
    each = -(-size // parts)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part-*"):
        old.unlink()
    entries = []
    with open(archive, "rb") as src:
        for i in range(parts):
            path = out / part_name(i)
            with open(path, "wb") as dst:
                left = each
                while left and (block := src.read(min(CHUNK, left))):
                    dst.write(block)
                    left -= len(block)
            entries.append({"name": path.name, "size": path.stat().st_size,
                            "sha256": sha256(path)})
    manifest = {"source": source, "archive": archive.name, "size": size,
                "sha256": sha256(archive), "parts": entries}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def wheel_to_tar(wheel: Path, archive: Path) -> None:
    """The wheel's files as one xz tar, rooted where the wheel is (site-packages)."""
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        # xz -T0 is several times faster than Python's lzma for ~350 MB; the output is
        # a plain .tar.xz either way
        if shutil.which("xz"):
            with open(archive, "wb") as f:
                tar = subprocess.Popen(["tar", "-C", tmp, "-cf", "-", "."],
                                       stdout=subprocess.PIPE)
                subprocess.run(["xz", "-T0", "-6", "-c"], stdin=tar.stdout, stdout=f,
                               check=True)
                if tar.wait() != 0:
                    raise RuntimeError("tar failed")
        else:
            with tarfile.open(archive, "w:xz") as t:
                t.add(tmp, arcname=".")


def check_part(folder: Path, entry: dict) -> str | None:
    """Why the part in `folder` is unusable, or None when it is whole."""
    path = folder / entry["name"]
    if not path.exists():
        return "missing"
    if path.stat().st_size != entry["size"]:
        return f"{path.stat().st_size} bytes, not {entry['size']}"
    if sha256(path) != entry["sha256"]:
        return "digest differs"
    return None


def stash(carried: Path, store: Path) -> list[str]:
    """Copy each whole part found in `carried` into `store`, with the manifest; the
    names of the parts the store has whole afterwards. A manifest of another package or
    build empties the store first."""
    manifest = json.loads((carried / MANIFEST).read_text())
    store.mkdir(parents=True, exist_ok=True)
    kept = store / MANIFEST
    if not kept.exists() or json.loads(kept.read_text())["sha256"] != manifest["sha256"]:
        for old in store.glob("part-*"):
            old.unlink()
        shutil.copyfile(carried / MANIFEST, kept)
    for entry in manifest["parts"]:
        if check_part(carried, entry) is None and check_part(store, entry) is not None:
            shutil.copyfile(carried / entry["name"], store / entry["name"])
    return [e["name"] for e in manifest["parts"] if check_part(store, e) is None]


class _Joined(io.RawIOBase):
    """The parts, read one after another as one file, hashed as they are read."""

    def __init__(self, paths: list[Path]):
        self.paths, self.f, self.digest = iter(paths), None, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while True:
            if self.f is None:
                path = next(self.paths, None)
                if path is None:
                    return 0
                self.f = open(path, "rb")
            n = self.f.readinto(buf)
            if n:
                self.digest.update(memoryview(buf)[:n])
                return n
            self.f.close()
            self.f = None


def join(store: Path, site: Path) -> Path:
    """Unpack the parts in `store` into `site`; raise if a part is missing or damaged,
    or the whole's digest is not the manifest's (then `site` is removed)."""
    manifest = json.loads((store / MANIFEST).read_text())
    done = site / JOINED
    if done.exists() and done.read_text() == manifest["sha256"]:
        return site  # joined by an earlier call on this machine
    bad = {e["name"]: why for e in manifest["parts"] if (why := check_part(store, e))}
    if bad:
        raise SystemExit(f"device_parts: cannot join {manifest['source']}: " + ", ".join(
            f"{name} {why}" for name, why in bad.items()))
    if site.exists():
        shutil.rmtree(site)
    stream = _Joined([store / e["name"] for e in manifest["parts"]])
    with lzma.open(stream) as xz, tarfile.open(fileobj=xz, mode="r|") as t:
        t.extractall(site, filter="data")
    while stream.read(CHUNK):  # what the tar's reader left unread still counts
        pass
    if stream.digest.hexdigest() != manifest["sha256"]:
        shutil.rmtree(site)
        raise SystemExit("device_parts: the joined archive's digest is not the manifest's")
    done.write_text(manifest["sha256"])
    return site


def download(spec: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
           "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
           "-d", str(dest), spec]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd, check=True)
    name = spec.split("==")[0].replace("-", "_").lower()
    wheels = sorted(w for w in dest.glob("*.whl") if w.name.lower().startswith(name))
    if not wheels:
        raise SystemExit(f"device_parts: pip saved no wheel for {spec} in {dest}")
    return wheels[-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    pk = sub.add_parser("pack", help="here: download, pack and cut a wheel")
    pk.add_argument("spec", help="NAME==VERSION, for CPython 3.12 on x86-64")
    pk.add_argument("--parts", type=int, default=4)
    pk.add_argument("--dir", type=Path, default=ROOT / ".ortgpu")
    st = sub.add_parser("stash", help="there: keep the carried parts outside the tree")
    st.add_argument("--dir", type=Path, default=ROOT / ".ortgpu")
    st.add_argument("--store", type=Path, default=Path("/tmp/ortgpu"))
    jn = sub.add_parser("join", help="there: stash, then unpack when every part is in")
    jn.add_argument("--dir", type=Path, default=ROOT / ".ortgpu")
    jn.add_argument("--store", type=Path, default=Path("/tmp/ortgpu"))
    args = p.parse_args()

    if args.verb == "pack":
        with tempfile.TemporaryDirectory() as tmp:
            wheel = download(args.spec, Path(tmp))
            archive = Path(tmp) / (wheel.name[:-len(".whl")] + ".tar.xz")
            wheel_to_tar(wheel, archive)
            m = pack_archive(archive, args.dir, args.parts, wheel.name)
        biggest = max(e["size"] for e in m["parts"]) / 2**20
        print(f"{m['source']}: {m['size'] / 2**20:.1f} MiB packed, {len(m['parts'])} "
              f"parts of up to {biggest:.1f} MiB in {args.dir}")
        return
    have = stash(args.dir, args.store) if (args.dir / MANIFEST).exists() else []
    manifest = json.loads((args.store / MANIFEST).read_text())
    names = [e["name"] for e in manifest["parts"]]
    print(f"device_parts: {manifest['source']}: {len(have)} of {len(names)} parts in "
          f"{args.store}" + (f" (missing {', '.join(sorted(set(names) - set(have)))})"
                             if len(have) < len(names) else ""), file=sys.stderr)
    if args.verb == "join":
        print(join(args.store, args.store / "site"))


if __name__ == "__main__":
    main()
