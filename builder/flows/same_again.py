"""`build --stage --verify-reproducible`: before an image is staged and its evidence signed, it
is built again with no cache at all (neither the registry's nor BuildKit's own) and must give
the same image id (issue 40.1, the optional half). A cache, even a signed one, hands back layers
without running their steps; a rebuild from the inputs alone is what says those layers are what
the inputs make. It costs a full build, so it is an option (CI's weekly job runs it). On a
difference the layers are compared as `builder reproduce` compares them (core.layerdiff).
"""

from __future__ import annotations

from dataclasses import replace

from builder.core import engine, layerdiff, reproducible
from builder.core.errors import BuilderError
from builder.core.output import step
from builder.stages import build


def rebuilt(spec: build.Spec) -> tuple[str, str]:
    """(image id, local tag) of `spec` built again without any cache, its config normalised as
    the build's own."""
    again = replace(spec, image=f"{spec.image}-again", log=spec.log.with_suffix(".again.log"),
                    no_cache=True)
    step(f"  [{spec.key}] building again without any cache (log: {again.log})")
    return reproducible.normalise_image(build.docker_build(again), again.image), again.image


def check(spec: build.Spec, image_id: str) -> None:
    """Nothing when a cache-free rebuild of `spec` gives `image_id`; else BuilderError naming
    the first layer that differs (the rebuilt image is removed either way)."""
    again, ref = rebuilt(spec)
    try:
        if again == image_id:
            step(f"  [{spec.key}] reproducible: a cache-free rebuild gives the same image "
                 f"{image_id[:19]}")
            return
        with layerdiff.saved(image_id, again) as images:
            rows = [r for r in layerdiff.compare(images, image_id, again) if r.a != r.b]
    finally:
        engine.remove_image(ref)
    raise BuilderError(difference(spec.key, image_id, again, rows),
                       hint="nothing was staged or signed: find what the step does not fix "
                       "(`builder reproduce` explains the same table for a published image)")


def difference(key: str, image_id: str, again: str, rows: list[layerdiff.LayerRow]) -> str:
    """The one-line error for a rebuild that gave another image."""
    first = (f": layer {rows[0].index} (`{rows[0].step[:80]}`) differs, first paths "
             f"{', '.join(rows[0].paths[:3]) or '-'}") if rows else ""
    return (f"{key}: not reproducible: a cache-free rebuild gives {again[:19]}, not "
            f"{image_id[:19]} ({len(rows)} layers differ){first}")
