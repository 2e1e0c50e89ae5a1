"""Tables and models the pipeline reads: the matrix, platforms, flavors, tags, publications and
GPU host facts. They import only `builder.core` and each other, so every layer may read them."""
