"""Environments a policy acts in over several turns (tools, episodes), for GSPO and TF-GRPO."""
