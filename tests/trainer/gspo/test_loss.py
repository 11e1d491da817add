"""The torch GSPO loss: unit checks, then agreement with TRL's GRPOTrainer on the same tensors.

TRL (a dev dependency) computes the reference with its own code: GRPOTrainer._compute_loss runs on a
stand-in trainer that carries only the attributes that method reads, set from a real GRPOConfig the way
GRPOTrainer.__init__ sets them, and whose per-token log-prob hook returns our tensor instead of running a
model. Nothing of TRL's formula is restated here.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from zoo.trainer.gspo.loss import GspoLossConfig, group_advantages, gspo_loss

pytestmark = pytest.mark.numerics

EPS_LOW, EPS_HIGH = 3e-4, 4e-4

# ---------------------------------------------------------------------------------------------- advantages


def test_group_advantages_known_numbers() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    advantages, n_constant = group_advantages(rewards, group_size=4)
    # group 1: mean 0.25, Bessel std 0.5; group 2: mean 0.5, Bessel std sqrt(1/3)
    a1 = 1 / (0.5 + 1e-4)
    a2 = 0.5 / ((1 / 3) ** 0.5 + 1e-4)
    expected = torch.tensor(
        [0.75 * a1, -0.25 * a1, -0.25 * a1, -0.25 * a1, a2, a2, -a2, -a2], dtype=torch.float64
    )
    torch.testing.assert_close(advantages, expected, rtol=1e-12, atol=0.0)
    assert n_constant == 0


def test_zero_variance_group_gives_exact_zeros_and_is_counted() -> None:
    # 0.1 + 0.1 + 0.1 rounds, so the plain formula would leave a tiny nonzero advantage here.
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0, 0.5, 0.7, 0.7, 0.7], dtype=torch.float64)
    advantages, n_constant = group_advantages(rewards, group_size=3)
    assert n_constant == 2
    assert advantages[:3].tolist() == [0.0, 0.0, 0.0]
    assert advantages[6:].tolist() == [0.0, 0.0, 0.0]
    assert advantages[3] > 0 > advantages[4]


def test_group_advantages_accepts_integer_rewards() -> None:
    advantages, _ = group_advantages(torch.tensor([1, 0, 1, 0]), group_size=2)
    assert advantages.is_floating_point()
    assert advantages[0] > 0 > advantages[1]


@pytest.mark.parametrize(
    ("rewards", "group_size", "message"),
    [
        (torch.zeros(2, 4), 4, "1-D"),
        (torch.zeros(7), 4, "multiple of group_size=4"),
        (torch.zeros(0), 4, "multiple of group_size=4"),
        (torch.zeros(4), 1, "group_size must be an integer >= 2"),
        (torch.zeros(4), 0, "group_size must be an integer >= 2"),
        (torch.tensor([0.0, float("nan"), 1.0, 1.0]), 2, "finite"),
    ],
)
def test_group_advantages_rejects_bad_input(rewards: torch.Tensor, group_size: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        group_advantages(rewards, group_size)


# ---------------------------------------------------------------------------------------------- batches


def _batch(
    kinds: list[str], lengths: list[int], dtype: torch.dtype, seed: int, width: int = 9
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token log-probs, old log-probs and an int mask (prefix of each length), one row per kind.

    The kind says how the old policy differs per token, so where the sequence ratio lands:
    "on" equal (ratio 1), "in" within ±1e-4 (inside the clip range), "up"/"down" by 0.01..0.05 one way
    (above / below it), "mixed" by ±0.01..0.05 with random signs.
    """
    gen = torch.Generator().manual_seed(seed)
    shape = (len(kinds), width)
    logp = -3.0 * torch.rand(shape, generator=gen, dtype=dtype) - 0.05
    size = 0.01 + 0.04 * torch.rand(shape, generator=gen, dtype=dtype)
    signs = torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0).to(dtype)
    tiny = 2e-4 * torch.rand(shape, generator=gen, dtype=dtype) - 1e-4
    shift_of = {"on": torch.zeros_like(size), "in": tiny, "up": size, "down": -size, "mixed": signs * size}
    log_ratio = torch.stack([shift_of[kind][i] for i, kind in enumerate(kinds)])
    old_logp = logp - log_ratio
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).int()
    return logp, old_logp, mask


