"""zoo.trainer.tfgrpo: Training-Free GRPO: the loop (loop.py) and its stages (credit.py, lessons.py,
worked_examples.py, selection.py, over step_work.py), the run state and report (run_state.py), its three
LLM stages (critic.py), the library operations they propose (operations.py), expert-factor distillation
(distill.py), the spec and the job (spec.py, job.py) and the LLM caller (llm.py). Imports zoo.trainer's
tasks, rewards, schedule and report."""
