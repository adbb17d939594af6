"""Every single-byte change, truncation, deleted file, extra file and swapped shard
of a container is detected by verify and refused by restore, each with a
documented code (docs/checkpoint-format.md, "Failure codes").

The counts are printed (``-s``) and asserted: every case tried is detected.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.checkpoint import restore_checkpoint, save_checkpoint, verify_container
from umlos_cuda.checkpoint.summary import verify_path
from test_checkpoint_support import files_of, identity, state

#: The codes a damaged container may produce (all documented).
INTEGRITY_CODES = {
    errors.CHECKPOINT_NOT_FOUND, errors.CHECKPOINT_CBOR_INVALID, errors.CHECKPOINT_SCHEMA_INVALID,
    errors.CHECKPOINT_SCHEMA_UNSUPPORTED, errors.CHECKPOINT_PATH_INVALID, errors.CHECKPOINT_FILE_MISSING,
    errors.CHECKPOINT_UNEXPECTED_FILE, errors.CHECKPOINT_SIZE_MISMATCH, errors.CHECKPOINT_HASH_MISMATCH,
    errors.CHECKPOINT_MERKLE_MISMATCH, errors.CHECKPOINT_BINDING_MISMATCH, errors.CHECKPOINT_CONTENT_INVALID,
}
MANIFEST = "checkpoint_manifest.cbor"


def refused(path: str) -> tuple[str, str]:
    """The codes verify and a full restore fail with; fails the test if either accepts."""
    codes = []
    for function in (verify_container, restore_checkpoint):
        try:
            function(path)
        except uc.UmlosError as exc:
            assert exc.code in INTEGRITY_CODES, f"{function.__name__}: undocumented code {exc.code}: {exc.message}"
            codes.append(exc.code)
        else:
            pytest.fail(f"{function.__name__} accepted a damaged container at {path}")
    return codes[0], codes[1]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("corrupt") / "c")
    save_checkpoint(path, identity(), state(2, shards=1, ranks=2))
    verify_container(path)
    return path, {rel: Path(os.path.join(path, rel)).read_bytes() for rel in files_of(path)}


@pytest.fixture()
def work(pristine, tmp_path):
    source, _ = pristine
    path = str(tmp_path / "c")
    shutil.copytree(source, path)
    return path


def test_every_single_byte_change_is_detected(pristine, work):
    _, originals = pristine
    rng = random.Random(20260218)
    tried = 0
    codes: dict[str, int] = {}
    for rel, data in originals.items():
        full = os.path.join(work, rel)
        for position in range(len(data)):
            changed = bytearray(data)
            changed[position] ^= rng.randrange(1, 256)
            with open(full, "wb") as handle:
                handle.write(changed)
            verify_code, restore_code = refused(work)
            tried += 1
            codes[verify_code] = codes.get(verify_code, 0) + 1
            if rel != MANIFEST:
                # The manifest pins each file's SHA-256, so nothing else can explain it.
                assert verify_code == restore_code == errors.CHECKPOINT_HASH_MISMATCH, (rel, position)
        with open(full, "wb") as handle:
            handle.write(data)
    verify_container(work)
    assert tried == sum(len(d) for d in originals.values())
    print(f"\nsingle-byte changes: {tried} tried, {tried} detected by verify and refused by restore; codes {codes}")


def test_every_truncation_and_extension_is_detected(pristine, work):
    _, originals = pristine
    tried = 0
    for rel, data in originals.items():
        full = os.path.join(work, rel)
        for length in sorted({0, 1, len(data) // 2, len(data) - 1} - {len(data)}):
            with open(full, "wb") as handle:
                handle.write(data[:length])
            code, _ = refused(work)
            if rel != MANIFEST:
                assert code == errors.CHECKPOINT_SIZE_MISMATCH
            tried += 1
        with open(full, "wb") as handle:
            handle.write(data + b"\x00")
        code, _ = refused(work)
        if rel != MANIFEST:
            assert code == errors.CHECKPOINT_SIZE_MISMATCH
        tried += 1
        with open(full, "wb") as handle:
            handle.write(data)
    verify_container(work)
    print(f"\ntruncations and extensions: {tried} tried, {tried} detected")


def test_every_deleted_file_is_detected(pristine, work):
    _, originals = pristine
    for rel, data in originals.items():
        full = os.path.join(work, rel)
        os.unlink(full)
        code, restore_code = refused(work)
        expected = errors.CHECKPOINT_NOT_FOUND if rel == MANIFEST else errors.CHECKPOINT_FILE_MISSING
        assert code == restore_code == expected
        with open(full, "wb") as handle:
            handle.write(data)
    shutil.rmtree(os.path.join(work, "tensors", "rank=1"))
    assert refused(work) == (errors.CHECKPOINT_FILE_MISSING, errors.CHECKPOINT_FILE_MISSING)
    print(f"\ndeleted files: {len(originals) + 1} tried, {len(originals) + 1} detected")


EXTRA = [
    "extra.bin",
    "tensors/rank=0/shard=1.bin",  # a valid-looking path the manifest does not list
    "tensors/rank=2/shard=0.bin",
    "optimizer/rank=5/state.bin",
    "artifacts/blob=smuggled.bin",
    "data/cursors.cbor.tmp",
    "trace/segment=1.tape",
    ".hidden",
    "dp/.accountant_state.cbor.swp",
]


@pytest.mark.parametrize("rel", EXTRA)
def test_every_extra_file_is_detected(work, rel):
    full = os.path.join(work, rel)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as handle:
        handle.write(b"\x00" * 8)
    assert refused(work) == (errors.CHECKPOINT_UNEXPECTED_FILE, errors.CHECKPOINT_UNEXPECTED_FILE)


@pytest.mark.parametrize("kind", ["empty folder", "nested folder", "link", "link to folder"])
def test_extra_folders_and_links_are_detected(work, tmp_path, kind):
    if kind == "empty folder":
        os.mkdir(os.path.join(work, "tensors", "rank=9"))
    elif kind == "nested folder":
        os.makedirs(os.path.join(work, "a", "b", "c", "d", "e"))
    elif kind == "link":
        os.symlink("/etc/hostname", os.path.join(work, "artifacts", "link"))
    else:
        os.symlink(str(tmp_path), os.path.join(work, "data", "elsewhere"))
    assert refused(work) == (errors.CHECKPOINT_UNEXPECTED_FILE, errors.CHECKPOINT_UNEXPECTED_FILE)


def test_every_swapped_shard_is_detected(pristine, work, tmp_path):
    _, originals = pristine
    shards = [rel for rel in originals if rel.endswith(".bin")]
    tried = 0
    for i, a in enumerate(shards):
        for b in shards[i + 1:]:
            if originals[a] == originals[b]:
                continue
            for rel, data in ((a, originals[b]), (b, originals[a])):
                with open(os.path.join(work, rel), "wb") as handle:
                    handle.write(data)
            code, _ = refused(work)
            assert code in (errors.CHECKPOINT_HASH_MISMATCH, errors.CHECKPOINT_SIZE_MISMATCH)
            tried += 1
            for rel in (a, b):
                with open(os.path.join(work, rel), "wb") as handle:
                    handle.write(originals[rel])
    # The same shard from another checkpoint of the same run (same size, other step).
    other = str(tmp_path / "other")
    save_checkpoint(other, identity(), state(3, shards=1, ranks=2))
    for rel in shards:
        replacement = Path(os.path.join(other, rel)).read_bytes()
        if replacement == originals[rel]:
            continue
        with open(os.path.join(work, rel), "wb") as handle:
            handle.write(replacement)
        code, _ = refused(work)
        assert code in (errors.CHECKPOINT_HASH_MISMATCH, errors.CHECKPOINT_SIZE_MISMATCH)
        tried += 1
        with open(os.path.join(work, rel), "wb") as handle:
            handle.write(originals[rel])
    # A whole manifest from another checkpoint: every file then mismatches.
    shutil.copy(os.path.join(other, MANIFEST), os.path.join(work, MANIFEST))
    refused(work)
    tried += 1
    assert tried >= 10
    print(f"\nswapped shards: {tried} tried, {tried} detected")


def test_cli_verify_rejects_each_damage_with_its_code(pristine, work, capsys):
    from umlos_cuda.cli import main

    assert main(["checkpoint", "verify", work]) == 0
    with open(os.path.join(work, "tensors/rank=0/shard=0.bin"), "r+b") as handle:
        handle.seek(100)
        byte = handle.read(1)
        handle.seek(100)
        handle.write(bytes([byte[0] ^ 1]))
    capsys.readouterr()
    assert main(["checkpoint", "verify", work]) == 2
    assert capsys.readouterr().err.startswith("error CHECKPOINT_HASH_MISMATCH: tensors/rank=0/shard=0.bin")
    with pytest.raises(uc.UmlosError):
        verify_path(work)
