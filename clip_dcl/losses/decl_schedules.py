"""DeCL's schedules of ``lambda_t`` and ``gamma_t`` and its temperature modes, one class per flag value.

``t`` counts optimizer steps from 1. Sources: Chen et al., NeurIPS 2022 (DeCL), Sec. 2.2.3 and
Appendix (``lambda_t``); Wei et al. 2024, arXiv 2407.01445 (FastCLIP: the cosine ``gamma`` schedule,
``adjust_gamma``, and v3's RGCL-g temperature objective).
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch

#: RGCL-g's default target: the negatives' softmax entropy at FastCLIP's rho = 6.5 and global batch 1024
RGCLG_ENTROPY = math.log(1023) - 6.5


# -- lambda_t: the weight of the decomposed loss (loss1) against InfoNCE (loss2) ---------------------
class LambdaSchedule:
    """``lambda_t`` at step ``t``; `term` names what the step optimises, for the log line."""

    name = ""
    help = ""
    uses_lam = False  #: whether ``--decl-lambda`` means something to it

    def __init__(self, lam: float):
        self.lam = lam

    def check(self) -> None:
        """Raise ``ValueError`` naming ``lam`` when it is out of this schedule's range."""

    def value(self, step: int) -> float:
        raise NotImplementedError

    def always_loss1(self) -> bool:
        """Whether every step is loss1 alone (``lambda_t = 1``): no step has an InfoNCE term."""
        return False

    def varies(self) -> bool:
        """Whether ``lambda_t`` changes from step to step (else the log leaves it out)."""
        return True

    def term(self, step: int) -> str:
        lam = self.value(step)
        return "loss1" if lam == 1.0 else "infonce" if lam == 0.0 else f"{lam:.3g} loss1 + {1 - lam:.3g} infonce"


class Alternate(LambdaSchedule):
    name = "alternate"
    help = "alternate: loss1 on odd steps, InfoNCE on even steps (the paper's OpenCLIP setting)"

    def value(self, step: int) -> float:
        return 1.0 if step % 2 == 1 else 0.0


class DeclOnly(LambdaSchedule):
    name = "decl"
    help = "decl: loss1 on every step (lambda_t = 1, the paper's ImageNet setting)"

    def value(self, step: int) -> float:
        return 1.0

    def always_loss1(self) -> bool:
        return True

    def varies(self) -> bool:
        return False


class Harmonic(LambdaSchedule):
    name = "harmonic"
    help = "harmonic: lambda_t = min(1, c / t) loss1 + (1 - lambda_t) InfoNCE (c = --decl-lambda)"
    uses_lam = True

    def check(self) -> None:
        if not self.lam > 0:
            raise ValueError(f"lam={self.lam!r} must be > 0 for schedule='harmonic' (lambda_t = min(1, lam / t))")

    def value(self, step: int) -> float:
        return min(1.0, self.lam / step)


class Constant(LambdaSchedule):
    name = "constant"
    help = "constant: lambda loss1 + (1 - lambda) InfoNCE on every step (lambda = --decl-lambda)"
    uses_lam = True

    def check(self) -> None:
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam={self.lam!r} must be in [0, 1] for schedule='constant'")

    def value(self, step: int) -> float:
        return self.lam

    def always_loss1(self) -> bool:
        return self.lam >= 1.0

    def varies(self) -> bool:
        return False


LAMBDA_SCHEDULES: Dict[str, type] = {c.name: c for c in (Alternate, DeclOnly, Harmonic, Constant)}
SCHEDULES = tuple(LAMBDA_SCHEDULES)


def lambda_schedule(name: str, lam: float) -> LambdaSchedule:
    if name not in LAMBDA_SCHEDULES:
        raise ValueError(f"schedule={name!r} is not one of {SCHEDULES}")
    return LAMBDA_SCHEDULES[name](lam)


# -- gamma_t: the weight of the new estimate in the index rate's moving average ---------------------
class GammaSchedule:
    name = ""

    def __init__(self, gamma: float, decay_steps: Optional[int], hold_steps: int):
        self.gamma, self.decay_steps, self.hold_steps = gamma, decay_steps, hold_steps

    def value(self, step: int) -> float:
        raise NotImplementedError


class ConstantGamma(GammaSchedule):
    name = "constant"

    def value(self, step: int) -> float:
        return self.gamma


class CosineGamma(GammaSchedule):
    """1 for ``hold_steps`` steps, then ``gamma + (1 - gamma) (1 + cos(pi min(1, (t - 1 - H) / T))) / 2``
    (FastCLIP's ``adjust_gamma``, made continuous in the step).
    """

    name = "cosine"

    def value(self, step: int) -> float:
        progress = min(1.0, max(0, step - 1 - self.hold_steps) / self.decay_steps)
        return self.gamma + (1.0 - self.gamma) * 0.5 * (1.0 + math.cos(math.pi * progress))


