"""Supervised LoRA fine-tuning: plain SFT on labelled tasks, rejection-sampling fine-tuning (RFT) on what a
verifier passes, and the distillation of an experience library into an adapter. Imports zoo.trainer's lora,
tasks, rewards, schedule, prompting and report, inference and registry; never gspo."""
