"""The export's provenance digest of the weights is computed once per file version: a second export
of an unchanged checkpoint reads no weight byte to hash it, a changed file is hashed again, and the
digest is always the file's sha256 (hashlib over its bytes, computed here)."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from routescope.analysis.export import batch as B

ROOT = Path(__file__).resolve().parents[2]


def test_the_digest_is_cached_by_file_version(tmp_path, monkeypatch):
    ck = tmp_path / "pgpt"
    shutil.copytree(ROOT / "checkpoints" / "pgpt", ck)
    monkeypatch.setenv(B.DIGEST_CACHE, str(tmp_path / "cache" / "digests.json"))
    hashed = []
    real = B.file_sha256
    monkeypatch.setattr(B, "file_sha256", lambda p, *a: hashed.append(Path(p)) or real(p, *a))
    monkeypatch.setattr(B, "_digests", {})
    weights = ck / "model.safetensors"
    want = hashlib.sha256(weights.read_bytes()).hexdigest()
    assert B.weights_sha256(ck) == want and hashed == [weights]
    monkeypatch.setattr(B, "_digests", {})  # as a new process: only the cache file remembers
    assert B.weights_sha256(ck) == want and hashed == [weights]
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # the file changes (another size or mtime would do too)
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(1, 1))
    assert B.weights_sha256(ck) == hashlib.sha256(bytes(data)).hexdigest() and len(hashed) == 2


def test_an_unwritable_cache_only_costs_the_hashing(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(B.DIGEST_CACHE, str(blocker / "digests.json"))  # a file where its folder should be
    monkeypatch.setattr(B, "_digests", {})
    ck = ROOT / "checkpoints" / "pgpt"
    assert B.weights_sha256(ck) == hashlib.sha256((ck / "model.safetensors").read_bytes()).hexdigest()
