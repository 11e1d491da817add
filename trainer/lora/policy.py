"""The policy a LoRA run trains (GSPO's, the supervised kinds'): a frozen base model with LoRA adapters
(peft), and per-token log-probs.

The reference policy is the same model with its adapters disabled (`reference()`), so no second copy of
the weights is held. Log-probs are taken from the decoder's last hidden states and the LM head at the
completion positions only: the torch path projects just those positions, a fused kernel (GSPO's,
gspo/fused.py, passed in as `fused`) never builds their (tokens x vocabulary) logits at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

ADAPTER_WEIGHTS = "adapter_model.safetensors"

# A fused log-prob kernel: (hidden states (N, H), LM head weight (V, H), targets (N,)) -> log-probs (N,).
ChosenLogprobs = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def position_ids_of(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions as generation gives them to left-padded rows: counting from each row's first real token."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class LoraShape(Protocol):
    """The LoRA fields of a job spec (GSPO's, and the supervised kinds')."""

    @property
    def lora_rank(self) -> int: ...
    @property
    def lora_alpha(self) -> float: ...
    @property
    def lora_dropout(self) -> float: ...
    @property
    def target_modules(self) -> tuple[str, ...]: ...


class LoraPolicy:
    """A causal LM wrapped with LoRA adapters; only the adapters are trainable."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model  # a peft PeftModelForCausalLM
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, path: Path, spec: LoraShape, device: str = "cpu") -> LoraPolicy:
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from zoo.inference.model_loading import MODEL_LOADING

        with MODEL_LOADING:
            tokenizer = AutoTokenizer.from_pretrained(path)
            # fp32 master weights: the adapters train in fp32 and a seeded run is reproducible; `bf16`
            # autocasts the forward passes instead of storing the model in bf16.
            base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        present = {name.rsplit(".", 1)[-1] for name, _ in base.named_modules()}
        missing = [m for m in spec.target_modules if m.rsplit(".", 1)[-1] not in present]
        if missing:
            raise ValueError(f"target_modules: the model has no module named {', '.join(missing)}")
        config = LoraConfig(
            r=spec.lora_rank,
            lora_alpha=spec.lora_alpha,
            lora_dropout=spec.lora_dropout,
            target_modules=list(spec.target_modules),
            task_type="CAUSAL_LM",
        )
        return cls(get_peft_model(base, config), tokenizer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """The reference policy: the base model, adapters off, for as long as the context lasts."""
        with self.model.disable_adapter():
            yield

    def hidden_and_head(
        self, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the last hidden states predicting each completion token (B, T, H), the LM head weight (V, H))."""
        base = self.model.get_base_model()
        out = base.model(
            input_ids=sequences,
            attention_mask=attention_mask,
            position_ids=position_ids_of(attention_mask),
            use_cache=False,
        )
        # The state at position t predicts token t + 1: the completion's tokens are predicted from
        # prompt_length - 1 up to the second-to-last position.
        hidden = out.last_hidden_state[:, prompt_length - 1 : -1, :]
        return hidden, base.lm_head.weight

    def token_logprobs(
        self,
        sequences: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_length: int,
        *,
        fused: ChosenLogprobs | None = None,
        autocast_bf16: bool = False,
    ) -> torch.Tensor:
        """log π(completion token | everything before it), (B, T) in fp32, T = sequences' length - prompt;
        through the `fused` kernel when given, else the plain torch path."""
        targets = sequences[:, prompt_length:]
        bf16 = torch.autocast(self.device.type, dtype=torch.bfloat16)
        with bf16 if autocast_bf16 else contextlib.nullcontext():
            hidden, weight = self.hidden_and_head(sequences, attention_mask, prompt_length)
        if autocast_bf16:
            # The LM head as autocast would run it: bf16 inputs. Both paths below then sum the (exact)
            # products in fp32, so their log-probs agree and the ratio's small differences stay visible.
            hidden, weight = hidden.bfloat16(), weight.bfloat16()
        if fused is not None:
            flat = fused(hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1))
            return flat.view(targets.shape)
        logits = hidden.float() @ weight.float().T
        return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    def save_adapter(self, directory: Path) -> None:
        """The adapters as peft writes them (adapter_config.json, adapter_model.safetensors)."""
        self.model.save_pretrained(str(directory), safe_serialization=True)

    def load_adapter_weights(self, directory: Path) -> None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        state = load_file(str(directory / ADAPTER_WEIGHTS), device=str(self.device))
        result = set_peft_model_state_dict(self.model, state)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"{directory}: adapter weights this model does not have: {unexpected[:3]}")
