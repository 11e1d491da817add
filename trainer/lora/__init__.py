"""zoo.trainer.lora: the LoRA core every adapter-training job shares (GSPO in trainer/gspo; SFT, RFT and
distill in trainer/sft): the policy with its adapters (policy.py), sampling its rollouts (rollouts.py), the
run's optimiser, validation and curve (run.py), the adapters' spec (spec.py), the processes a run spans
(processes.py, zero.py and its shipped zero2.json, rendezvous.py) and the `accelerate launch` of their
workers (launch.py). Imports zoo.trainer's tasks, rewards, schedule and prompting, inference and
registry; never gspo or sft, which import it."""
