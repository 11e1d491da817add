"""Environments a policy acts in over several turns (tools, episodes), for GSPO and TF-GRPO. Imports
zoo.trainer's tasks and rewards, inference and registry."""
