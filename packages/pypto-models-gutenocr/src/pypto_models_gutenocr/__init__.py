"""GutenOCR (Qwen2.5-VL) on native transformers classes, with PyPTO kernel hooks."""

__version__ = "0.1.0"

from .configuration import GutenOCRConfig, MRopeSectionError, normalize_mrope_section
from .errors import EXIT
from .modeling import GutenOCRForConditionalGeneration, install_hooks, register_auto_classes

register_auto_classes()

__all__ = [
    "EXIT",
    "GutenOCRConfig",
    "GutenOCRForConditionalGeneration",
    "MRopeSectionError",
    "install_hooks",
    "normalize_mrope_section",
    "register_auto_classes",
]
