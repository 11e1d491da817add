"""Real LoRA adapters for the bundled model, made for tests: random (non-zero) LoRA weights, so an
adapter visibly changes the model's answers without a training run."""

from __future__ import annotations

from pathlib import Path


def random_adapter(model_path: Path, out_dir: Path, seed: int = 0, rank: int = 4) -> Path:
    """Write a PEFT adapter directory for the model at `model_path` into `out_dir`; returns `out_dir`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from zoo.inference.model_loading import MODEL_LOADING

    with MODEL_LOADING:
        base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    torch.manual_seed(seed)
    # init_lora_weights=False: A and B both random, so the adapter is not the identity.
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    model = get_peft_model(base, config)
    model.save_pretrained(out_dir)
    return out_dir
