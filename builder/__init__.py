"""torch-images: matrix → locks → Dockerfiles → images → smoke → SBOM → published tags."""

__version__ = "0.1.0"
