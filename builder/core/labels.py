"""The contract between the build and later stages: label keys and the in-image facts file.

Every image carries its facts twice: as OCI/project labels (readable without running it) and in
`HOME`/image.json inside the image (smoke.facts.DEFAULT_FACTS: the smoke suite reads it within).
"""

PREFIX = "io.torch-images."

# Project labels (value: string). `dropped` is a comma-separated list of what slim removed.
TORCH = PREFIX + "torch"
PYTHON = PREFIX + "python"
ACCELERATOR = PREFIX + "accelerator"  # "cpu" | "cuda"
CUDA = PREFIX + "cuda"  # "13.2" ("" on cpu)
CUDNN = PREFIX + "cudnn"
NCCL = PREFIX + "nccl"
TRITON = PREFIX + "triton"
FLAVOR = PREFIX + "flavor"  # "devel" | "runtime" | "slim"
MIN_DRIVER = PREFIX + "min-driver"
VARIANT = PREFIX + "variant"
CONTENT_HASH = PREFIX + "content-hash"
LOCK_HASH = PREFIX + "lock-hash"
DROPPED = PREFIX + "dropped"
# "true" when the build's checkout differed from the revision it names; SOURCE_DIFF then holds
# `sha256:<hex>` of that difference (builder.stages.build.tree_labels).
SOURCE_DIRTY = PREFIX + "source.dirty"
SOURCE_DIFF = PREFIX + "source.diff"

OCI = "org.opencontainers.image."

# Inside every image.
HOME = "/opt/torch-images"
SMOKE_WORKDIR = HOME  # in the image: the smoke package is HOME/smoke; the suite runs with -w here
VENV = "/opt/venv"
USER_UID = 1000
# Every layer's file times and created time: one fixed moment (core/reproducible.py, the
# templates' SOURCE_DATE_EPOCH), so identical layers are identical blobs.
SOURCE_DATE_EPOCH = 1704067200
