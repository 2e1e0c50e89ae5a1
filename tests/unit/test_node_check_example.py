"""The Kubernetes node check takes the GPU count and the device plugin's resource name."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import yaml

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node-check-job.yaml"


def render(**values: str) -> dict:
    """What `envsubst '$NODE $IMAGE $GPUS $GPU_RESOURCE'` makes of the example."""
    return yaml.safe_load(string.Template(EXAMPLE.read_text()).safe_substitute(values))


@pytest.mark.parametrize(("gpus", "resource"), [
    ("1", "nvidia.com/gpu"), ("8", "nvidia.com/gpu"), ("1", "nvidia.com/mig-1g.10gb"),
])
def test_the_job_asks_for_the_given_gpus(gpus: str, resource: str) -> None:
    job = render(NODE="gpu-7", IMAGE="reg/torch@sha256:" + "a" * 64, GPUS=gpus,
                 GPU_RESOURCE=resource)
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert pod["nodeName"] == "gpu-7" and container["image"].endswith("a" * 64)
    assert container["resources"]["limits"] == {resource: int(gpus)}
    assert container["command"] == ["torch-smoke", "--require-gpu"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    assert job["metadata"]["name"] == "torch-node-check-gpu-7"  # one Job per node


def test_the_comments_give_the_failure_mode_nodename_really_has() -> None:
    # nodeName skips the scheduler: the kubelet rejects a pod it cannot admit, the Job fails.
    text = " ".join(EXAMPLE.read_text().split())
    assert "WITHOUT the scheduler" in text and "kubelet reject" in text
    assert "BackoffLimitExceeded" in text and "Pending (unschedulable)" not in text


def test_every_placeholder_is_documented() -> None:
    text = EXAMPLE.read_text()
    names = {m.group("braced") for m in string.Template.pattern.finditer(text)
             if m.group("braced")}
    assert names == {"NODE", "IMAGE", "GPUS", "GPU_RESOURCE"}
    assert "envsubst '$NODE $IMAGE $GPUS $GPU_RESOURCE'" in text
