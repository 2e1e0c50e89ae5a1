"""The core every stage uses: errors, processes and signals, the engine, the registry client,
state paths, labels, output and the embedded registry. Imports nothing outside `builder.core`."""
