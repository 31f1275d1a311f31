"""The engine's test kit: a manual clock, the engine harness, run specs, in-memory logs, a stand-in NVML."""
