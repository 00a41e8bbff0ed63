"""deploy/kuberay/rayservice.yaml stays valid: it parses, its Serve config names the applications, import paths,
arguments, settings and port the code has, and its builders make the two Serve applications (docs/cluster.md)."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml

from lingua_fusion.cluster import deploy
from lingua_fusion.cluster.gateway import MODELS_APP
from lingua_fusion.config import Settings

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kuberay" / "rayservice.yaml"
pytestmark = pytest.mark.timeout(120)


def manifest() -> dict[str, Any]:
    doc = yaml.safe_load(MANIFEST.read_text())
    assert isinstance(doc, dict)
    return doc


def serve_config() -> dict[str, Any]:
    config = yaml.safe_load(manifest()["spec"]["serveConfigV2"])
    assert isinstance(config, dict)
    return config


def test_the_manifest_is_a_rayservice_with_head_and_worker_groups() -> None:
    doc = manifest()
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayService")
    cluster = doc["spec"]["rayClusterConfig"]
    import ray

    assert cluster["rayVersion"] == ray.__version__  # the Ray the code is tested with
    assert cluster["headGroupSpec"]["template"]["spec"]["containers"]
    assert all(g["minReplicas"] <= g["replicas"] <= g["maxReplicas"] for g in cluster["workerGroupSpecs"])


def test_its_serve_config_names_what_the_code_has() -> None:
    config = serve_config()
    apps = {a["name"]: a for a in config["applications"]}
    assert set(apps) == {MODELS_APP, deploy.GATEWAY_APP}
    assert apps[deploy.GATEWAY_APP]["route_prefix"] == "/" and apps[MODELS_APP]["route_prefix"] is None
    spec_fields = set(inspect.signature(deploy.ClusterSpec).parameters)
    for app in apps.values():
        module, name = app["import_path"].split(":")
        assert callable(getattr(importlib.import_module(module), name))
        assert set(app.get("args", {})) <= spec_fields, app["args"]
    ports = {p["containerPort"] for p in manifest()["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
             ["containers"][0]["ports"]}
    assert config["http_options"]["port"] in ports


def test_every_setting_the_manifest_sets_is_one_the_server_reads() -> None:
    head = manifest()["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    names = [e["name"] for e in head["env"] if e["name"].startswith("LINGUAFUSION_")]
    assert "LINGUAFUSION_STATE__REDIS_URL" in names
    for name in names:
        section, _, field = name.removeprefix("LINGUAFUSION_").lower().partition("__")
        assert field in type(getattr(Settings(), section)).model_fields, name


def test_the_builders_make_both_applications(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.serve import Application

    apps = {a["name"]: a for a in serve_config()["applications"]}
    assert isinstance(deploy.build_models(apps[MODELS_APP]["args"]), Application)
    with pytest.raises(ValueError, match="LINGUAFUSION_STATE__REDIS_URL"):
        deploy.build_gateway(apps[deploy.GATEWAY_APP]["args"])  # refused as `serve --cluster` refuses
    monkeypatch.setenv("LINGUAFUSION_STATE__REDIS_URL", "redis://127.0.0.1:6379/0")
    assert isinstance(deploy.build_gateway(apps[deploy.GATEWAY_APP]["args"]), Application)


@pytest.mark.parametrize(("gateways", "nodes", "per_node"), [(2, 2, 1), (4, 2, 2), (3, 2, 2), (2, 1, 2), (2, 5, 1)])
def test_gateways_spread_evenly_over_the_nodes(gateways: int, nodes: int, per_node: int) -> None:
    """At most ceil(gateways / nodes) gateways on one node (Serve's max_replicas_per_node): one host lost takes only
    its share; tests/e2e/test_cluster.py sees the two gateways of its two-node cluster on both nodes."""
    assert deploy.gateways_per_node(gateways, nodes) == per_node
