"""How much an estimate can be trusted: the zoo's measured error for the model's architecture family.

The zoo (``tests/estimate/zoo.py``, ``docs/estimate.md`` "The zoo") compares the estimate's peak with real CPU trials
for twelve architecture families, full fine-tuning and LoRA, at a small micro-batch and a larger one. An estimate
reports that error for its own family (transformers' ``model_type``), or "unmeasured" for a family outside the zoo,
and says how its run differs from what the zoo measured (a GPU, another dtype, checkpointing, sharding). No torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# family -> {"full" | "lora": (peak error at micro-batch 2, at micro-batch 16)}, estimate vs a real CPU trial,
# measured by ``python -m tests.estimate.zoo`` (docs/estimate.md holds the same table; a test keeps them equal).
ZOO_SIZES = (2, 16)
ZOO_CONDITIONS = "CPU trials, fp32, AdamW, one process, no checkpointing"
# How far one cell's peak error at the small micro-batch moved between runs of the zoo (four runs on one machine,
# docs/estimate.md "Run to run"): the trial's own peak moves, the estimate does not.
ZOO_RUN_TO_RUN = 0.01
ZOO_ERRORS: dict[str, dict[str, tuple[float, float]]] = {
    "llama": {"full": (0.0002, 0.0001), "lora": (0.0138, 0.0014)},
    "mistral": {"full": (-0.0017, 0.0007), "lora": (0.0203, 0.0022)},
    "qwen2": {"full": (-0.0015, -0.0006), "lora": (0.014, 0.0022)},
    "gemma": {"full": (-0.0028, -0.0002), "lora": (0.0054, 0.0)},
    "phi3": {"full": (0.0028, 0.0004), "lora": (0.013, 0.0012)},
    "gpt_neox": {"full": (-0.0033, -0.0023), "lora": (0.0014, 0.0003)},
    "opt": {"full": (-0.0019, 0.0003), "lora": (0.0026, 0.0)},
    "gpt2": {"full": (-0.0028, -0.0008), "lora": (0.0012, -0.0009)},
    "bert": {"full": (0.0045, -0.0023), "lora": (-0.0014, -0.0006)},
    "roberta": {"full": (-0.0042, -0.002), "lora": (0.0001, 0.0)},
    "t5": {"full": (-0.0027, -0.0016), "lora": (-0.0084, -0.0024)},
    "bart": {"full": (-0.0072, -0.0033), "lora": (-0.0023, -0.001)},
}


@dataclass(frozen=True)
class Trust:
    """The zoo's word on one estimate: its family's measured peak errors (None: unmeasured) and the differences."""

    family: str | None  # transformers' model_type; None for a model that has no config (a module:function)
    fine_tuning: str  # "full" or "lora"
    errors: tuple[float, float] | None  # the zoo's peak errors at ZOO_SIZES; None when the zoo did not measure it
    differences: tuple[str, ...] = ()  # how this estimate's run differs from the zoo's measurement

    @property
    def measured(self) -> bool:
        return self.errors is not None

    def describe(self) -> str:
        """One line: ``the zoo measured llama (LoRA) within +0.14% to +1.38% ...`` or ``unmeasured: ...``."""
        kind = "LoRA" if self.fine_tuning == "lora" else "full fine-tuning"
        if self.errors is None:
            what = f"the {self.family} family" if self.family else "a model without a transformers config"
            if self.family in ZOO_ERRORS:
                what = f"{self.family} with 4-bit weights"
            return f"unmeasured: {what} is not in the zoo (docs/estimate.md, \"The zoo\")"
        low, high = sorted(self.errors)
        line = (f"the zoo measured {self.family} ({kind}) within {100 * low:+.2f}% to {100 * high:+.2f}% of real "
                f"trials' peaks (micro-batches {ZOO_SIZES[0]} and {ZOO_SIZES[1]}, one run: at {ZOO_SIZES[0]} a trial's "
                f"own peak moves by up to {100 * ZOO_RUN_TO_RUN:.1f} points between runs; {ZOO_CONDITIONS})")
        return line + (f"; this run differs: {', '.join(self.differences)}" if self.differences else "")

    def to_dict(self) -> dict:
        return {**asdict(self), "measured": self.measured, "text": self.describe()}


def model_family(model: object) -> str | None:
    """A model's architecture family: transformers' ``model_type`` (through a peft wrapper too), else None."""
    family = getattr(getattr(model, "config", None), "model_type", None)
    return family if isinstance(family, str) else None


def trust_of(family: str | None, spec: dict, device_kind: str, world_size: int = 1) -> Trust:
    """The zoo's word on an estimate of ``spec`` (``WorkloadSpec.to_dict()``) for ``family`` on ``device_kind``."""
    fine_tuning = "lora" if spec.get("lora") else "full"
    errors = ZOO_ERRORS.get(family or "", {}).get(fine_tuning)
    if spec.get("quantize"):
        errors = None  # the zoo has no 4-bit base
    differences = []
    if device_kind != "cpu":
        differences.append("a CUDA target (no GPU run has measured the zoo yet: tests/gpu/gpu_check.sh)")
    if spec.get("dtype", "fp32") != "fp32":
        differences.append(f"{spec['dtype']} autocast")
    if spec.get("grad_checkpointing"):
        differences.append("activation checkpointing")
    if spec.get("optimizer", "adamw") != "adamw":
        differences.append(f"optimizer {spec['optimizer']}")
    if spec.get("loss", "plain") != "plain":
        differences.append(f"loss {spec['loss']} (docs/levers.md has its checks)")
    if spec.get("compile"):
        differences.append("compiled (docs/levers.md has its checks)")
    if world_size > 1:
        differences.append(f"{world_size} ranks ({spec.get('parallel') or 'ddp'})")
    return Trust(family, fine_tuning, errors, tuple(differences))
