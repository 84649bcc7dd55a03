"""Service settings, read once from the environment (prefix ``TORCHYARD_``) and injected."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def split_dirs(value: str | None) -> list[str]:
    """``'a:b,c'`` → ``['a', 'b', 'c']`` (os.pathsep or comma; blanks dropped)."""
    if not value:
        return []
    return [p.strip() for p in value.replace(",", os.pathsep).split(os.pathsep) if p.strip()]


class Settings(BaseSettings):
    """Everything the service can be configured with. Built by ``Settings()`` at the edge only."""

    model_config = SettingsConfigDict(env_prefix="TORCHYARD_", extra="ignore")

    home: Path = Field(default=Path(".torchyard"), description="database and run directories")
    database_url: str | None = Field(default=None, description="any SQLAlchemy URL; default SQLite")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    public_url: str | None = Field(
        default=None, description="URL ranks use to reach the API; default http://<host>:<port>"
    )
    gpus: str | None = Field(default=None, description="'0,1,2' or 'none'; default: detect")
    cpu_slots: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1, le=4096)
    poll_interval_s: float = Field(default=0.2, gt=0, le=10)
    stop_grace_s: float = Field(default=10.0, ge=0, le=600)
    metrics_page_max: int = Field(default=10_000, ge=1)
    python_executable: str | None = Field(default=None, description="python that runs torchrun")
    script_dirs: str | None = Field(
        default=None,
        description="directories script jobs may run from, separated by ':' (os.pathsep) or ','; "
        "unset = script jobs disabled",
    )

    @field_validator("script_dirs")
    @classmethod
    def _script_dirs_exist(cls, value: str | None) -> str | None:
        for part in split_dirs(value):
            path = Path(part).resolve()
            if not path.is_dir():
                raise ValueError(f"TORCHYARD_SCRIPT_DIRS: {part!r} is not a directory")
            if path == Path(path.anchor):
                raise ValueError("TORCHYARD_SCRIPT_DIRS: the filesystem root is not allowed")
        return value

    @property
    def script_dir_list(self) -> list[Path]:
        """The resolved script directories, in order; empty = script jobs disabled."""
        return [Path(part).resolve() for part in split_dirs(self.script_dirs)]

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.home / 'torchyard.db').resolve()}"

    def api_url_for_workers(self, bound_port: int | None = None) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{bound_port or self.port}"
