"""The litert family's worker half: its stages, host runtime, per-layer methods and emulated-ARM runner (torch here)."""
