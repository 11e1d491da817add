"""The GSPO objective in plain torch; the fused Triton kernel, when it exists, is checked against it.

GSPO (Group Sequence Policy Optimization) weights each completion by one importance ratio per sequence,
the exponential of the mean per-token log-ratio between the current policy and the policy that sampled
it, and clips that ratio PPO-style. This module computes exactly what TRL's GRPOTrainer computes with
importance_sampling_level="sequence" and loss_type="grpo" (tests/trainer/gspo/test_loss.py runs TRL's own
code on the same tensors), for one micro-batch, before any gradient-accumulation scaling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["GspoLossConfig", "group_advantages", "gspo_loss"]


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> tuple[torch.Tensor, int]:
    """Group-normalised advantages Aᵢ = (rᵢ - mean_g) / (std_g + eps); rewards are laid out group after group.

    std_g is the Bessel-corrected (n - 1) standard deviation of the group, as TRL computes it. A group whose
    rewards are all equal carries no learning signal: its advantages are exactly zero (rather than the
    rounding noise the formula would leave) and it is counted.

    Returns the advantages (same shape and floating dtype as ``rewards``) and the number of zero-variance
    groups.
    """
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 2:
        raise ValueError(f"group_size must be an integer >= 2 (got {group_size!r})")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D, one reward per completion (got shape {tuple(rewards.shape)})")
    if rewards.numel() == 0 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"rewards must hold a positive multiple of group_size={group_size} values (got {rewards.numel()})"
        )
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must all be finite")

    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True, correction=1)
    advantages = (grouped - mean) / (std + eps)
    constant = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    advantages = torch.where(constant, torch.zeros_like(advantages), advantages)
    return advantages.view(-1), int(constant.sum())


@dataclass(frozen=True)
class GspoLossConfig:
    """Clip range and KL weight of the GSPO objective.

    The sequence ratio is clipped to [1 - eps_low, 1 + eps_high]; GSPO's ranges are orders of magnitude
    narrower than token-level PPO's because a sequence ratio is a geometric mean over many tokens.
    """

    eps_low: float = 3e-4
    eps_high: float = 4e-4
    beta: float = 0.0  # weight of the KL penalty to the reference policy; 0 needs no reference log-probs
    # Multiply each sequence's KL term by its (differentiable) ratio sᵢ. This is TRL's use_bias_correction_kl,
    # which TRL enables by default; it changes the KL gradient even where sᵢ == 1.
    kl_ratio_weighted: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.eps_low < 1.0:
            raise ValueError(f"eps_low must be in [0, 1) (got {self.eps_low})")
        if self.eps_high < 0.0:
            raise ValueError(f"eps_high must be >= 0 (got {self.eps_high})")
        if self.beta < 0.0:
            raise ValueError(f"beta must be >= 0 (got {self.beta})")


def _check_shapes(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None,
) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must have shape (B, T) (got {tuple(logp.shape)})")
    for name, tensor in (("old_logp", old_logp), ("mask", mask), ("ref_logp", ref_logp)):
        if tensor is not None and tensor.shape != logp.shape:
            raise ValueError(
                f"{name} must have the shape of logp {tuple(logp.shape)} (got {tuple(tensor.shape)})"
            )
    if advantages.shape != logp.shape[:1]:
        raise ValueError(
            f"advantages must have shape ({logp.shape[0]},), one per sequence (got {tuple(advantages.shape)})"
        )
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask must be boolean or hold only 0 and 1")
    if not bool(mask.any()):
        raise ValueError("mask selects no token: every sequence is empty")


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: GspoLossConfig,
    ref_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GSPO loss of one micro-batch and its metrics.

    Args:
        logp: (B, T) per-token log-probabilities of the completions under the policy being trained.
        old_logp: (B, T) the same under the policy that sampled them; treated as a constant.
        advantages: (B,) one advantage per completion (see ``group_advantages``).
        mask: (B, T) 1 for completion tokens, 0 for padding. Padded positions never affect the value or the
            gradient, whatever they hold (even inf or nan).
        config: clip range and KL weight.
        ref_logp: (B, T) per-token log-probabilities under the reference policy; needed when beta > 0.

    The sequence ratio is sᵢ = exp(Σₜ(logp - old_logp)·mask / max(Σₜ mask, 1)), and the loss of sequence i
    is -min(sᵢAᵢ, clip(sᵢ, 1 - eps_low, 1 + eps_high)·Aᵢ), plus beta times the masked token mean of the k3
    KL estimate exp(ref - logp) - (ref - logp) - 1 (times sᵢ when ``config.kl_ratio_weighted``). The batch
    loss is the mean over all B sequences, a sequence without completion tokens counting as 0. It is not
    divided by the number of gradient-accumulation steps; the caller scales it when it accumulates.

    Returns the scalar loss and detached scalar metrics: ``loss``, ``ratio_mean`` (mean sᵢ),
    ``clip_fraction`` (share of the B sequences where clipping removed the gradient: sᵢ > 1 + eps_high with
    Aᵢ > 0, or sᵢ < 1 - eps_low with Aᵢ < 0; also split as ``clip_fraction_high`` / ``clip_fraction_low``),
    and, when beta > 0, ``kl`` (the k3 estimate averaged over all completion tokens of the batch).
    """
    if config.beta > 0.0 and ref_logp is None:
        raise ValueError("ref_logp is required when beta > 0")
    _check_shapes(logp, old_logp, advantages, mask, ref_logp)

    valid = mask.bool()
    zero = logp.new_zeros(())
    n_tokens = valid.sum(dim=1).to(logp.dtype)
    # Padding is selected away before any arithmetic (not multiplied by 0), so garbage there can't leak a nan.
    token_log_ratio = torch.where(valid, logp - old_logp.detach(), zero)
    seq_log_ratio = token_log_ratio.sum(dim=1) / n_tokens.clamp(min=1.0)
    ratio = torch.exp(seq_log_ratio)

    clipped_ratio = torch.clamp(ratio, 1.0 - config.eps_low, 1.0 + config.eps_high)
    seq_loss = -torch.minimum(ratio * advantages, clipped_ratio * advantages)

    kl_metric: torch.Tensor | None = None
    if config.beta > 0.0 and ref_logp is not None:  # beta > 0 without ref_logp was rejected above
        ref_minus_logp = torch.where(valid, ref_logp - logp, zero)
        token_kl = torch.exp(ref_minus_logp) - ref_minus_logp - 1.0  # k3: 0 on padding by construction
        seq_kl = token_kl.sum(dim=1) / n_tokens.clamp(min=1.0)
        if config.kl_ratio_weighted:
            seq_kl = seq_kl * ratio
        seq_loss = seq_loss + config.beta * seq_kl
        kl_metric = token_kl.sum() / n_tokens.sum()

    # TRL's "grpo" aggregation broadcasts the sequence loss back onto its tokens, takes each sequence's masked
    # token mean (which gives back the sequence loss) and then the mean over sequences. A sequence without
    # tokens therefore adds 0 but still counts in the denominator B; this does the same directly.
    seq_loss = torch.where(n_tokens > 0, seq_loss, zero)
    loss = seq_loss.mean()

    with torch.no_grad():
        clipped_high = (ratio > 1.0 + config.eps_high) & (advantages > 0)
        clipped_low = (ratio < 1.0 - config.eps_low) & (advantages < 0)
        metrics = {
            "loss": loss.detach(),
            "ratio_mean": ratio.mean(),
            "clip_fraction": (clipped_high | clipped_low).to(logp.dtype).mean(),
            "clip_fraction_high": clipped_high.to(logp.dtype).mean(),
            "clip_fraction_low": clipped_low.to(logp.dtype).mean(),
        }
        if kl_metric is not None:
            metrics["kl"] = kl_metric.detach()
    return loss, metrics
