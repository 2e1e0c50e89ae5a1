"""The pipeline's stages, one module each: matrix → locks → render → plan → base → build → smoke
→ evidence → publish. A stage imports the core and earlier stages, never a command."""
