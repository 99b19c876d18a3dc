"""The stages' typed configs and named presets: one module per stage script."""
