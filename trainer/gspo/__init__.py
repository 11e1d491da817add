"""GSPO: LoRA reinforcement learning with sequence-level importance ratios
(GSPO paper; TRL's importance_sampling_level="sequence"). Imports zoo.trainer's tasks, rewards, schedule,
report, lora and envs, and registry; never sft."""
