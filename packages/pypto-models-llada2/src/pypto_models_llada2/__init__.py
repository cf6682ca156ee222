"""LLaDA2-MoE (``llada2_moe``): modeling for transformers 5.x and block-diffusion generation."""

__version__ = "0.1.0"

from .configuration import LLaDA2ConfigError, LLaDA2MoeConfig
from .generation import (
    BlockDiffusionOutput,
    BlockKVCache,
    BlockStepRunner,
    GenerationInputError,
    block_diffusion_generate,
    prepare_step,
    select_commits,
    steps_per_block_for,
    transfer_schedule,
)
from .modeling import (
    DEFAULT_BLOCK_LENGTH,
    LLaDA2CheckpointError,
    LLaDA2MoeModel,
    LLaDA2MoeModelLM,
    register_auto_classes,
)

register_auto_classes()

__all__ = [
    "DEFAULT_BLOCK_LENGTH",
    "BlockDiffusionOutput",
    "BlockKVCache",
    "BlockStepRunner",
    "GenerationInputError",
    "LLaDA2CheckpointError",
    "LLaDA2ConfigError",
    "LLaDA2MoeConfig",
    "LLaDA2MoeModel",
    "LLaDA2MoeModelLM",
    "__version__",
    "block_diffusion_generate",
    "prepare_step",
    "register_auto_classes",
    "select_commits",
    "steps_per_block_for",
    "transfer_schedule",
]
