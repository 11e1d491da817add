"""zoo.trainer.tasks: what learning jobs learn from: the Task schema and its JSONL files (schema.py, read in
with each task's verifier checked by loading.py), the shipped task set and convention families and their
generators (generate.py, families.py, data/). Imports zoo.trainer's rewards and schedule, inference and
registry; never a learning loop."""
