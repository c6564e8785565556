"""docker/: there is no Docker engine here, so check the files against the code."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import yaml

from spark_integration.conf.backend import CONF_KEYS, CONF_PREFIX, STORAGE_PREFIX

DOCKER = Path(__file__).resolve().parent.parent / "docker"


def compose():
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def demo_conf():
    command = compose()["services"]["demo"]["command"]
    pairs = [command[i + 1] for i, arg in enumerate(command) if arg == "--conf"]
    return dict(pair.split("=", 1) for pair in pairs)


def test_services_and_ports():
    services = compose()["services"]
    assert set(services) == {
        "minio",
        "create-bucket",
        "spark-master",
        "spark-worker-1",
        "spark-worker-2",
        "demo",
    }
    assert "9000:9000" in services["minio"]["ports"]
    assert "7077:7077" in services["spark-master"]["ports"]
    for worker in ("spark-worker-1", "spark-worker-2"):
        assert services[worker]["command"].endswith("spark://spark-master:7077")
    demo = services["demo"]["command"]
    assert demo[:3] == ["python3", "-m", "spark_integration.dev.demo"]
    assert demo[demo.index("--master") + 1] == "spark://spark-master:7077"


def test_demo_conf_keys_are_the_ones_the_backend_reads():
    conf = demo_conf()
    storage = {k[len(STORAGE_PREFIX) :]: v for k, v in conf.items() if k.startswith(STORAGE_PREFIX)}
    plain = {k[len(CONF_PREFIX) :] for k in conf if not k.startswith(STORAGE_PREFIX)}
    assert plain <= set(CONF_KEYS)
    assert "checkpointUri" in plain
    # the storage options are real pyarrow S3FileSystem arguments, pointing at MinIO
    pafs.S3FileSystem(**storage)
    host, port = storage["endpoint_override"].split(":")
    assert host == "minio" and f"{port}:{port}" in compose()["services"]["minio"]["ports"]
    env = compose()["services"]["minio"]["environment"]
    assert (storage["access_key"], storage["secret_key"]) == (
        env["MINIO_ROOT_USER"],
        env["MINIO_ROOT_PASSWORD"],
    )
    bucket = conf[CONF_PREFIX + "checkpointUri"].split("/")[2]
    assert f"local/{bucket}" in compose()["services"]["create-bucket"]["entrypoint"]


def test_dockerfile_installs_the_spark_and_store_extras_of_this_package():
    text = (DOCKER / "Dockerfile").read_text()
    assert "pip install --no-cache-dir '.[spark,s3,gcs]'" in text
    assert "openjdk-17" in text
    for package in ("sessionstore", "spark_integration"):
        assert f"COPY {package} ./{package}" in text
