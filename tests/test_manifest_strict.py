"""Strict manifests (docs/manifest.md): unknown and duplicate keys are refused,
files and YAML alias expansion are bounded, and values that used to escape as
raw exceptions (huge integers, lone surrogates, impossible dates) are
``INVALID_MANIFEST``, through ``Manifest.load``, ``Manifest.from_dict`` and
the command line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import oracle
import umlos_cuda as uc
from nbcases import raw_manifest
from umlos_cuda import cli, errors
from umlos_cuda.manifest import core as manifest_module, yaml_safe
from umlos_cuda.manifest.schema import ALL_PATHS

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "manifest.md"
GOOD = raw_manifest(1000, 64, 48)
GOOD_YAML = "global_batch_size: 48\ndatasets:\n  train: {id: x, version: '1', hash: h, cardinality: 1000}\n"
NEXT_BATCH = ["next-batch", "--dataset", "train", "--world-size", "1", "--rank", "0", "--stage", "train",
              "--epoch", "0", "--global-index", "0"]


def refused(function, *args, **kwargs) -> str:
    """Call ``function``; it must raise INVALID_MANIFEST pointing to docs/manifest.md. Returns the message."""
    with pytest.raises(uc.UmlosError) as info:
        function(*args, **kwargs)
    assert info.value.code == errors.INVALID_MANIFEST, info.value
    assert info.value.message.endswith("(see docs/manifest.md)")
    return info.value.message


def write(tmp_path: Path, text: str | bytes, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    return path


def alias_bomb(levels: int, width: int = 10) -> bytes:
    """The "billion laughs" manifest: ``width ** levels`` values once its aliases are expanded."""
    lines = ["global_batch_size: 8", "datasets: {}", "extra:", f"  l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return ("\n".join(lines) + "\n").encode()


# ------------------------------------------------------------------ unknown keys
DATASET = GOOD["datasets"]["train"]


@pytest.mark.parametrize(
    "raw, named, suggestion",
    [
        ({**GOOD, "sead": 42}, "sead", "seed"),
        ({**GOOD, "Seed": 42}, "Seed", "seed"),
        ({**GOOD, "droplast": True}, "droplast", "data.drop_last"),
        ({**GOOD, "drop_last": True}, "drop_last", "data.drop_last"),
        ({**GOOD, "data": {"sampler_blocksize": 4096}}, "data.sampler_blocksize", "data.sampler_block_size"),
        ({**GOOD, "data": {"drop_last": True, "droplast": False}}, "data.droplast", "data.drop_last"),
        ({**GOOD, "global_batchsize": 8}, "global_batchsize", "global_batch_size"),
        ({**GOOD, "extras": {}}, "extras", "extra"),
        ({**GOOD, "datasets": {"train": {**DATASET, "cardinalty": 5}}}, "datasets.train.cardinalty",
         "datasets.train.cardinality"),
        ({**GOOD, "cardinality": 5}, "cardinality", "datasets.<KEY>.cardinality"),
    ],
)
def test_unknown_key_is_refused_with_the_nearest_allowed_one(raw, named, suggestion):
    message = refused(uc.Manifest.from_dict, raw)
    assert f"unknown key {named!r} (did you mean {suggestion!r}?)" in message


def test_unknown_key_far_from_any_lists_what_is_allowed():
    message = refused(uc.Manifest.from_dict, {**GOOD, "zzqqxx": 1})
    assert "unknown key 'zzqqxx'" in message and "did you mean" not in message
    allowed = "allowed at the top level: spec_version, seed, global_batch_size, data, datasets, policy, env, extra"
    assert allowed in message
    assert "put your own fields under 'extra'" in message


@pytest.mark.parametrize(
    "line, suggestion",
    [("sead: 42\n", "seed"), ("droplast: true\n", "data.drop_last"),
     ("data: {sampler_blocksize: 4096}\n", "data.sampler_block_size")],
)
def test_typos_in_a_file_no_longer_run_with_the_default(tmp_path, line, suggestion):
    """The issue's three typos: each ran with seed 0, drop_last false or the default block size."""
    message = refused(uc.Manifest.load, write(tmp_path, GOOD_YAML + line))
    assert f"did you mean {suggestion!r}?" in message


