"""zoo.trainer: learning jobs: tasks, rewards, TF-GRPO, GSPO and the agent environments. Imports
zoo.inference and zoo.registry; only zoo.node imports it."""
