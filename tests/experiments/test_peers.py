"""``experiments.bench.peers`` skips a peer that is not installed and says why, before it loads
anything (the full benchmark needs `make qwen peers` and runs outside the suite)."""
import json

from experiments.bench import peers


def test_missing_peer_is_skipped_with_its_reason(tmp_path, capsys):
    result = peers.main(["--peer-python", str(tmp_path / "no-venv" / "bin" / "python")])
    assert any("tunix: no venv at" in r and "make peers" in r for r in result["skipped"])
    assert not any(k.startswith("tunix_decode_ratio") for k in result)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == json.loads(json.dumps(result))
