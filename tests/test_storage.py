"""Run storage through ``etils.epath``: local paths and URIs, resumable JSON-lines logs, and a run
launched into ``gs://`` (a local GCS emulator, offline) that resumes there and is evaluated,
reported and exported from it."""
import json
import os
import socket
import subprocess
import sys
from http import HTTPStatus

import pytest

from hindsight import storage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_run_path_keeps_uris_and_makes_local_paths_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert str(storage.run_path("runs/a")) == str(tmp_path / "runs" / "a")
    assert str(storage.run_path("gs://bucket/run") / "checkpoints") == "gs://bucket/run/checkpoints"
    assert storage.is_local("runs/a") and not storage.is_local("gs://bucket/run")
    with pytest.raises(ValueError, match="nope://x/run"):
        storage.run_path("nope://x/run")


def test_jsonl_log_keeps_steps_up_to_the_resumed_one(tmp_path):
    path = tmp_path / "logs" / "metrics.jsonl"
    with storage.JsonlLog(path, keep_through=-1) as log:
        assert log.kept == []
        for step in range(4):
            log.write({"step": step, "x": step * 0.5})
    assert [r["step"] for r in storage.read_jsonl(path)] == [0, 1, 2, 3]
    # resumed from the checkpoint of step 2: step 3 is dropped, it will be logged again
    with storage.JsonlLog(path, keep_through=2) as log:
        assert [r["step"] for r in log.kept] == [0, 1, 2]
        log.write({"step": 3, "x": 9.0})
    assert storage.read_jsonl(path)[-1] == {"step": 3, "x": 9.0}
    assert len(storage.read_jsonl(path)) == 4
    with storage.JsonlLog(path, keep_through=-1):   # a fresh start keeps nothing
        pass
    assert storage.read_jsonl(path) == [] and not list(path.parent.glob(".*.tmp"))


def test_write_json_replaces_whole(tmp_path):
    path = tmp_path / "a" / "config.json"
    storage.write_json(path, {"b": 1, "a": 2}, indent=2, sort_keys=True)
    storage.write_json(path, {"c": 3})
    assert storage.read_json(path) == {"c": 3} and os.listdir(tmp_path / "a") == ["config.json"]


def _with_generation(download):
    """The emulator's media download, answering with the object's generation headers as GCS does."""
    def handler(request, response, storage, *args, **kwargs):
        download(request, response, storage, *args, **kwargs)
        if response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
            response["x-goog-generation"] = str(obj["generation"])
            response["x-goog-metageneration"] = str(obj["metageneration"])
    handler.__wrapped__ = download
    return handler


@pytest.fixture
def gcs(monkeypatch):
    """A GCS server on localhost (``gcp-storage-emulator``, in memory) holding bucket ``bucket``;
    yields the environment that points ``gcsfs`` (epath), TensorStore (orbax) and
    ``google-cloud-storage`` (TensorBoard) at it, also set in this process."""
    from gcp_storage_emulator import server as emulator
    from gcp_storage_emulator.handlers import objects
    # GCS answers a media download with the object's generation in `x-goog-generation`, and
    # TensorStore (orbax's OCDBT manifest) conditions its next read or write on it; the emulator
    # leaves the header out, and checkpoints then fail now and then with "Malformed
    # StorageGeneration". Serve the header as GCS does (the object GET with alt=media calls the
    # module's `download`, the download routes hold the function itself).
    download = _with_generation(objects.download)
    monkeypatch.setattr(objects, "download", download)
    monkeypatch.setattr(emulator, "HANDLERS", tuple(
        (regex, {m: download if h is download.__wrapped__ else h for m, h in table.items()})
        for regex, table in emulator.HANDLERS))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = emulator.create_server("127.0.0.1", port, in_memory=True, default_bucket="bucket")
    server.start()
    url = f"http://127.0.0.1:{port}"
    env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
           "GOOGLE_AUTH_TOKEN_FOR_TESTING": "offline", "NO_GCE_CHECK": "True"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    try:
        yield env
    finally:
        server.stop()


def _python(args, env, cwd):
    return subprocess.run([sys.executable, *args], cwd=cwd, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=900)


def test_run_into_gcs_resumes_and_evaluates_there(gcs, tmp_path):
    """``--workdir=gs://bucket/run``: every run file lands in the bucket (nothing local), a second
    launch with more steps resumes from the bucket's checkpoint, and the evaluation command and
    the report and the export read the run from there. The same run on local disk logs the same losses."""
    launch = ["-m", "experiments.run", "--config=configs/grpo.py:tiny", "--noprogress",
              "--config.eval.num_examples=2", "--config.train.save_every=2"]
    remote = "gs://bucket/run"
    out = _python([*launch, f"--workdir={remote}", "--config.train.num_steps=2"], gcs, ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    out = _python([*launch, f"--workdir={remote}", "--config.train.num_steps=3"], gcs, ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    resumed = json.loads(out.stdout.strip().splitlines()[-1])
    assert (resumed["start_step"], resumed["final_step"]) == (2, 3)
    assert not os.path.exists(os.path.join(ROOT, "gs:"))   # not `<cwd>/gs:/bucket/run`

    run = storage.run_path(remote)
    names = {p.name for p in run.iterdir()}
    assert {"config.json", "metrics.jsonl", "updates.jsonl", "samples.jsonl", "summary.json",
            "checkpoints"} <= names
    assert any(n.startswith("events.out.tfevents") for n in names)
    assert {p.name for p in (run / "checkpoints").iterdir()} >= {"2", "3"}
    metrics = storage.read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in metrics] == [0, 1, 2, 3]   # every step once across the two launches
    assert [r["step"] for r in storage.read_jsonl(run / "samples.jsonl")] == [1, 2, 3]
    assert storage.read_json(run / "summary.json")["steps"] == 3

    local = tmp_path.parent / f"{tmp_path.name}-local"
    out = _python([*launch, f"--workdir={local}", "--config.train.num_steps=3"], {}, ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    here = storage.read_jsonl(local / "metrics.jsonl")
    assert [r.get("loss") for r in here] == [r.get("loss") for r in metrics]
    assert [r.get("reward") for r in here] == [r.get("reward") for r in metrics]

    out = _python(["-m", "experiments.evaluate", "--config=configs/grpo.py:tiny",
                   f"--checkpoint={remote}", f"--output={tmp_path / 'eval'}", "--noprogress",
                   "--config.eval.num_examples=2"], gcs, ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["model"] == f"{remote} (step 3)"
    out = _python(["-m", "experiments.report", remote, "--out", str(tmp_path / "report")], gcs, ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert remote in (tmp_path / "report" / "report.md").read_text()
    out = _python(["-m", "experiments.export", remote, f"--out={tmp_path / 'hf'}"], gcs, ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    exported = json.loads(out.stdout.strip().splitlines()[-1])
    assert exported["step"] == 3 and "model.safetensors" in exported["files"]