def _signed(signs: list[int], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Advantages with the given signs and random magnitudes in [0.2, 1.7)."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = 0.2 + 1.5 * torch.rand(len(signs), generator=gen, dtype=dtype)
    return torch.tensor(signs, dtype=dtype) * magnitude


def _loss_and_grad(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    leaf = logp.detach().clone().requires_grad_(True)
    loss, metrics = gspo_loss(leaf, old_logp, advantages, mask, **kwargs)
    loss.backward()
    assert leaf.grad is not None
    return loss.detach(), leaf.grad, metrics


# ---------------------------------------------------------------------------------------------- the loss


def test_ratio_one_gives_minus_mean_advantage_and_no_clipping() -> None:
    logp, _, mask = _batch(["on"] * 4, [9, 5, 1, 7], torch.float64, seed=1)
    advantages = _signed([1, -1, 1, -1], torch.float64, seed=2)
    loss, grad, metrics = _loss_and_grad(logp, logp.clone(), advantages, mask, config=GspoLossConfig())
    torch.testing.assert_close(loss, -advantages.mean(), rtol=1e-14, atol=0.0)
    assert metrics["clip_fraction"].item() == 0.0
    assert metrics["ratio_mean"].item() == 1.0
    assert metrics["loss"].item() == loss.item()
    assert "kl" not in metrics
    # on-policy, d loss / d logp_t = -A_i / (B n_i) on the completion tokens of sequence i
    n_tokens = mask.sum(dim=1, keepdim=True).double()
    torch.testing.assert_close(grad, -advantages[:, None] * mask / (4 * n_tokens), rtol=1e-12, atol=0.0)


def test_clipped_side_has_zero_gradient() -> None:
    kinds = ["up", "up", "down", "down"]
    logp, old_logp, mask = _batch(kinds, [9, 6, 8, 4], torch.float64, seed=3)
    advantages = _signed([1, -1, 1, -1], torch.float64, seed=4)
    _, grad, metrics = _loss_and_grad(logp, old_logp, advantages, mask, config=GspoLossConfig())
    # ratio above 1 + eps_high with A > 0, and below 1 - eps_low with A < 0: clipped, no gradient
    assert grad[0].abs().max().item() == 0.0
    assert grad[3].abs().max().item() == 0.0
    # the other side of each is not clipped: the ratio still moves the loss
    assert bool((grad[1][mask[1].bool()] != 0).all())
    assert bool((grad[2][mask[2].bool()] != 0).all())
    assert metrics["clip_fraction"].item() == 0.5
    assert metrics["clip_fraction_high"].item() == 0.25
    assert metrics["clip_fraction_low"].item() == 0.25


def test_old_logp_is_a_constant() -> None:
    logp, old_logp, mask = _batch(["in", "mixed"], [9, 5], torch.float64, seed=10)
    old_leaf = old_logp.clone().requires_grad_(True)
    logp_leaf = logp.clone().requires_grad_(True)
    loss, _ = gspo_loss(logp_leaf, old_leaf, _signed([1, -1], torch.float64, seed=11), mask, GspoLossConfig())
    loss.backward()
    assert old_leaf.grad is None
    assert logp_leaf.grad is not None


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_padding_has_no_effect_on_value_or_gradient(beta: float) -> None:
    kinds = ["in", "up", "down", "mixed"]
    logp, old_logp, mask = _batch(kinds, [9, 3, 6, 1], torch.float64, seed=5)
    ref_logp = logp + 0.1 * torch.randn(
        logp.shape, generator=torch.Generator().manual_seed(6), dtype=logp.dtype
    )
    advantages = _signed([1, 1, 1, -1], torch.float64, seed=7)
    config = GspoLossConfig(beta=beta)
    clean = _loss_and_grad(logp, old_logp, advantages, mask, config=config, ref_logp=ref_logp)

    padding = ~mask.bool()
    garbage = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30], dtype=logp.dtype)
    fill = garbage[torch.arange(padding.sum().item()) % 4]
    dirty = [t.clone() for t in (logp, old_logp, ref_logp)]
    for shift, t in enumerate(dirty):
        t[padding] = fill.roll(shift)
    loss, grad, metrics = _loss_and_grad(
        dirty[0], dirty[1], advantages, mask, config=config, ref_logp=dirty[2]
    )

    assert loss.item() == clean[0].item()
    assert torch.equal(grad, clean[1])
    assert grad[padding].abs().max().item() == 0.0
    assert metrics.keys() == clean[2].keys()
    for name, value in metrics.items():
        assert value.item() == clean[2][name].item(), name


