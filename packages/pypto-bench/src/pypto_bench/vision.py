"""Vision-language (VL) checkpoints: the ``--image`` file, the folder's processor, the prompt.

Why a module of its own: a VL checkpoint (e.g. ``qwen3_vl``) loads through
``AutoModelForImageTextToText`` and is benched in one of two ways, and the report must say
which. Without ``--image`` the decode and prefill regimes run its language model on the
same text prompts as any causal LM (the conditional-generation forward given no pixel
values runs its text decoder alone). With ``--image FILE`` the prefill regime runs the
whole model, vision tower included, on an image + text prompt the folder's own processor
builds.

The image file is untrusted input: it must be a regular file (no link, folder, device or
pipe), at most :data:`MAX_IMAGE_BYTES` on disk and :data:`MAX_IMAGE_PIXELS` decoded, in one
of :data:`IMAGE_FORMATS` (Pillow is never asked to run an external decoder such as
Ghostscript for EPS/PDF). Every refusal is a one-line :class:`BadInputError` that names
the problem and the fix.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pypto_common import redact

from .errors import BadInputError, EnvironmentMissingError

log = logging.getLogger(__name__)

__all__ = [
    "BENCHED_IMAGE",
    "BENCHED_TEXT",
    "DEFAULT_IMAGE_PROMPT",
    "IMAGE_FORMATS",
    "MAX_ASPECT_RATIO",
    "MAX_IMAGE_BYTES",
    "MAX_IMAGE_PIXELS",
    "ImageFile",
    "ImagePrompter",
    "check_image_file",
    "load_image_prompter",
    "read_image",
    "vl_info",
]

#: The largest ``--image`` file read (a VL processor resizes every image to a few
#: megapixels at most, so a bigger file only costs memory and time).
MAX_IMAGE_BYTES = 64 * 2**20
#: The largest decoded image (8192 x 8192): a small compressed file can expand to
#: gigabytes of pixels (a decompression bomb); the header's size is checked before decoding.
MAX_IMAGE_PIXELS = 8192 * 8192
#: The most elongated image accepted (long side / short side): Qwen2-VL-style processors
#: refuse past 200 ("absolute aspect ratio must be smaller than 200"), deep in the run
#: as an "unexpected ValueError" with no report.
MAX_ASPECT_RATIO = 200
#: Raster formats Pillow decodes itself; EPS / PDF would run Ghostscript.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
#: The text of the image prompt when the caller gives none (smoke --image).
DEFAULT_IMAGE_PROMPT = "Describe this image."

#: ``model.vl.benched``: what the regimes ran of a VL checkpoint.
BENCHED_TEXT = "language model on text prompts"
BENCHED_IMAGE = "whole model on an image + text prompt"

_LIMIT_MIB = MAX_IMAGE_BYTES // 2**20


def check_image_file(path: str | Path) -> Path:
    """The ``--image`` path if it is a regular, non-empty file within the size limit.

    Only metadata is read (``lstat``): cheap enough for ``BenchConfig.validate``, so a bad
    path stops a run before any model loads. A symbolic link is refused rather than
    followed: the file read is then the file named.
    """
    p = Path(path).expanduser()
    shown = f"--image {p}"
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        raise BadInputError(
            f"{shown} does not exist: pass an image file (PNG, JPEG, ...)"
        ) from None
    except OSError as err:
        raise BadInputError(
            f"{shown} cannot be read ({err.strerror or err}): pass a readable image file"
        ) from None
    _check_mode(shown, st)
    return p


def _check_mode(shown: str, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise BadInputError(
            f"{shown} is a symbolic link: pass the image file itself (the link's target)"
        )
    if stat.S_ISDIR(st.st_mode):
        raise BadInputError(f"{shown} is a folder: pass one image file (PNG, JPEG, ...)")
    if not stat.S_ISREG(st.st_mode):
        raise BadInputError(
            f"{shown} is not a regular file (a device, pipe or socket): pass an image file"
        )
    if st.st_size > MAX_IMAGE_BYTES:
        raise BadInputError(
            f"{shown} is {st.st_size} bytes, over the {_LIMIT_MIB} MiB limit: pass a smaller "
            "image (the processor resizes it to a few megapixels anyway)"
        )
    if st.st_size == 0:
        raise BadInputError(f"{shown} is empty: pass an image file (PNG, JPEG, ...)")


@dataclass
class ImageFile:
    """A decoded ``--image`` and what the report records about it (never the pixels)."""

    path: Path
    format: str
    width: int
    height: int
    size_bytes: int
    sha256: str
    image: Any = field(repr=False, default=None)  # PIL.Image.Image in RGB

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "format": self.format,
            "width": self.width,
            "height": self.height,
            "size_bytes": self.size_bytes,
            "sha256": self.sha256,
        }


def read_image(path: str | Path) -> ImageFile:
    """Read and decode ``--image`` safely (see the module docstring); one-line errors.

    The file is opened without following a link and without blocking on a pipe, its type
    and size are checked again on the open descriptor (the path may have changed since
    :func:`check_image_file`), and at most ``MAX_IMAGE_BYTES + 1`` bytes are read.
    """
    p = check_image_file(path)
    shown = f"--image {p}"
    flags = (
        os.O_RDONLY
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_BINARY", 0)
    )
    try:
        fd = os.open(p, flags)
    except OSError as err:
        raise BadInputError(
            f"{shown} cannot be opened ({err.strerror or err}): pass a readable image file"
        ) from None
    with os.fdopen(fd, "rb") as fh:
        _check_mode(shown, os.fstat(fh.fileno()))
        data = fh.read(MAX_IMAGE_BYTES + 1)
    if len(data) > MAX_IMAGE_BYTES:
        raise BadInputError(
            f"{shown} grew past the {_LIMIT_MIB} MiB limit while it was read: pass a smaller image"
        )
    if not data:
        raise BadInputError(f"{shown} is empty: pass an image file (PNG, JPEG, ...)")
    fmt, width, height, rgb = _decode(shown, data)
    return ImageFile(
        path=p.resolve(),
        format=fmt,
        width=width,
        height=height,
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        image=rgb,
    )


def _decode(shown: str, data: bytes) -> tuple[str, int, int, Any]:
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as err:
        raise EnvironmentMissingError(
            "--image needs Pillow to decode the image: pip install pillow"
        ) from err
    import warnings

    formats = ", ".join(IMAGE_FORMATS)
    try:
        with warnings.catch_warnings():
            # Pillow's own bomb guard warns first and raises at twice its limit: both stop here.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=list(IMAGE_FORMATS)) as im:
                width, height = (int(v) for v in im.size)
                fmt = str(im.format or "?")
                if width < 1 or height < 1 or width * height > MAX_IMAGE_PIXELS:
                    raise BadInputError(
                        f"{shown} is {width}x{height} pixels, outside 1..{MAX_IMAGE_PIXELS} "
                        "pixels: pass a smaller image"
                    )
                if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
                    raise BadInputError(
                        f"{shown} is {width}x{height} pixels, more elongated than the "
                        f"{MAX_ASPECT_RATIO}:1 vision processors accept: pass a less elongated "
                        "image (crop or pad it)"
                    )
                im.load()
                rgb = im.convert("RGB")
    except BadInputError:
        raise
    except UnidentifiedImageError:
        raise BadInputError(
            f"{shown} is not an image Pillow can read as {formats}: pass an image file"
        ) from None
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as err:
        raise BadInputError(
            f"{shown} is too large to decode ({_first_line(err).rstrip('.')}): pass a smaller image"
        ) from None
    except (OSError, ValueError, SyntaxError, EOFError, MemoryError) as err:
        detail = redact(" ".join(str(err).split()))[:160]
        raise BadInputError(
            f"{shown} is a damaged or truncated image ({type(err).__name__}: {detail}): "
            "pass an intact image file"
        ) from None
    return fmt, width, height, rgb


# --- the prompt ---------------------------------------------------------------------------


def _first_line(err: BaseException) -> str:
    """The first sentence of an error, on one line (transformers' import errors run on)."""
    text = " ".join(str(err).split()).split(". ")[0] or type(err).__name__
    return redact(text)[:200]


@dataclass
class ImagePrompter:
    """Builds the model inputs of an image + text prompt with the folder's processor.

    ``kind`` says how: ``"processor"`` (the folder's own processor, e.g.
    ``Qwen3VLProcessor``) or ``"image processor + tokenizer"``, used when the full processor
    cannot be built here (Qwen's also wants a video processor, which needs torchvision):
    the folder's image processor turns the image into patches and each image placeholder
    is expanded to the patch count, exactly as Qwen's processors do for images.
    """

    processor: Any
    tokenizer: Any
    kind: str
    processor_class: str
    image_token: str | None
    image_token_id: int | None
    video_token_id: int | None = None
    vision_start: str | None = None
    vision_end: str | None = None
    why_paired: str | None = None

    def prompt_text(self, text: str) -> str:
        """The prompt with the image placed as the folder's chat template places it.

        Without a template: the image placeholder (wrapped in the vision start/end tokens
        where the config names them), then the text.
        """
        template = getattr(self.processor, "chat_template", None) or getattr(
            self.tokenizer, "chat_template", None
        )
        if template:
            messages = [
                {
                    "role": "user",
                    "content": [{"type": "image"}, {"type": "text", "text": text}],
                }
            ]
            apply = getattr(self.processor, "apply_chat_template", None)
            if self.kind != "processor" or apply is None:
                apply = self.tokenizer.apply_chat_template
            prompt = str(apply(messages, tokenize=False, add_generation_prompt=True))
            if self.image_token and self.image_token not in prompt:
                raise BadInputError(
                    f"the folder's chat template placed no image ({self.image_token!r} is not in "
                    "the prompt it renders): download the model's chat template again"
                )
            return prompt
        if not self.image_token:
            raise BadInputError(
                "the folder has no chat template and its processor names no image token, so "
                "the image cannot be placed in the prompt: download the model's processor files"
            )
        return f"{self.vision_start or ''}{self.image_token}{self.vision_end or ''}{text}"

    def inputs(self, image: Any, text: str, batch: int, accepted: set[str]) -> dict[str, Any]:
        """Tensors of ``batch`` identical rows (the same image and prompt in every row),
        restricted to the keywords the model's forward accepts (``accepted``)."""
        prompt = self.prompt_text(text)
        if self.kind == "processor":
            out = dict(
                self.processor(text=[prompt] * batch, images=[image] * batch, return_tensors="pt")
            )
        else:
            out = self._paired(prompt, image, batch)
        if "mm_token_type_ids" in accepted and "mm_token_type_ids" not in out:
            out["mm_token_type_ids"] = self._token_types(out["input_ids"])
        return {
            k: v for k, v in out.items() if k in accepted or k in ("input_ids", "attention_mask")
        }

    def _paired(self, prompt: str, image: Any, batch: int) -> dict[str, Any]:
        pix = dict(self.processor(images=[image] * batch, return_tensors="pt"))
        merge = int(getattr(self.processor, "merge_size", 1) or 1) ** 2
        counts = iter([int(g.prod()) // merge for g in pix["image_grid_thw"]])
        token = self.image_token or ""
        rows = []
        for _ in range(batch):
            parts = prompt.split(token)
            row = parts[0]
            for rest in parts[1:]:
                row += token * next(counts) + rest
            rows.append(row)
        enc = dict(self.tokenizer(rows, return_tensors="pt", padding=True))
        enc.pop("token_type_ids", None)
        return {**enc, **pix}

    def _token_types(self, input_ids: Any) -> Any:
        # 0 text, 1 image, 2 video: what Qwen's processors return (same dtype as the ids).
        types = input_ids.new_zeros(input_ids.shape)
        if self.image_token_id is not None:
            types[input_ids == self.image_token_id] = 1
        if self.video_token_id is not None:
            types[input_ids == self.video_token_id] = 2
        return types


def _config_id(config: dict[str, Any], *names: str) -> int | None:
    for where in (config, config.get("text_config") or {}):
        for name in names:
            value = where.get(name) if isinstance(where, dict) else None
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def load_image_prompter(
    path: Path, config: dict[str, Any], tokenizer: Any, *, trust_remote_code: bool = False
) -> ImagePrompter:
    """The folder's processor for image prompts (``local_files_only``), or a one-line error.

    A folder without an image processor is bad input for ``--image``
    (:class:`BadInputError`); a processor that needs a package this machine lacks, with no
    image processor pypto-bench can pair with the tokenizer, is
    :class:`EnvironmentMissingError` naming it.
    """
    from transformers import AutoImageProcessor, AutoProcessor

    image_token_id = _config_id(config, "image_token_id", "image_token_index")
    video_token_id = _config_id(config, "video_token_id", "video_token_index")
    full_error: BaseException | None = None
    try:
        proc = AutoProcessor.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=trust_remote_code
        )
    except Exception as err:  # transformers raises ImportError, OSError, ValueError, ...
        full_error = err
        proc = None
    if proc is not None and getattr(proc, "image_processor", None) is not None:
        return ImagePrompter(
            processor=proc,
            tokenizer=getattr(proc, "tokenizer", None) or tokenizer,
            kind="processor",
            processor_class=type(proc).__name__,
            image_token=_str_or_none(getattr(proc, "image_token", None)),
            image_token_id=getattr(proc, "image_token_id", None) or image_token_id,
            video_token_id=getattr(proc, "video_token_id", None) or video_token_id,
            vision_start=_str_or_none(getattr(proc, "vision_start_token", None)),
            vision_end=_str_or_none(getattr(proc, "vision_end_token", None)),
        )
    why = _first_line(full_error) if full_error is not None else "it has no image processor"
    try:
        image_processor = AutoImageProcessor.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=trust_remote_code
        )
    except Exception as err:
        if isinstance(full_error, ImportError):
            raise EnvironmentMissingError(
                f"the processor of {path} needs a package this machine lacks ({why}): "
                "install it (for Qwen VL models: pip install torchvision matching your torch)"
            ) from err
        raise BadInputError(
            f"{path} has no image processor for --image ({_first_line(err)}): download the "
            "model's processor files (preprocessor_config.json) too, or drop --image"
        ) from err
    pairable = (
        hasattr(image_processor, "merge_size")
        and image_token_id is not None
        and "image_grid_thw" in (getattr(image_processor, "model_input_names", None) or [])
    )
    if not pairable:
        if isinstance(full_error, ImportError):
            raise EnvironmentMissingError(
                f"the processor of {path} needs a package this machine lacks ({why}): install it"
            )
        raise BadInputError(
            f"the processor of {path} could not be built ({why}) and its image processor "
            f"{type(image_processor).__name__} cannot be paired with the tokenizer here: "
            "download the model's processor files (processor_config.json) or drop --image"
        )

    def token(token_id: int | None) -> str | None:
        if token_id is None:
            return None
        value = tokenizer.convert_ids_to_tokens(int(token_id))
        return value if isinstance(value, str) else None

    image_token = token(image_token_id)
    if not image_token or tokenizer.convert_tokens_to_ids(image_token) != image_token_id:
        raise BadInputError(
            f"the tokenizer of {path} has no token for the config's image_token_id "
            f"{image_token_id}: download the model's tokenizer files again"
        )
    log.info(
        "the folder's processor could not be built (%s): pairing its image processor %s "
        "with the tokenizer",
        why,
        type(image_processor).__name__,
    )
    return ImagePrompter(
        processor=image_processor,
        tokenizer=tokenizer,
        kind="image processor + tokenizer",
        processor_class=type(image_processor).__name__,
        image_token=image_token,
        image_token_id=image_token_id,
        video_token_id=video_token_id,
        vision_start=token(_config_id(config, "vision_start_token_id")),
        vision_end=token(_config_id(config, "vision_end_token_id")),
        why_paired=why,
    )


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def vl_info(
    model: Any,
    *,
    image: ImageFile | None = None,
    prompter: ImagePrompter | None = None,
    inputs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report's ``model.vl``: the class and what was benched (and the image prompt)."""
    info: dict[str, Any] = {
        "class": type(model).__name__,
        "benched": BENCHED_IMAGE if image is not None else BENCHED_TEXT,
    }
    if image is not None and prompter is not None and inputs is not None:
        ids = inputs["input_ids"]
        image_tokens = (
            int((ids[0] == prompter.image_token_id).sum())
            if prompter.image_token_id is not None
            else None
        )
        info["image"] = {
            **image.to_dict(),
            "processor": prompter.processor_class,
            "processor_kind": prompter.kind,
            **({"why_paired": prompter.why_paired} if prompter.why_paired else {}),
            "prompt_tokens": int(ids.shape[1]),
            "image_tokens": image_tokens,
        }
    return info
