"""docker-compose.yml is structurally sound (no Docker engine here to run it)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_compose_declares_gpu_volume_and_healthcheck() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    svc = compose["services"]["torchyard"]
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert any(v.startswith("torchyard-data:/data") for v in svc["volumes"])
    assert "torchyard-data" in compose["volumes"]
    assert svc["healthcheck"]["test"] and svc["init"] is True
    assert svc["environment"]["TORCHYARD_HOME"] == "/data"
    assert (ROOT / "Dockerfile").exists()
