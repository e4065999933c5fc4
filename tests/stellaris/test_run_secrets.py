"""config.yaml keeps no secret (stellaris/platform/secrets.py): what is written, and what a config read back asks
for before it runs."""

from __future__ import annotations

import pytest

from stellaris.platform.secrets import missing_secret, without_secrets


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("redis://:s3cret@redis:6379/0", "redis://:***@redis:6379/0"),
        ("rediss://job:s3cret@10.0.0.5:6380/1", "rediss://job:***@10.0.0.5:6380/1"),
        ("redis+cluster://:s3cret@node-1:7000", "redis+cluster://:***@node-1:7000"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        (None, None),
    ],
)
def test_the_redis_password_is_not_kept(url: str | None, kept: str | None) -> None:
    config = {"env": "Hopper-v5", "redis_url": url, "gateway_token": None}
    assert without_secrets(config) == {"env": "Hopper-v5", "redis_url": kept, "gateway_token": None}
    assert config["redis_url"] == url  # the run's own config is left as it was


def test_the_gateway_token_is_not_kept() -> None:
    assert without_secrets({"gateway_token": "t0ken", "redis_url": None})["gateway_token"] == "***"


def test_a_config_read_back_asks_for_what_it_lacks() -> None:
    assert missing_secret(None, None) is None
    assert missing_secret("redis://:s3cret@redis:6379/0", "t0ken") is None
    lacks_password = missing_secret("redis://:***@redis:6379/0", None)
    assert lacks_password is not None and "--redis-url or REDIS_URL" in lacks_password
    lacks_token = missing_secret("redis://redis:6379/0", "***")
    assert lacks_token is not None and "--gateway-token or STELLARIS_GATEWAY_TOKEN" in lacks_token