def test_bool_and_float_masks_agree_with_int_mask() -> None:
    logp, old_logp, mask = _batch(["in", "up", "mixed"], [9, 4, 2], torch.float32, seed=8)
    advantages = _signed([1, 1, -1], torch.float32, seed=9)
    config = GspoLossConfig()
    reference = _loss_and_grad(logp, old_logp, advantages, mask, config=config)
    for other in (mask.bool(), mask.float()):
        loss, grad, _ = _loss_and_grad(logp, old_logp, advantages, other, config=config)
        assert loss.item() == reference[0].item()
        assert torch.equal(grad, reference[1])


def test_rejects_bad_shapes_and_masks() -> None:
    ok = {"logp": torch.zeros(3, 5), "old_logp": torch.zeros(3, 5), "advantages": torch.ones(3)}
    ok["mask"] = torch.ones(3, 5)

    def call(config: GspoLossConfig | None = None, **changes: torch.Tensor) -> None:
        gspo_loss(**{**ok, **changes}, config=config or GspoLossConfig())

    with pytest.raises(ValueError, match=r"logp must have shape \(B, T\) \(got \(15,\)\)"):
        call(logp=torch.zeros(15))
    with pytest.raises(ValueError, match=r"old_logp must have the shape of logp \(3, 5\) \(got \(3, 4\)\)"):
        call(old_logp=torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"mask must have the shape of logp \(3, 5\) \(got \(5, 3\)\)"):
        call(mask=torch.ones(5, 3))
    with pytest.raises(ValueError, match=r"advantages must have shape \(3,\).*\(got \(3, 1\)\)"):
        call(advantages=torch.ones(3, 1))
    with pytest.raises(ValueError, match=r"ref_logp must have the shape of logp \(3, 5\) \(got \(3,\)\)"):
        call(ref_logp=torch.zeros(3))
    with pytest.raises(ValueError, match="selects no token"):
        call(mask=torch.zeros(3, 5))
    with pytest.raises(ValueError, match="only 0 and 1"):
        call(mask=torch.full((3, 5), 0.5))
    with pytest.raises(ValueError, match="ref_logp is required when beta > 0"):
        call(config=GspoLossConfig(beta=0.1))


