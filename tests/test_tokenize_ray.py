"""``data tokenize --engine ray``: the tokenization as a Ray Data job, on a real local cluster.

The cluster (tests/ray_cluster.py) is a head node without CPUs and two
worker nodes of one CPU each, started once for this module on free ports in
a temporary folder, and stopped by the fixture whatever the tests did; the
fixture then checks that none of its processes is left. Each job runs as the
command line does, in a child process that connects to the cluster with
``--ray-address`` (so this process never joins Ray).

What is proved: the store the job writes holds, file for file, the bytes of
``tokenize_sharded`` on one machine (decision 3 of the sharded stores), for
a dataset of three files in three formats, the largest first so that it
finishes last; a file with a bad record fails the job with the code and
message ``tokenize_sharded`` gives, leaving no output and no staging folder.
Without a cluster: a missing Ray is BACKEND_UNAVAILABLE naming the extra,
Ray's own failure (a dead worker) is DISTRIBUTED_JOB_FAILED with the
staging folder removed, and an append into a store another writer holds is
SHARDED_STORE_LOCKED before the job starts. The cluster tests skip, with the reason, where Ray
is not installed (``make test`` installs the ``ray`` extra).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from batching_cases import corpus, expect, train_tokenizer, write_model_dir
from ray_cluster import LocalRayCluster
from umlos_cuda import errors
from umlos_cuda.batching.tokens import distributed
from umlos_cuda.batching.tokens.sharded import ShardedTokenStore, tokenize_sharded
from umlos_cuda.errors import UmlosError

ROOT = Path(__file__).resolve().parent.parent
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="Ray is not installed: pip install 'umlos-cuda[ray]' (make test installs it)")
#: A job's child process: its interpreter start, Ray's import and connection, three small files.
JOB_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def cluster():
    with LocalRayCluster(workers=2) as running:  # stop() runs on any exit and raises if a process survives
        yield running


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return write_model_dir(tmp_path_factory.mktemp("model") / "tok", train_tokenizer())


def write_dataset(folder: Path, bad_line: int | None = None) -> list[str]:
    """Three files of one dataset, in three formats and of three sizes (the first the largest):
    ``part-0.jsonl`` (ids of its own), ``part-1.parquet`` and ``part-2.jsonl.gz`` (no ids: content ids).
    ``bad_line``: that line of part-2 is not JSON."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    texts = corpus(420, seed=5)
    with open(folder / "part-0.jsonl", "w", encoding="utf-8") as handle:
        for i, text in enumerate(texts[:300]):
            handle.write(json.dumps({"id": f"doc-{i}", "text": text}) + "\n")
    pq.write_table(pa.table({"text": texts[300:380]}), folder / "part-1.parquet")
    lines = [json.dumps({"text": text}) for text in texts[380:]]
    if bad_line is not None:
        lines[bad_line] = "{not json"
    with gzip.open(folder / "part-2.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    return [str(folder / name) for name in ("part-0.jsonl", "part-1.parquet", "part-2.jsonl.gz")]


def files_of(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def run_job(cluster: LocalRayCluster, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``umlos-cuda data tokenize --engine ray --ray-address ADDRESS ARGS`` in a child process."""
    env = dict(cluster.env, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "umlos_cuda.cli", "data", "tokenize", "--engine", "ray",
                           "--ray-address", cluster.address, "--quiet", *args], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)


def hidden_left(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith("."))


@needs_ray
def test_the_ray_job_writes_the_bytes_of_the_single_machine_path(cluster, tokenizer_dir, tmp_path):
    paths = write_dataset(tmp_path / "data")
    single = tokenize_sharded(paths, tokenizer_dir, tmp_path / "single")
    # relative paths, as a user types them: the workers run elsewhere and get them made absolute
    result = run_job(cluster, tmp_path, "--dataset", "data/part-0.jsonl", "data/part-1.parquet",
                     "data/part-2.jsonl.gz", "--tokenizer", os.path.relpath(tokenizer_dir, tmp_path),
                     "--output", "ray-store")
    assert result.returncode == 0, result.stderr
    assert f"dataset_hash {single.dataset_hash}" in result.stdout.splitlines()
    written, expected = files_of(tmp_path / "ray-store"), files_of(tmp_path / "single")
    assert sorted(written) == sorted(expected)
    assert [name for name in written if name.startswith("shards/") and name.endswith("/meta.json")] == \
        ["shards/00000/meta.json", "shards/00001/meta.json", "shards/00002/meta.json"]
    for name, data in expected.items():
        assert written[name] == data, f"{name} differs from the single-machine store"
    store = ShardedTokenStore.open(tmp_path / "ray-store")
    assert store.verify()["samples"] == len(single) == 420
    assert hidden_left(tmp_path) == []  # the staging folder is gone


@needs_ray
def test_a_failing_file_fails_the_job_with_its_error_and_leaves_nothing(cluster, tokenizer_dir, tmp_path):
    paths = write_dataset(tmp_path / "data", bad_line=7)
    with pytest.raises(UmlosError) as single:
        tokenize_sharded(paths, tokenizer_dir, tmp_path / "single")
    assert single.value.code == errors.DATASET_RECORD_INVALID
    result = run_job(cluster, tmp_path, "--dataset", *paths, "--tokenizer", str(tokenizer_dir),
                     "--output", str(tmp_path / "ray-store"))
    assert result.returncode == 2, result.stderr
    assert f"error {single.value.code}: {single.value.message}" in result.stderr.splitlines()
    assert "Traceback" not in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["data"]  # no store, no staging folder


def test_without_ray_the_engine_names_the_extra(monkeypatch, tokenizer_dir, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    paths = write_dataset(tmp_path / "data")
    error = expect(errors.BACKEND_UNAVAILABLE, distributed.tokenize_on_ray, paths, tokenizer_dir, tmp_path / "out")
    assert "pip install 'umlos-cuda[ray]'" in error.message
    assert sorted(os.listdir(tmp_path)) == ["data"]


class DeadWorkerRay:
    """A stand-in for the ``ray`` module whose job fails as a dead worker fails it: ``iter_rows``
    raises Ray's error after the first file has been staged."""

    class ActorDiedError(RuntimeError):
        pass

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.data = self

    def is_initialized(self) -> bool:
        return False

    def init(self, **kwargs) -> None:
        self.calls.append("init")

    def shutdown(self) -> None:
        self.calls.append("shutdown")

    def cluster_resources(self) -> dict:
        return {"CPU": 2.0}

    class DataContext:
        @staticmethod
        def get_current():
            class Options:
                preserve_order = True

            class Context:
                enable_progress_bars = True
                execution_options = Options()

            return Context()

    def ActorPoolStrategy(self, **kwargs):
        return kwargs

    def from_items(self, items, **kwargs):
        self.items = items
        return self

    def map(self, task, *, fn_constructor_kwargs, **kwargs):
        self.task = task(**fn_constructor_kwargs)
        return self

    def iter_rows(self):
        yield self.task(self.items[0])  # the first file is written to the staging folder
        raise self.ActorDiedError("The actor died unexpectedly before finishing this task.")


def test_rays_own_failure_is_distributed_job_failed_and_removes_the_staging(monkeypatch, tokenizer_dir, tmp_path):
    fake = DeadWorkerRay()
    monkeypatch.setattr(distributed, "ray_module", lambda: fake)
    paths = write_dataset(tmp_path / "data")
    error = expect(errors.DISTRIBUTED_JOB_FAILED, distributed.tokenize_on_ray, paths, tokenizer_dir, tmp_path / "out")
    assert "ActorDiedError: The actor died unexpectedly" in error.message
    assert fake.calls == ["init", "shutdown"]  # the job connected, so it disconnects
    assert sorted(os.listdir(tmp_path)) == ["data"]  # the staged shard went with its folder


def test_an_append_is_refused_before_the_job_while_another_writer_holds_the_store(monkeypatch, tokenizer_dir,
                                                                                 tmp_path):
    from umlos_cuda.batching.tokens.adopt import LOCK_FILE
    from umlos_cuda.files.folder import Folder
    from umlos_cuda.files.lock import FolderLock

    fake = DeadWorkerRay()
    monkeypatch.setattr(distributed, "ray_module", lambda: fake)
    paths = write_dataset(tmp_path / "data")
    tokenize_sharded(paths[1:], tokenizer_dir, tmp_path / "store")
    with Folder.open(str(tmp_path / "store")) as store, FolderLock.take(store, LOCK_FILE):  # the other writer
        expect(errors.SHARDED_STORE_LOCKED, distributed.tokenize_on_ray, paths[:1], tokenizer_dir, tmp_path / "store",
               append=True, mention=f"process {os.getpid()},")
    assert fake.calls == []  # refused before the job connected: no file was tokenized
    assert sorted(os.listdir(tmp_path)) == ["data", "store"]
    assert ShardedTokenStore.open(tmp_path / "store").num_parts == 2


def test_ray_address_goes_with_the_ray_engine(tokenizer_dir, tmp_path, capsys):
    from umlos_cuda.cli import main

    paths = write_dataset(tmp_path / "data")
    with pytest.raises(SystemExit) as exit_status:
        main(["data", "tokenize", "--dataset", *paths, "--tokenizer", str(tokenizer_dir), "--output",
              str(tmp_path / "out"), "--sharded", "--ray-address", "127.0.0.1:6379"])
    assert exit_status.value.code == 2
    assert "--ray-address goes with --engine ray" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["data"]