def test_with_overrides_refuses_unknown_keys():
    refused(uc.Manifest.from_dict(GOOD).with_overrides, sead=1)


# ------------------------------------------------------------------ extra
def test_extra_is_hashed_and_leaves_the_replay_token():
    base = uc.Manifest.from_dict(GOOD)
    a = uc.Manifest.from_dict({**GOOD, "extra": {"owner": "a", "tags": [1, {"x": None}]}})
    b = uc.Manifest.from_dict({**GOOD, "extra": {"owner": "b", "tags": [1, {"x": None}]}})
    assert len({base.hash, a.hash, b.hash}) == 3
    assert a.hash == oracle.manifest_hash({**GOOD, "extra": {"owner": "a", "tags": [1, {"x": None}]}})
    assert a.replay_token == b.replay_token == base.replay_token
    assert a.canonical["extra"] == {"owner": "a", "tags": [1, {"x": None}]}


def test_extra_content_is_free_form_but_still_plain_data():
    uc.Manifest.from_dict({**GOOD, "extra": {"sead": 1, "droplast": True, "nested": {"anything": [1.5, b"x"]}}})
    refused(uc.Manifest.from_dict, {**GOOD, "extra": {"when": object()}})


# ------------------------------------------------------------------ policy, env, extra: mapping or null
@pytest.mark.parametrize("name", ["policy", "env", "extra"])
@pytest.mark.parametrize("value", [False, True, 0, "", "bf16", [], [1]])
def test_free_form_sections_must_be_mappings(name, value):
    """`policy: false` used to pass for "no policy" in the replay token (R3 hashes `policy or {}`)."""
    message = refused(uc.Manifest.from_dict, {**GOOD, name: value})
    assert f"{name} must be a mapping" in message


@pytest.mark.parametrize("name", ["policy", "env"])
def test_absent_null_and_empty_give_the_same_replay_token(name):
    tokens = {uc.Manifest.from_dict(raw).replay_token for raw in (GOOD, {**GOOD, name: None}, {**GOOD, name: {}})}
    assert tokens == {oracle.replay_token(GOOD)}
    # manifest_hash hashes what is written, as before keys were checked
    assert uc.Manifest.from_dict({**GOOD, name: None}).hash == oracle.manifest_hash({**GOOD, name: None})


# ------------------------------------------------------------------ duplicate keys
@pytest.mark.parametrize(
    "text, key",
    [
        (GOOD_YAML + "global_batch_size: 96\n", "global_batch_size"),
        ("seed: 1\n'seed': 2\n" + GOOD_YAML, "seed"),
        (GOOD_YAML + "data: {drop_last: true, drop_last: false}\n", "drop_last"),
        ("global_batch_size: 48\ndatasets:\n"
         "  train: {id: x, version: '1', hash: h, cardinality: 1000, cardinality: 5}\n",
         "cardinality"),
        ("global_batch_size: 48\ndatasets:\n  train: {id: x, version: '1', hash: h, cardinality: 1}\n"
         "  train: {id: x, version: '1', hash: h, cardinality: 2}\n", "train"),
        (GOOD_YAML + "extra: {owner: a, owner: b}\n", "owner"),
        (GOOD_YAML + "extra: {d: {<<: {a: 1, a: 2}}}\n", "a"),
    ],
)
def test_duplicate_yaml_keys_are_refused(tmp_path, text, key):
    message = refused(uc.Manifest.load, write(tmp_path, text))
    assert f"found duplicate key {key!r}" in message


