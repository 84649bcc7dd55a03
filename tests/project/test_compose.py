"""docker-compose.yml and the Dockerfile are structurally sound (no Docker engine here to run them)."""

import re

import yaml

from tests.conftest import REPO_ROOT


def _seconds(duration: str) -> float:
    """Compose durations such as ``30s``, ``1m30s``, ``1h``."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s|us)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a duration: {duration}"
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}
    return sum(float(n) * scale[u] for n, u in parts)


def _service() -> tuple[dict, dict]:
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    return compose, compose["services"]["torchyard"]


def test_compose_reserves_gpus_and_keeps_data_on_a_volume() -> None:
    compose, svc = _service()
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert devices[0]["count"] == "all"
    assert any(v.startswith("torchyard-data:/data") for v in svc["volumes"])
    assert "torchyard-data" in compose["volumes"]
    assert svc["environment"]["TORCHYARD_HOME"] == "/data"
    assert "utility" in svc["environment"]["NVIDIA_DRIVER_CAPABILITIES"], "nvidia-smi finds GPUs"


def test_compose_health_init_and_stop_grace() -> None:
    _, svc = _service()
    assert svc["init"] is True
    check = svc["healthcheck"]["test"]
    assert check[0] == "CMD" and "/healthz" in " ".join(check)
    cancel_grace = float(svc["environment"]["TORCHYARD_STOP_GRACE_S"])
    assert _seconds(svc["stop_grace_period"]) > cancel_grace, "the container outlives a cancel"


def test_compose_requires_api_tokens_and_binds_loopback_by_default() -> None:
    _, svc = _service()
    tokens = svc["environment"]["TORCHYARD_API_TOKENS"]
    # ${VAR:?message}: compose refuses to start when the tokens are not set.
    assert re.fullmatch(r"\$\{TORCHYARD_API_TOKENS:\?[^}]+\}", tokens), tokens
    assert all(p.startswith("${TORCHYARD_BIND:-127.0.0.1}:") for p in svc["ports"]), svc["ports"]


def test_dockerfile_serves_with_a_healthcheck_and_ships_the_dashboard() -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    assert re.search(r"^HEALTHCHECK .*\n?.*/healthz", text, re.MULTILINE)
    assert 'CMD ["torchyard", "serve"]' in text
    assert "TORCHYARD_HOME=/data" in text and "VOLUME /data" in text
    assert "plotly.min.js" in text and "dashboard" in text, "the build checks the dashboard assets"
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert ".env" in ignored and ".torchyard" in ignored, "no secrets or local state in the image"
