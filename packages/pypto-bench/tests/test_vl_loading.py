"""Vision-language checkpoints (issue #26): loaded through AutoModelForImageTextToText,
benched on text prompts (their language model) or, with --image, whole on an image prompt.

Real tiny Qwen3-VL folders built with transformers' own classes
(``pypto_testing.architectures`` / ``pypto_testing.vl``), the real CLI in process, the
reports it writes read back.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import jsonschema
import pytest
import torch

from pypto_bench import EXIT, BadInputError, ModelLoadError, schema
from pypto_bench.bench import IMAGE_CAPTURE_NOTE
from pypto_bench.cli import main
from pypto_bench.loading import CAUSAL_LM, IMAGE_TEXT_TO_TEXT, auto_class_name
from pypto_bench.report import report_to_markdown, validate_report
from pypto_bench.vision import BENCHED_IMAGE, BENCHED_TEXT, MAX_IMAGE_BYTES
from pypto_testing.architectures import available

pytestmark = pytest.mark.skipif(
    available("qwen3_vl") is not None, reason=f"{available('qwen3_vl')}"
)

VL_CLASS = "Qwen3VLForConditionalGeneration"
#: Small runs: the graph arms compile on two shared cores.
RUN = ["--device", "cpu", "--seq", "8", "--warmup", "1", "--iters", "2", "--no-bandwidth"]


def _letters_only(path: Path) -> Path:
    """Random weights emit undecodable bytes and fail the smoke gate by design; an output
    layer that only lets lowercase letters and spaces win passes it (conftest's recipe)."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = AutoModelForImageTextToText.from_pretrained(str(path), local_files_only=True)
    with torch.no_grad():
        w = model.lm_head.weight
        for i in range(w.shape[0]):
            s = tok.decode([i])
            if len(s) == 1 and ((s.isalpha() and s.islower()) or s == " "):
                w[i] *= 4.0
            else:
                w[i] = 0
    model.save_pretrained(str(path), safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def vl_folder(tmp_path_factory) -> Path:
    """The plain tiny qwen3_vl (config + safetensors + byte tokenizer), letters-only output."""
    from pypto_testing.architectures import make_tiny_architecture

    return _letters_only(make_tiny_architecture(tmp_path_factory.mktemp("vl") / "m", "qwen3_vl"))


@pytest.fixture(scope="module")
def vl_image_folder(tmp_path_factory) -> Path:
    """The tiny qwen3_vl with Qwen's vision tokens and processor files (for --image)."""
    from pypto_testing.vl import make_tiny_qwen3_vl

    return _letters_only(make_tiny_qwen3_vl(tmp_path_factory.mktemp("vlimg") / "m"))


@pytest.fixture(scope="module")
def png(tmp_path_factory) -> Path:
    from PIL import Image

    path = tmp_path_factory.mktemp("img") / "card.png"
    img = Image.new("RGB", (40, 24), (200, 30, 60))
    for x in range(0, 40, 3):
        img.putpixel((x, x % 24), (10, 200, 90))
    img.save(path)
    return path


def _run(args: list[str], capsys) -> tuple[int, list[str]]:
    code = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def _errors(lines: list[str]) -> list[str]:
    return [ln for ln in lines if ln.startswith("pypto-bench: error")]


# --- which Auto class ------------------------------------------------------------------


def test_auto_class_routes_image_text_to_text_only_types():
    assert auto_class_name({"model_type": "qwen3_vl"}) == IMAGE_TEXT_TO_TEXT
    assert auto_class_name({"model_type": "llama"}) == CAUSAL_LM
    # A type in both mappings keeps its causal-LM class; --image asks for the whole model.
    assert auto_class_name({"model_type": "gemma3"}) == CAUSAL_LM
    assert auto_class_name({"model_type": "gemma3"}, image=True) == IMAGE_TEXT_TO_TEXT
    # transformers' block-diffusion classes keep their route (not vision-language).
    assert auto_class_name({"model_type": "diffusion_gemma"}) == IMAGE_TEXT_TO_TEXT
    # A folder pinned to a causal-LM class (pypto-patch) keeps it on a VL model type.
    pinned = {"model_type": "minimax_m3_vl", "auto_map": {CAUSAL_LM: "modeling_x.X"}}
    assert auto_class_name(pinned) == CAUSAL_LM
    # Remote VL code that names only an image-text-to-text class.
    remote = {"model_type": "my_vl", "auto_map": {IMAGE_TEXT_TO_TEXT: "modeling_x.X"}}
    assert auto_class_name(remote) == IMAGE_TEXT_TO_TEXT


@pytest.mark.parametrize(
    ("config", "needles"),
    [
        ({"model_type": "clip"}, ["'clip'", "CLIPConfig", "no causal-LM or image-text-to-text"]),
        ({"model_type": "no_such_vl"}, ["'no_such_vl'", "unknown to transformers", "upgrade"]),
        (
            {"model_type": "no_such_vl", "auto_map": {"AutoModel": "modeling_x.X"}},
            ["'no_such_vl'", "AutoModel", "pypto-patch"],
        ),
    ],
)
def test_a_model_no_class_can_load_is_named_not_listed(config, needles):
    with pytest.raises(ModelLoadError) as got:
        auto_class_name(config)
    msg = str(got.value)
    for needle in needles:
        assert needle in msg
    assert "should be one of" not in msg
    assert len(msg) < 400


def test_image_on_a_model_without_vision_is_bad_input():
    with pytest.raises(BadInputError, match="needs a vision-language model"):
        auto_class_name({"model_type": "llama"}, image=True)
    with pytest.raises(BadInputError, match="needs a vision-language model"):
        auto_class_name({"model_type": "diffusion_gemma"}, image=True)


@pytest.mark.parametrize(
    ("config", "code", "needle"),
    [
        ({"model_type": "clip"}, EXIT.LOAD_FAILED, "'clip' (CLIPConfig)"),
        (
            {"model_type": "my_vl", "auto_map": {IMAGE_TEXT_TO_TEXT: "modeling_x.X"}},
            EXIT.LOAD_FAILED,
            "--trust-remote-code",
        ),
    ],
)
def test_unservable_vl_folders_fail_in_one_line(tmp_path, capsys, config, code, needle):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    for argv in (
        ["smoke", "--model-path", str(folder), "--device", "cpu"],
        ["run", "--model-path", str(folder), "--device", "cpu", "--gen", "2"],
    ):
        got, err = _run(argv, capsys)
        assert got == code, err
        assert len(_errors(err)) == 1, err
        assert needle in _errors(err)[0]
        assert "should be one of" not in "\n".join(err)


# --- text prompts: the language model ---------------------------------------------------


def test_smoke_passes_on_a_vl_folder(vl_folder, capsys):
    code = main(["smoke", "--model-path", str(vl_folder), "--device", "cpu", "--json"])
    out = capsys.readouterr()
    res = json.loads(out.out)
    assert code == EXIT.OK, res["reason"]
    assert res["passed"]
    assert res["logits_finite"] is True
    assert res["model_class"] == VL_CLASS
    assert res["vl"] == {"class": VL_CLASS, "benched": BENCHED_TEXT}
    assert "vision-language" in out.err


@pytest.mark.slow
@pytest.mark.parametrize("regime", ["decode", "prefill"])
def test_vl_language_model_benches_eager_and_graph(vl_folder, tmp_path, capsys, regime):
    report = tmp_path / f"{regime}.json"
    argv = ["run", "--model-path", str(vl_folder), "--regime", regime, "--arms", "eager,graph"]
    code, err = _run([*argv, *RUN, "--gen", "6", "--report-file", str(report)], capsys)
    assert code == EXIT.OK, err
    data = json.loads(report.read_text())
    jsonschema.validate(data, schema())
    validate_report(data)
    assert data["model"]["class"] == VL_CLASS
    assert data["model"]["vl"] == {"class": VL_CLASS, "benched": BENCHED_TEXT}
    eager, graph = data["arms"]
    assert eager["ok"], eager["error"]
    assert graph["ok"], graph["error"]
    # The bench checks agreement itself: the captured language model's greedy tokens
    # (decode: the capture-safe runner with its 2-D position ids) equal eager's.
    assert graph["token_match"]["rate"] == 1.0
    if regime == "prefill":
        assert eager["tokens_per_iter"] == [8, 8]  # batch 1 x seq 8
    md = report_to_markdown(data)
    assert f"vision-language model {VL_CLASS}: benched its {BENCHED_TEXT}" in md


# --- --image: the whole model -------------------------------------------------------------


@pytest.mark.slow
def test_image_prefill_runs_the_whole_model(vl_image_folder, png, tmp_path, capsys):
    report = tmp_path / "image.json"
    argv = ["run", "--model-path", str(vl_image_folder), "--regime", "prefill", "--arms", "eager"]
    code, err = _run(
        [*argv, *RUN, "--batch", "2", "--image", str(png), "--report-file", str(report)], capsys
    )
    assert code == EXIT.OK, err
    data = json.loads(report.read_text())
    jsonschema.validate(data, schema())
    vl = data["model"]["vl"]
    assert vl["class"] == VL_CLASS
    assert vl["benched"] == BENCHED_IMAGE
    img = vl["image"]
    assert (img["width"], img["height"], img["format"]) == (40, 24, "PNG")
    assert img["path"] == str(png.resolve())
    assert len(img["sha256"]) == 64
    # 40x24 resized to 32x32 = 4x4 patches of 8, merged 2x2: 4 image tokens per row.
    assert img["image_tokens"] == 4
    assert img["prompt_tokens"] > 8 + img["image_tokens"]  # text + template + image
    assert data["config"]["image"] == str(png)
    (eager,) = data["arms"]
    assert eager["ok"], eager["error"]
    assert eager["tokens_per_iter"] == [2 * img["prompt_tokens"]] * 2
    assert "card.png, 40x24 PNG; 4 image tokens" in report_to_markdown(data)


@pytest.mark.slow
def test_image_prompt_graph_arm_fails_in_the_vision_tower_with_the_way_on(
    vl_image_folder, png, tmp_path, capsys
):
    """Qwen's vision tower reads the image grid on the host: the whole forward cannot be
    one graph. The arm is recorded as failed, explained, and the note names the way on."""
    report = tmp_path / "graph.json"
    argv = ["run", "--model-path", str(vl_image_folder), "--regime", "prefill", "--arms", "graph"]
    code, err = _run([*argv, *RUN, "--image", str(png), "--report-file", str(report)], capsys)
    assert code == EXIT.ARM_FAILED, err
    (graph,) = json.loads(report.read_text())["arms"]
    assert not graph["ok"]
    assert "CaptureFailedError" in graph["error"]
    assert f"graph: {IMAGE_CAPTURE_NOTE}" in graph["warnings"]


def test_smoke_with_image_runs_the_image_prompt_once(vl_image_folder, png, capsys):
    argv = ["smoke", "--model-path", str(vl_image_folder), "--device", "cpu", "--json"]
    code = main([*argv, "--image", str(png)])
    res = json.loads(capsys.readouterr().out)
    assert code == EXIT.OK, res["reason"]
    img = res["vl"]["image"]
    assert res["vl"]["benched"] == BENCHED_IMAGE
    assert img["logits_finite"] is True
    assert img["image_tokens"] == 4
    assert img["processor"] in ("Qwen3VLProcessor", "Qwen2VLImageProcessorPil")


def test_the_image_prompt_has_qwen_s_layout(vl_image_folder, png):
    """Qwen's layout whichever way the inputs were built: the folder's Qwen3VLProcessor
    (with torchvision) or, without torchvision (its video processor needs it), the image
    processor paired with the tokenizer."""
    from transformers import AutoTokenizer

    from pypto_bench.loading import read_model_config
    from pypto_bench.vision import load_image_prompter, read_image

    config = read_model_config(vl_image_folder)
    tok = AutoTokenizer.from_pretrained(str(vl_image_folder), local_files_only=True)
    prompter = load_image_prompter(vl_image_folder, config, tok)
    accepted = {"input_ids", "attention_mask", "pixel_values", "image_grid_thw"}
    out = prompter.inputs(read_image(png).image, "hi", 1, accepted | {"mm_token_type_ids"})
    ids = out["input_ids"][0].tolist()
    start, pad, end = (
        config[k] for k in ("vision_start_token_id", "image_token_id", "vision_end_token_id")
    )
    first = ids.index(start)
    assert ids[first : first + 6] == [start, pad, pad, pad, pad, end]
    assert out["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert out["mm_token_type_ids"][0].tolist() == [int(t == pad) for t in ids]
    assert tok.decode(ids, skip_special_tokens=True).endswith("user: hi\nassistant: ")


# --- refused before anything runs ---------------------------------------------------------


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width x height`` (a decompression bomb's shape)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0"))
        + chunk(b"IEND", b"")
    )


def _hostile(kind: str, tmp: Path, png: Path) -> Path:
    if kind == "folder":
        (tmp / "pics").mkdir()
        return tmp / "pics"
    if kind == "symlink":
        os.symlink(png, tmp / "link.png")
        return tmp / "link.png"
    if kind == "not an image":
        (tmp / "notes.png").write_text("these are words, not pixels\n")
        return tmp / "notes.png"
    if kind == "huge sparse":
        with open(tmp / "huge.png", "wb") as fh:
            fh.truncate(MAX_IMAGE_BYTES + 1)  # sparse: nothing is written to disk
        return tmp / "huge.png"
    if kind == "bomb":
        (tmp / "bomb.png").write_bytes(_png_header(100_000, 100_000))
        return tmp / "bomb.png"
    if kind == "elongated":  # passes the size checks; Qwen2-VL's resize refused it mid-run
        from PIL import Image

        Image.new("RGB", (8000, 1), (200, 10, 10)).save(tmp / "line.png")
        return tmp / "line.png"
    if kind == "missing":
        return tmp / "nope.png"
    raise AssertionError(kind)


@pytest.mark.parametrize(
    ("kind", "needle"),
    [
        ("folder", "is a folder"),
        ("symlink", "is a symbolic link"),
        ("not an image", "is not an image Pillow can read"),
        ("huge sparse", "over the 64 MiB limit"),
        ("bomb", "is too large to decode"),
        ("elongated", "more elongated than the 200:1"),
        ("missing", "does not exist"),
    ],
)
def test_hostile_image_is_one_line_bad_input_and_nothing_is_written(
    vl_image_folder, png, tmp_path, capsys, kind, needle
):
    from pypto_testing.folders import folder_bytes

    image = _hostile(kind, tmp_path, png)
    out = tmp_path / "out"
    out.mkdir()
    before = folder_bytes(vl_image_folder)
    report = out / "r.json"
    for argv in (
        ["run", "--model-path", str(vl_image_folder), "--regime", "prefill", *RUN],
        ["smoke", "--model-path", str(vl_image_folder), "--device", "cpu"],
    ):
        extra = ["--report-file", str(report)] if argv[0] == "run" else []
        code, err = _run([*argv, *extra, "--image", str(image)], capsys)
        assert code == EXIT.USAGE == 2, err
        errors = _errors(err)
        assert len(errors) == 1, err
        assert needle in errors[0]
        assert "--image" in errors[0]
        assert ": pass " in errors[0]  # the fix is named
    assert list(out.iterdir()) == []
    assert folder_bytes(vl_image_folder) == before


def test_image_with_decode_or_a_text_model_is_refused(vl_image_folder, tiny_llama, png, capsys):
    runs = [
        # --regime decode is the default: an image prompt has no decode regime here.
        (["run", "--model-path", str(vl_image_folder), "--device", "cpu"], "prefill regime only"),
        (
            ["run", "--model-path", str(tiny_llama), "--device", "cpu", "--regime", "prefill"],
            "needs a vision-language model",
        ),
        (["smoke", "--model-path", str(tiny_llama), "--device", "cpu"], "'llama'"),
    ]
    for argv, needle in runs:
        code, err = _run([*argv, "--image", str(png)], capsys)
        assert code == EXIT.USAGE, err
        assert len(_errors(err)) == 1, err
        assert needle in _errors(err)[0], err


def test_the_processor_helper_refuses_a_folder_whose_ids_do_not_fit(vl_folder):
    """make_tiny_architecture's qwen3_vl gives the vision tokens byte ids (3..6): the
    processor helper must refuse it rather than put image features on byte tokens."""
    from pypto_testing.folders import folder_bytes
    from pypto_testing.vl import write_qwen3_vl_processor

    before = folder_bytes(vl_folder)
    with pytest.raises(ValueError, match="make_tiny_qwen3_vl"):
        write_qwen3_vl_processor(vl_folder)
    assert folder_bytes(vl_folder) == before
