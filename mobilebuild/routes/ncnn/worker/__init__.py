"""The ncnn family's worker half: its stage (pnnx's conversion) and host runtime (torch here)."""