@pytest.mark.parametrize(
    "text, key",
    [
        ('{"global_batch_size": 48, "global_batch_size": 96, "datasets": {}}', "global_batch_size"),
        ('{"global_batch_size": 48, "datasets": {}, "policy": {"a": {"b": 1, "b": 2}}}', "b"),
    ],
)
def test_duplicate_json_keys_are_refused(tmp_path, text, key):
    message = refused(uc.Manifest.load, write(tmp_path, text, "run.json"))
    assert f"duplicate key {key!r}" in message


def test_yaml_merge_keys_may_be_overridden(tmp_path):
    """`<<: *anchor` then a key beside it is YAML's override, not a duplicate."""
    text = ("global_batch_size: 48\nextra:\n  defaults: &d {id: x, version: '1', hash: h, cardinality: 7}\n"
            "datasets:\n  train: {<<: *d, cardinality: 1000}\n")
    loaded = uc.Manifest.load(write(tmp_path, text))
    assert loaded.dataset("train").cardinality == 1000
    assert loaded.hash == oracle.manifest_hash(yaml.safe_load(text))


# ------------------------------------------------------------------ YAML alias expansion
def test_alias_expansion_is_counted_exactly():
    text = "a: &a [1, 2]\nb: [*a, *a]\n"
    # 1 root map + 2 keys + list a (3) + list b (1 + 2 * 3) = 13 values; text "a12b" + "1212" = 8 bytes
    assert yaml_safe.load(text, max_nodes=13, max_bytes=8) == {"a": [1, 2], "b": [[1, 2], [1, 2]]}
    with pytest.raises(yaml.YAMLError, match="more than 12 values"):
        yaml_safe.load(text, max_nodes=12)
    with pytest.raises(yaml.YAMLError, match="more than 7 bytes of text"):
        yaml_safe.load(text, max_bytes=7)


def test_alias_bomb_is_refused_before_it_is_built(tmp_path):
    """6 levels of 10 aliases (1.1 million values) were accepted, copied and hashed
    (1 s, 60 MB; each level is ten times that); the bound is 10^6 values."""
    path = write(tmp_path, alias_bomb(6))
    assert path.stat().st_size < 500
    message = refused(uc.Manifest.load, path)
    assert "with its aliases expanded the document holds more than 1000000 values" in message


def test_a_small_alias_expansion_is_fine(tmp_path):
    text = alias_bomb(3).decode() + "  note: x\n"
    loaded = uc.Manifest.load(write(tmp_path, text))
    assert loaded.hash == oracle.manifest_hash(yaml.safe_load(text))


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path):
    message = refused(uc.Manifest.load, write(tmp_path, GOOD_YAML + "extra: {a: &a [1, *a]}\n"))
    assert "an alias refers to a node that contains it" in message


def test_from_dict_bounds_shared_structure(monkeypatch):
    """A dict can share one list many times over, as an alias does; the copy is bounded."""
    shared: list = ["x"] * 10
    for _ in range(3):
        shared = [shared] * 10  # 10^4 leaves, 1111 lists
    monkeypatch.setattr(manifest_module, "MAX_EXPANDED_NODES", 10_000)
    assert "at most 10000 values" in refused(uc.Manifest.from_dict, {**GOOD, "extra": {"s": shared}})
    monkeypatch.setattr(manifest_module, "MAX_EXPANDED_NODES", 20_000)
    uc.Manifest.from_dict({**GOOD, "extra": {"s": shared}})
    monkeypatch.setattr(manifest_module, "MAX_EXPANDED_BYTES", 5_000)
    assert "at most 5000 bytes of text" in refused(uc.Manifest.from_dict, {**GOOD, "extra": {"s": ["y" * 1000] * 6}})