GAMMA_SCHEDULE_TYPES: Dict[str, type] = {c.name: c for c in (ConstantGamma, CosineGamma)}
GAMMA_SCHEDULES = tuple(GAMMA_SCHEDULE_TYPES)


# -- what trains the logit scale --------------------------------------------------------------------
class TemperatureMode:
    """Which scale each term sees, and what trains the model's scale.

    loss1 has no positive in its normaliser: its gradient by the scale is ``E_w[c_ik] - c_ii``, negative
    once positives outrank negatives, so it would drive a learned scale to OpenCLIP's clamp. A step that
    does not train the scale gives it a zero gradient (DDP expects one for every parameter).
    """

    name = ""

    def __init__(self, temperature: Optional[float], rho: Optional[float]):
        self.temperature, self.rho = temperature, rho

    def scales(self, logit_scale, lam_t: float, device):
        """``(scale of loss1's statistics, live scale of InfoNCE's)``."""
        return logit_scale, logit_scale

    def separate_infonce(self, lam_t: float) -> bool:
        """Whether InfoNCE needs its own statistics (with the live scale) this step."""
        return False

    def finish(self, loss, model_scale, live_scale, rgclg_term):
        """The loss with the scale's gradient settled (``rgclg_term()`` builds RGCL-g's surrogate)."""
        if torch.is_tensor(model_scale) and model_scale.requires_grad:
            return loss + 0.0 * model_scale
        return loss


class Learned(TemperatureMode):
    """``learned``: both terms train the scale."""

    name = "learned"

    def finish(self, loss, model_scale, live_scale, rgclg_term):
        return loss


class InfoNCEScale(TemperatureMode):
    """``infonce`` (the default): loss1 sees the scale detached, the InfoNCE terms train it."""

    name = "infonce"

    def scales(self, logit_scale, lam_t, device):
        if torch.is_tensor(logit_scale) and lam_t > 0.0:
            return logit_scale.detach(), logit_scale
        return logit_scale, logit_scale

    def separate_infonce(self, lam_t):
        return lam_t < 1.0


class Fixed(TemperatureMode):
    """``fixed``: ``1 / temperature`` in both terms; the model's scale is not trained."""

    name = "fixed"

    def scales(self, logit_scale, lam_t, device):
        fixed = torch.tensor(1.0 / self.temperature, device=device)
        return fixed, fixed


class RGCLG(TemperatureMode):
    """``rgclg``: only FastCLIP v3's RGCL-g objective ``tau (mean_i log g_i + rho)`` trains the scale."""

    name = "rgclg"

    def scales(self, logit_scale, lam_t, device):
        return (logit_scale.detach(), logit_scale) if torch.is_tensor(logit_scale) else (logit_scale, logit_scale)

    def finish(self, loss, model_scale, live_scale, rgclg_term):
        if torch.is_tensor(live_scale) and live_scale.requires_grad:
            term = rgclg_term()
            return loss + (term - term.detach())  # value 0: only the scale's gradient
        return super().finish(loss, model_scale, live_scale, rgclg_term)


TEMPERATURE_MODE_TYPES: Dict[str, type] = {c.name: c for c in (Learned, InfoNCEScale, Fixed, RGCLG)}
TEMPERATURE_MODES = tuple(TEMPERATURE_MODE_TYPES)


def temperature_mode(name: str, temperature: Optional[float], rho: Optional[float]) -> TemperatureMode:
    """The mode ``name`` with its ``temperature`` (fixed) and ``rho`` (rgclg) checked (``ValueError``)."""
    if name not in TEMPERATURE_MODE_TYPES:
        raise ValueError(f"temperature_mode={name!r} is not one of {TEMPERATURE_MODES}")
    if name == "fixed":
        if temperature is None or not (isinstance(temperature, (int, float)) and 0 < temperature < math.inf):
            raise ValueError(f"temperature={temperature!r} must be a number > 0 for temperature_mode='fixed'")
    elif temperature is not None:
        raise ValueError(f"temperature={temperature!r} applies to temperature_mode='fixed' only, not {name!r}")
    if rho is not None and name != "rgclg":
        raise ValueError(f"rho={rho!r} applies to temperature_mode='rgclg' only, not {name!r}")
    if rho is not None and not (isinstance(rho, (int, float)) and math.isfinite(rho)):
        raise ValueError(f"rho={rho!r} must be a finite number")
    return TEMPERATURE_MODE_TYPES[name](
        None if temperature is None else float(temperature), None if rho is None else float(rho)
    )
