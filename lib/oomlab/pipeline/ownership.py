"""What a run may replace in its output folder, and which run may write there now.

A run replaces whole entries of ``out_dir`` (``notebooks/``, ``results/``, ``configs/``, ``report.html``).  It may
replace only what it provably wrote: every finished run leaves :data:`MANIFEST_NAME` in ``out_dir``, a
:class:`RunManifest` listing each folder and file it moved in (path, SHA-256, size).  :func:`foreign_path` finds the
first path under the entries a run would replace that the last manifest does not vouch for -- a user's file, a file
changed since, a symbolic link, anything when there is no manifest -- and the runner refuses the run rather than
lose it.  :func:`out_dir_lock` keeps two runs out of one folder: an exclusive ``flock`` on ``.<name>.lock`` beside
it (not in the user's folder), which the kernel drops with the process, so a lock is never stale.

Limitations: a file added in the moment between the last check and the swap's renames is not seen (the lock keeps
out other oomlab runs, not other programs); a manifest names the files, it does not sign them, so a hand-written
manifest is believed.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib.metadata
import json
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from oomlab.core.errors import OutputFolderError
from oomlab.core.user_input import load_user_json, read_user_text

__all__ = ["MANIFEST_FORMAT", "MANIFEST_NAME", "Foreign", "RunFile", "RunManifest", "foreign_path", "lock_path",
           "manifest_of", "out_dir_lock", "read_manifest", "unwritable", "write_manifest"]

MANIFEST_NAME = ".oomlab-run.json"  # in out_dir, swapped in last with the run it lists
MANIFEST_FORMAT = "oomlab-run-manifest/1"  # the marker a manifest must carry to be believed
MANIFEST_MAX_BYTES = 4 * 2**20  # a run's manifest lists tens of files: a few KiB
_CHUNK_BYTES = 2**20


@dataclass(frozen=True)
class RunFile:
    """One file a run wrote: its path relative to ``out_dir`` (``/``-separated), SHA-256 and size."""

    path: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True)
class RunManifest:
    """Every folder and file one finished run moved into ``out_dir`` (the manifest itself aside)."""

    oomlab_version: str | None  # None: oomlab ran from a checkout without being installed
    folders: tuple[str, ...]
    files: tuple[RunFile, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"format": MANIFEST_FORMAT, "oomlab_version": self.oomlab_version, "folders": list(self.folders),
                "files": [{"path": f.path, "sha256": f.sha256, "size_bytes": f.size_bytes} for f in self.files]}

    @classmethod
    def from_dict(cls, raw: Any) -> RunManifest:
        """The inverse of :meth:`to_dict`; :class:`ValueError` naming what is wrong for anything else."""
        if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"not a run manifest (no \"format\": {json.dumps(MANIFEST_FORMAT)})")
        folders, files, version = raw.get("folders"), raw.get("files"), raw.get("oomlab_version")
        if not isinstance(folders, list) or not all(isinstance(f, str) for f in folders):
            raise ValueError("\"folders\" is not a list of paths")
        if not isinstance(files, list) or not all(_is_file_row(f) for f in files):
            raise ValueError("\"files\" is not a list of {path, sha256, size_bytes}")
        if version is not None and not isinstance(version, str):
            raise ValueError("\"oomlab_version\" is not a string")
        return cls(version, tuple(folders), tuple(RunFile(f["path"], f["sha256"], f["size_bytes"]) for f in files))


def _is_file_row(row: Any) -> bool:
    return (isinstance(row, dict) and isinstance(row.get("path"), str) and isinstance(row.get("sha256"), str)
            and type(row.get("size_bytes")) is int and row["size_bytes"] >= 0)


def oomlab_version() -> str | None:
    """The installed oomlab's version, or None when it runs from a checkout without being installed."""
    try:
        return importlib.metadata.version("oomlab")
    except importlib.metadata.PackageNotFoundError:
        return None


class _Kind(Enum):
    """What one path under an entry is (``lstat``: a link is never followed)."""

    FOLDER = "folder"
    """A real folder: walked into."""
    FILE = "file"
    """A regular file: hashed."""
    LINK = "link"
    """A symbolic link, which a run never writes."""
    OTHER = "other"
    """A FIFO, socket or device."""
    UNREADABLE = "unreadable"
    """A path whose status or listing could not be read."""


