"""Model assembly: DFlash drafters and Qwen3.5/3.6 MoE."""