# ------------------------------------------------------------------ files: kind and size
def test_file_over_max_bytes_is_refused_before_reading(tmp_path):
    path = write(tmp_path, GOOD_YAML)
    size = path.stat().st_size
    assert uc.Manifest.load(path, max_bytes=size).global_batch_size == 48
    message = refused(uc.Manifest.load, path, max_bytes=size - 1)
    assert f"is {size} bytes; the limit is {size - 1}" in message


def test_sparse_gigabyte_file_is_refused_by_stat(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as handle:
        os.truncate(handle.fileno(), 1 << 30)  # sparse: no disk, no time
    message = refused(uc.Manifest.load, path)
    assert f"is {1 << 30} bytes; the limit is {1 << 20} (MAX_MANIFEST_BYTES)" in message
    assert uc.manifest.MAX_MANIFEST_BYTES == 1 << 20


def test_directory_is_refused(tmp_path):
    assert "is a directory, not a file" in refused(uc.Manifest.load, tmp_path)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero on this system")
def test_device_is_refused():
    """/dev/zero was read until memory ran out."""
    assert "is a device or socket, not a regular file" in refused(uc.Manifest.load, "/dev/zero")


def test_non_utf8_file_is_refused(tmp_path):
    assert "is not UTF-8 text" in refused(uc.Manifest.load, write(tmp_path, b"seed: \xff\n"))


# ------------------------------------------------------------------ values that escaped as raw exceptions
BIG = "1" + "0" * 5000


@pytest.mark.parametrize(
    "line",
    [f"seed: {BIG}\n", f"seed: 0x1{'0' * 5000}\n", f"seed: {BIG}:30\n", f"extra: {{n: -{BIG}}}\n",
     f"extra: {{{BIG}: 1}}\n", f"extra: {{n: [1, 2, 0{'7' * 5000}]}}\n", f"seed: 0b1{'0' * 20000}\n"],
    ids=["decimal", "hex", "sexagesimal", "negative", "key", "octal", "binary"],
)
def test_yaml_integers_of_thousands_of_digits(tmp_path, line):
    refused(uc.Manifest.load, write(tmp_path, GOOD_YAML + line))


def test_json_integer_of_thousands_of_digits(tmp_path):
    refused(uc.Manifest.load, write(tmp_path, f'{{"global_batch_size": {BIG}, "datasets": {{}}}}', "run.json"))


@pytest.mark.parametrize("raw", [{**GOOD, "seed": 10**5000}, {**GOOD, "extra": {"n": -(10**5000)}},
                                 {**GOOD, "extra": {"n": [2**70]}}])
def test_from_dict_integers_outside_cbor_range(raw):
    assert "is outside the CBOR integer range" in refused(uc.Manifest.from_dict, raw)


@pytest.mark.parametrize(
    "text",
    ['{"\\ud800": 1, "global_batch_size": 48, "datasets": {}}',
     '{"global_batch_size": 48, "datasets": {}, "spec_version": "\\ud800"}',
     '{"global_batch_size": 48, "datasets": {}, "policy": {"\\udfff": "x"}}',
     '{"global_batch_size": 48, "datasets": {"t\\ud800": {"id": 1, "version": 1, "hash": "h", "cardinality": 1}}}'],
)
def test_json_lone_surrogates(tmp_path, text):
    assert "is not valid Unicode text" in refused(uc.Manifest.load, write(tmp_path, text, "run.json"))


def test_yaml_and_dict_lone_surrogates(tmp_path):
    refused(uc.Manifest.load, write(tmp_path, GOOD_YAML + 'spec_version: "\\ud800"\n'))
    refused(uc.Manifest.from_dict, {**GOOD, "spec_version": "\ud800"})
    refused(uc.Manifest.from_dict, {**GOOD, "env": {"\udc80": 1}})


@pytest.mark.parametrize("value", ["2001-13-01", "2001-02-30", "2001-01-01 25:00:00"])
def test_yaml_impossible_dates(tmp_path, value):
    assert "a value cannot be read" in refused(uc.Manifest.load,
                                               write(tmp_path, GOOD_YAML + f"extra: {{d: {value}}}\n"))


# ------------------------------------------------------------------ command line
def test_cli_unknown_key_exit_2_and_pointer(tmp_path, capsys):
    path = write(tmp_path, GOOD_YAML + "sead: 42\n")
    assert cli.main([NEXT_BATCH[0], str(path), *NEXT_BATCH[1:]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error INVALID_MANIFEST: unknown key 'sead' (did you mean 'seed'?)")
    assert "(see docs/manifest.md)" in err and len(err.strip().splitlines()) == 1


def run_cli(path: Path) -> subprocess.CompletedProcess:
    """In a child process with a timeout: a manifest that made the loader hang must fail the test, not hang it."""
    return subprocess.run([sys.executable, "-m", "umlos_cuda.cli", NEXT_BATCH[0], str(path), *NEXT_BATCH[1:]],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_cli_fifo_is_refused_without_blocking(tmp_path):
    """A FIFO with no writer blocked the loader forever."""
    path = tmp_path / "run.yaml"
    os.mkfifo(path)
    result = run_cli(path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error INVALID_MANIFEST:") and "is a FIFO, not a regular file" in result.stderr


@pytest.mark.parametrize("levels", [8, 10])
def test_cli_alias_bomb_exit_2(tmp_path, levels):
    """8 levels took 173 s and 2.8 GB before being accepted; 10 never finished."""
    result = run_cli(write(tmp_path, alias_bomb(levels)))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error INVALID_MANIFEST:") and "aliases expanded" in result.stderr


# ------------------------------------------------------------------ docs/manifest.md and bundled manifests
def doc_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_docs_example_loads_with_the_stated_hashes(tmp_path):
    text = DOC.read_text()
    example = re.search(r"cat > run.yaml <<'EOF'\n(.*?)\nEOF\n", doc_blocks("sh")[0], flags=re.S).group(1)
    loaded = uc.Manifest.load(write(tmp_path, example))
    stated_hash = re.search(r"`manifest_hash` is\s+`([0-9a-f]{64})`", text).group(1)
    stated_token = re.search(r"replay token\s+`([0-9a-f]{64})`", text).group(1)
    assert (loaded.hash.hex(), loaded.replay_token.hex()) == (stated_hash, stated_token)
    assert set(loaded.canonical) == set(manifest_module.TOP_LEVEL_KEYS)  # it states every key


def test_docs_merge_example_loads(tmp_path):
    loaded = uc.Manifest.load(write(tmp_path, "global_batch_size: 8\n" + doc_blocks("yaml")[0]))
    assert loaded.dataset("train").cardinality == 1000000000


def test_docs_key_table_is_the_schema():
    rows = re.findall(r"^\| `([a-z_.A-Z]+)` \|", DOC.read_text(), flags=re.M)
    documented = {row.replace(".KEY.", ".<KEY>.") for row in rows}
    assert documented == set(ALL_PATHS)


def test_bundled_manifests_load_with_unchanged_hashes():
    paths = sorted((ROOT / "umlos_cuda" / "manifests").glob("*.yaml"))
    assert paths
    for path in paths:
        assert uc.Manifest.load(path).hash == oracle.manifest_hash(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize("call,code", [(lambda: uc.Cursor(10**5000, 0), errors.INVALID_CURSOR),
                                       (lambda: uc.Cursor(0, -(10**5000)), errors.INVALID_CURSOR),
                                       (lambda: uc.next_batch(GOOD, "train", world_size=10**5000, backend="numpy"),
                                        errors.INVALID_MANIFEST)])
def test_huge_integer_arguments_are_refused_with_their_code(call, code):
    """The uint64 check's message prints the value, and str() of 5000 digits raises ValueError."""
    with pytest.raises(uc.UmlosError) as info:
        call()
    assert info.value.code == code and "an integer of 16610 bits" in info.value.message