def _walk(root: Path, name: str) -> Iterator[tuple[str, Path, _Kind, str]]:
    """``(relative path, path, kind, error)`` of ``root/name`` and everything under it, each folder before what it
    holds, names sorted; ``error`` is the reason for an unreadable path (else "")."""
    path = root / name
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        yield name, path, _Kind.UNREADABLE, err.strerror or str(err)
        return
    if stat.S_ISLNK(mode):
        yield name, path, _Kind.LINK, ""
    elif stat.S_ISREG(mode):
        yield name, path, _Kind.FILE, ""
    elif not stat.S_ISDIR(mode):
        yield name, path, _Kind.OTHER, ""
    else:
        try:
            children = sorted(os.listdir(path))
        except OSError as err:
            yield name, path, _Kind.UNREADABLE, err.strerror or str(err)
            return
        yield name, path, _Kind.FOLDER, ""
        for child in children:
            yield from _walk(root, f"{name}/{child}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_of(folder: Path, names: Iterable[str]) -> RunManifest:
    """The manifest of ``folder``'s entries ``names`` (absent ones skipped): every folder and file under them.

    NB: links and special files are left out, so a later run refuses to replace them, as it would a user's.
    """
    folders, files = [], []
    for name in names:
        for rel, path, kind, _ in _walk(folder, name):
            if kind is _Kind.FOLDER:
                folders.append(rel)
            elif kind is _Kind.FILE:
                files.append(RunFile(rel, _sha256(path), path.stat().st_size))
    return RunManifest(oomlab_version(), tuple(folders), tuple(files))


def write_manifest(folder: Path, manifest: RunManifest) -> Path:
    """Write ``manifest`` as ``folder/.oomlab-run.json``; return its path."""
    path = folder / MANIFEST_NAME
    path.write_text(json.dumps(manifest.to_dict(), indent=1) + "\n", encoding="utf-8")
    return path


def read_manifest(out_dir: Path) -> tuple[RunManifest | None, str]:
    """The last run's manifest in ``out_dir``, or None and the reason there is none (``"no .oomlab-run.json"``)."""
    path = out_dir / MANIFEST_NAME
    if not path.exists() and not path.is_symlink():
        return None, f"no {MANIFEST_NAME}"
    if path.is_symlink():
        return None, f"{MANIFEST_NAME} is a symbolic link"
    try:
        raw = load_user_json(read_user_text(path, MANIFEST_NAME, MANIFEST_MAX_BYTES), MANIFEST_NAME)
        return RunManifest.from_dict(raw), ""
    except ValueError as err:  # InvalidValueError from the bounded reads, or from_dict's
        return None, f"{MANIFEST_NAME} cannot be read: {err}"


@dataclass(frozen=True)
class Foreign:
    """The first path under a run's entries that the last manifest does not vouch for, and why."""

    path: str  # relative to out_dir; a folder ends in "/"
    entry: str  # the entry of out_dir it is in (a folder ends in "/"): what a run would replace
    why: str  # "which no oomlab run wrote (no .oomlab-run.json)", ...


def foreign_path(out_dir: Path, names: Iterable[str], manifest: RunManifest | None,
                 missing: str = "") -> Foreign | None:
    """The first path under ``out_dir``'s entries ``names`` that ``manifest`` does not list with the same size and
    SHA-256 (entries in ``names`` order, then as :func:`_walk` goes), or None when a run may replace them all.

    ``missing`` is why there is no manifest (:func:`read_manifest`'s reason); the manifest itself is never foreign.
    A folder the manifest does not list is named only when nothing under it is foreign: the file a user would lose
    says more than the folder it is in.
    """
    folders = set(manifest.folders) if manifest is not None else set()
    files = {f.path: f for f in manifest.files} if manifest is not None else {}
    unlisted = (f"which no oomlab run wrote ({missing})" if manifest is None
                else f"which the last run did not write ({MANIFEST_NAME} does not list it)")
    for name in names:
        if name == MANIFEST_NAME:
            continue
        entry = name + "/" if (out_dir / name).is_dir() and not (out_dir / name).is_symlink() else name
        unlisted_folder = None
        for rel, path, kind, error in _walk(out_dir, name):
            if kind is _Kind.FOLDER:
                if rel not in folders and unlisted_folder is None:
                    unlisted_folder = Foreign(rel + "/", entry, unlisted)
                continue
            if kind is _Kind.FILE:
                why = _file_why(path, files.get(rel), unlisted)
            elif kind is _Kind.LINK:
                why = "a symbolic link, which oomlab never writes"
            elif kind is _Kind.OTHER:
                why = "which is not a regular file or folder"
            else:
                why = f"which cannot be read ({error})"
            if why:
                return Foreign(rel, entry, why)
        if unlisted_folder is not None:
            return unlisted_folder
    return None


def _file_why(path: Path, listed: RunFile | None, unlisted: str) -> str:
    """Why the regular file ``path`` is not the one the manifest lists (``""`` when it is)."""
    if listed is None:
        return unlisted
    try:
        same = path.stat().st_size == listed.size_bytes and _sha256(path) == listed.sha256
    except OSError as err:
        return f"which cannot be read ({err.strerror or err})"
    return "" if same else f"changed since oomlab wrote it (its SHA-256 differs from {MANIFEST_NAME}'s)"


def unwritable(out_dir: Path, err: OSError) -> OutputFolderError:
    """The refusal for an output folder that cannot be created or written (read-only or full filesystem, /proc)."""
    where = f": {err.filename}" if err.filename else ""
    return OutputFolderError(
        f"cannot write the output folder {out_dir} ({err.strerror or err}{where}); nothing was run and nothing"
        " changed: choose another --out, a folder on a filesystem you can write")


def lock_path(out_dir: Path) -> Path:
    """``.<name>.lock`` beside ``out_dir``: the lock stays out of the user's folder."""
    return out_dir.parent / f".{out_dir.name}.lock"


def _holder(fd: int) -> str:
    """The lock holder's pid as written in the lock file, or why it is not known."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        text = ""
    return f"pid {text}" if text.isdigit() else "pid not yet written"


@contextmanager
def out_dir_lock(out_dir: Path) -> Iterator[Path]:
    """Hold an exclusive ``flock`` on :func:`lock_path` (holding our pid) for the block; refuse at once if another
    process holds it.  The lock file is removed on release, while still locked.

    NB: a run that took the lock may remove the file between our ``open`` and our ``flock``: we then hold a lock
    on a file no longer at the path, so the inode is compared after locking and the lock taken again if it moved.
    """
    path = lock_path(out_dir)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise unwritable(out_dir, err) from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _holder(fd)
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise unwritable(out_dir, err) from err
            raise OutputFolderError(
                f"another oomlab run ({holder}) is writing to {out_dir}: it holds the lock {path}; nothing was run"
                " and nothing changed: wait for it to finish, or choose another --out") from err
        try:
            here, there = os.fstat(fd), os.stat(path)
            if (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        except OSError:
            pass  # a full filesystem: the lock holds all the same, its holder goes unnamed
        yield path
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)