@pytest.mark.parametrize(
    ("field", "value"), [("eps_low", -0.1), ("eps_low", 1.0), ("eps_high", -1e-4), ("beta", -0.01)]
)
def test_config_rejects_out_of_range_values(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        GspoLossConfig(**{field: value})


# ---------------------------------------------------------------------------------------------- TRL


class _OneProcess:
    """The accelerator of a single-process run: gathering and reducing return their input."""

    num_processes = 1
    sync_gradients = True

    @staticmethod
    def gather(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    gather_for_metrics = gather

    @staticmethod
    def reduce(tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return tensor


class _TrlGspoReference:
    """TRL's GRPOTrainer._compute_loss, run on given per-token log-probs instead of a model's.

    Carries exactly the attributes that method reads, each set from a real GRPOConfig as
    GRPOTrainer.__init__ sets it; one micro-batch in train mode, no gradient accumulation.
    """

    def __init__(self, trainer_class: type, args: Any) -> None:
        self._trainer_class = trainer_class
        self.args = args
        self.loss_type = args.loss_type
        self.importance_sampling_level = args.importance_sampling_level
        self.epsilon_low = args.epsilon
        self.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
        self.beta = args.beta
        self.top_entropy_quantile = args.top_entropy_quantile
        self.off_policy_mask_threshold = args.off_policy_mask_threshold
        self.use_vllm = args.use_vllm
        self.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction
        self.max_completion_length = args.max_completion_length
        self.entropy_coef = args.entropy_coef
        self.use_adaptive_entropy = args.use_adaptive_entropy
        self._entropy_bonus_enabled = self.entropy_coef != 0.0 or self.use_adaptive_entropy
        self.aux_loss_enabled = False  # set only for mixture-of-experts models
        self.current_gradient_accumulation_steps = 1
        self.model = SimpleNamespace(training=True)
        self.accelerator = _OneProcess()
        self._metrics: dict[str, defaultdict[str, list[float]]] = {
            "train": defaultdict(list),
            "eval": defaultdict(list),
        }
        self._logp: torch.Tensor | None = None

    def _get_per_token_logps_and_entropies(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, **_: Any
    ) -> tuple[torch.Tensor, torch.Tensor, None]:
        assert self._logp is not None and logits_to_keep == self._logp.shape[1]
        return self._logp, torch.zeros_like(self._logp), None

    def loss(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor | None,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        ref_logp: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """TRL's loss (differentiable in ``logp``) and the metrics it logged for this call."""
        batch, width = logp.shape
        inputs: dict[str, torch.Tensor] = {
            "prompt_ids": torch.zeros(batch, 1, dtype=torch.long),
            "prompt_mask": torch.ones(batch, 1, dtype=torch.long),
            "completion_ids": torch.zeros(batch, width, dtype=torch.long),
            "completion_mask": mask,
            "advantages": advantages,
        }
        if old_logp is not None:  # absent, TRL takes the on-policy path (num_iterations == 1)
            inputs["old_per_token_logps"] = old_logp
        if ref_logp is not None:
            inputs["ref_per_token_logps"] = ref_logp
        self._logp = logp
        self._metrics["train"].clear()
        loss = self._trainer_class._compute_loss(self, None, inputs)  # type: ignore[attr-defined]
        return loss, {name: values[-1] for name, values in self._metrics["train"].items()}


@pytest.fixture(scope="module")
def trl_reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Builds a TRL reference for (beta, kl_ratio_weighted), with this module's clip range."""
    trl = pytest.importorskip("trl")
    output_dir = Path(tmp_path_factory.mktemp("trl"))

    def build(beta: float, kl_ratio_weighted: bool) -> _TrlGspoReference:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated TrainingArguments names it forwards
            args = trl.GRPOConfig(
                output_dir=str(output_dir),
                importance_sampling_level="sequence",
                loss_type="grpo",
                epsilon=EPS_LOW,
                epsilon_high=EPS_HIGH,
                beta=beta,
                use_bias_correction_kl=kl_ratio_weighted,
                use_cpu=True,
                use_vllm=False,
                bf16=False,
                report_to=[],
            )
        return _TrlGspoReference(trl.GRPOTrainer, args)

    yield build


_ALL_KINDS = ["in", "up", "down", "mixed", "in", "up", "down", "mixed"]
_SCENARIOS = {
    # name: (kinds, lengths, advantage signs, beta, kl_ratio_weighted)
    "on_policy": (["on"] * 6, [9, 9, 4, 1, 7, 2], [1, -1, 1, -1, 1, -1], 0.0, False),
    "clip_both_sides": (_ALL_KINDS, [9, 7, 9, 5, 3, 9, 6, 8], [1, 1, 1, 1, -1, -1, -1, -1], 0.0, False),
    "ragged_with_empty_row": (_ALL_KINDS, [9, 1, 4, 0, 2, 6, 9, 3], [-1, -1, 1, 1, 1, -1, -1, 1], 0.0, False),
    "kl": (_ALL_KINDS, [9, 7, 2, 5, 3, 9, 6, 0], [-1, 1, -1, 1, 1, -1, 1, -1], 0.04, False),
    "kl_ratio_weighted": (_ALL_KINDS, [4, 7, 9, 5, 1, 9, 6, 8], [-1, 1, -1, 1, -1, 1, -1, 1], 0.04, True),
    "kl_on_policy": (["on"] * 4, [9, 3, 6, 8], [1, -1, -1, 1], 0.1, True),
}
_CLIP_METRICS = {
    "clip_fraction": "clip_ratio/region_mean",
    "clip_fraction_high": "clip_ratio/high_mean",
    "clip_fraction_low": "clip_ratio/low_mean",
}
_TOLERANCE = {torch.float32: {"rtol": 1e-6, "atol": 1e-8}, torch.float64: {"rtol": 1e-13, "atol": 1e-15}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("scenario", list(_SCENARIOS))
def test_agrees_with_trl(trl_reference: Any, scenario: str, dtype: torch.dtype) -> None:
    kinds, lengths, signs, beta, kl_ratio_weighted = _SCENARIOS[scenario]
    seed = 100 + list(_SCENARIOS).index(scenario)
    logp, old_logp, mask = _batch(kinds, lengths, dtype, seed=seed)
    advantages = _signed(signs, dtype, seed=seed + 50)
    noise = torch.randn(logp.shape, generator=torch.Generator().manual_seed(seed + 99), dtype=dtype)
    ref_logp = logp + 0.2 * noise if beta > 0 else None
    on_policy = all(kind == "on" for kind in kinds)

    config = GspoLossConfig(EPS_LOW, EPS_HIGH, beta, kl_ratio_weighted)
    ours, our_grad, metrics = _loss_and_grad(
        logp, old_logp, advantages, mask, config=config, ref_logp=ref_logp
    )

    trl_logp = logp.detach().clone().requires_grad_(True)
    reference = trl_reference(beta, kl_ratio_weighted)
    trl_loss, trl_metrics = reference.loss(
        trl_logp, None if on_policy else old_logp, advantages, mask, ref_logp=ref_logp
    )
    trl_loss.backward()

    tolerance = _TOLERANCE[dtype]
    torch.testing.assert_close(ours, trl_loss.detach(), **tolerance)
    torch.testing.assert_close(our_grad, trl_logp.grad, **tolerance)
    for ours_name, trl_name in _CLIP_METRICS.items():
        assert metrics[ours_name].item() == pytest.approx(trl_metrics[trl_name], abs=1e-7), ours_name
    if beta > 0 and not kl_ratio_weighted:  # TRL logs the ratio-weighted estimate when it weights the KL
        assert metrics["kl"].item() == pytest.approx(trl_metrics["kl"], rel=1e-6)

    # the scenario covers what it says it does
    valid_rows = mask.sum(dim=1) > 0
    if on_policy:
        assert metrics["ratio_mean"].item() == 1.0 and metrics["clip_fraction"].item() == 0.0
    else:
        ratio = torch.exp(((logp - old_logp) * mask).sum(1) / mask.sum(1).clamp(min=1))
        inside = (ratio >= 1 - EPS_LOW) & (ratio <= 1 + EPS_HIGH)
        assert bool((inside & valid_rows).any()) and bool((ratio > 1 + EPS_HIGH).any())
        assert bool((ratio < 1 - EPS_LOW).any())
        assert 0.0 < metrics["clip_fraction"].item() < 1.0
    assert bool((advantages > 0).any()) and bool((advantages < 0).any())
    assert our_grad.abs().max().item() > 0.0
