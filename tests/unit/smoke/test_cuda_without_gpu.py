"""The `cuda` check of a CUDA image given no GPU (a CPU host, a build runner): it skips naming
what is missing without loading torch, since every build's smoke runs it (issue 39)."""

from __future__ import annotations

import sys

import pytest

from smoke import SKIP
from smoke.checks import common, cuda


def test_a_cuda_image_with_no_device_nodes_skips_without_importing_torch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises
    monkeypatch.setattr(common, "_dev_nvidia", lambda: ["/dev/nvidiactl"])
    got = cuda.run({"facts": {"accelerator": "cuda", "cuda": "13.2"}})
    assert (got["status"], got["message"]) == (SKIP, common.NO_DEVICE_NODES)
    assert got["metrics"] == {"device_count": 0}


def test_without_facts_torch_still_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    """No facts file (`torch-smoke` in someone else's image): what the torch was built for
    decides, as before; here a torch that cannot be imported is the check's error."""
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setattr(common, "_dev_nvidia", lambda: [])
    with pytest.raises(ImportError):
        cuda.run({})
