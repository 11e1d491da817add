"""zoo.trainer: TF-GRPO and GSPO learning jobs, rewards and the agent environment."""
