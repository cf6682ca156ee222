#!/usr/bin/env python3
"""Train the small causal LM that the pypto demo runs on (CPU only, seeded).

Why this exists: the demo must run end to end on a fresh 2-core machine that
reaches no model hub, and its smoke gate checks that greedy generation gives
readable text.  A random-weight tiny model cannot pass that honestly, so we ship
a real (if very small) language model, trained here from public-domain text.

Data: the King James Version of the Bible (1769 standard text), taken from the
Debian package ``sword-text-kjv`` (version pinned below; "Public Domain" per the
package's copyright file).  We fetch it with ``apt-get download`` (Debian's
ordinary client), read the .deb with the standard library (``ar`` + ``tar``),
decode the SWORD zText module (zlib blocks + index files), strip the OSIS markup
(Strong's numbers, footnotes, headings) and check the sha256 of the resulting
plain text before training on it.

Model: ``LlamaForCausalLM`` (transformers-native, no remote code) with a
byte-level BPE tokenizer trained by ``tokenizers`` on the same text.

Usage (from the repository root)::

    python tools/train_demo_model.py                       # fetch, train, write the folder
    python tools/train_demo_model.py --deb PATH.deb        # use an already downloaded .deb
    python tools/train_demo_model.py --extract-only        # just write the corpus and print its sha256

Exit codes: 0 ok, 1 training failed the readability check, 2 bad input (e.g. a
corpus whose sha256 differs), 3 environment missing (no apt-get and no --deb).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "packages" / "pypto-e2e" / "src" / "pypto_e2e" / "demo_model"

DEB_PACKAGE = "sword-text-kjv"
DEB_VERSION = "14.3-1"
# sha256 of the plain text produced by kjv_plain_text() from the pinned package.
# The training refuses any other text so that the shipped weights can be re-made.
CORPUS_SHA256 = "e3a48b23fd4ff21121c2b1afc9f76c020a67a37cc7a59758f12b450589b0dc9c"
MODULE_DIR = "usr/share/sword/modules/texts/ztext/engKJV2006eb"

SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}


class DemoModelError(Exception):
    """A failure with a one-line message that names the problem and the fix."""

    exit_code = 1


class BadInputError(DemoModelError):
    exit_code = 2


class EnvironmentMissingError(DemoModelError):
    exit_code = 3


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- data


def fetch_deb(work_dir: Path) -> Path:
    """Download the pinned .deb with apt-get (the registry's ordinary client)."""
    pattern = f"{DEB_PACKAGE}_{DEB_VERSION.split(':')[-1]}_all.deb"
    existing = work_dir / pattern
    if existing.is_file():
        return existing
    if shutil.which("apt-get") is None:
        raise EnvironmentMissingError(
            f"apt-get not found; download {DEB_PACKAGE}={DEB_VERSION} from a Debian mirror "
            "and pass it with --deb PATH"
        )
    work_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["apt-get", "download", f"{DEB_PACKAGE}={DEB_VERSION}"],
        cwd=work_dir,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not existing.is_file():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentMissingError(
            f"apt-get download {DEB_PACKAGE}={DEB_VERSION} failed ({last}); run 'apt-get update' "
            "or pass an already downloaded file with --deb PATH"
        )
    return existing


def read_deb_members(deb: Path, prefix: str) -> dict[str, bytes]:
    """Return the files under ``prefix`` in a .deb's data archive (stdlib only, no dpkg)."""
    raw = deb.read_bytes()
    if not raw.startswith(b"!<arch>\n"):
        raise BadInputError(f"{deb} is not a Debian package (no ar header); pass the .deb itself")
    pos, data_tar = 8, None
    while pos + 60 <= len(raw):
        header = raw[pos : pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = raw[pos + 60 : pos + 60 + size]
        if name.startswith("data.tar"):
            data_tar = body
        pos += 60 + size + (size % 2)
    if data_tar is None:
        raise BadInputError(f"{deb} has no data.tar member; is it a complete download?")
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data_tar), mode="r:*") as tar:
        for member in tar.getmembers():
            path = member.name.lstrip("./")
            if member.isfile() and path.startswith(prefix):
                fh = tar.extractfile(member)
                assert fh is not None
                out[path[len(prefix) :].lstrip("/")] = fh.read()
    return out


_NOTE = re.compile(rb"<note\b.*?</note>", re.S)
_TITLE = re.compile(rb"<title\b.*?</title>", re.S)
_TAG = re.compile(rb"<[^>]*>")
_CHAPTER = re.compile(rb'<chapter\b[^>]*\bsID="')
_SPACE = re.compile(r"\s+")


def kjv_plain_text(files: dict[str, bytes]) -> str:
    """Decode the SWORD zText module into plain text: one chapter per paragraph.

    zText layout (SWORD's format): ``*.bzs`` lists compressed blocks as
    (offset, compressed size, raw size) uint32 triples; ``*.bzz`` holds the zlib
    blocks; ``*.bzv`` lists verses in canonical order as (block, offset, size)
    = uint32, uint32, uint16.  Verse text is OSIS XML: we drop footnotes and
    headings, keep the words, and start a new paragraph at each chapter.
    """
    chapters: list[str] = []
    current: list[str] = []
    for testament in ("ot", "nt"):
        bzs, bzz, bzv = (files[f"{testament}.{ext}"] for ext in ("bzs", "bzz", "bzv"))
        blocks = []
        for i in range(len(bzs) // 12):
            off, csize, usize = struct.unpack_from("<III", bzs, 12 * i)
            block = zlib.decompress(bzz[off : off + csize])
            if len(block) != usize:
                raise BadInputError(
                    f"{testament}.bzz block {i} has the wrong size; corrupt package?"
                )
            blocks.append(block)
        for i in range(len(bzv) // 10):
            bnum, off, size = struct.unpack_from("<IIH", bzv, 10 * i)
            if size == 0:
                continue
            verse = blocks[bnum][off : off + size]
            if _CHAPTER.search(verse) and current:
                chapters.append(" ".join(current))
                current = []
            verse = _TAG.sub(b"", _TITLE.sub(b"", _NOTE.sub(b"", verse)))
            text = verse.decode("utf-8")
            # Leftovers of the source markup: pilcrows (paragraph marks) and a stray
            # USFM "\\nd" (divine-name style) marker before some LORDs.
            text = text.replace("\u00b6", " ").replace("\\nd ", "")
            text = _SPACE.sub(" ", text).strip()
            if text:
                current.append(text)
    if current:
        chapters.append(" ".join(current))
    return "\n\n".join(chapters) + "\n"


def load_corpus(deb: Path, *, check_sha: bool = True) -> str:
    text = kjv_plain_text(read_deb_members(deb, MODULE_DIR))
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if check_sha and digest != CORPUS_SHA256:
        raise BadInputError(
            f"corpus sha256 {digest} != expected {CORPUS_SHA256}; {deb} is not "
            f"{DEB_PACKAGE} {DEB_VERSION} (re-download it) or the extraction code changed"
        )
    return text


def chapters_of(text: str) -> list[str]:
    return [p for p in text.split("\n\n") if p.strip()]


# ---------------------------------------------------------------------- tokenizer


def train_tokenizer(chapters: list[str], vocab_size: int):
    """Byte-level BPE: every byte is representable, so no prompt ever hits an unknown token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [SPECIALS["pad_token"], SPECIALS["bos_token"], SPECIALS["eos_token"]]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(chapters, trainer)
    bos = SPECIALS["bos_token"]
    # Prompts start with <s> exactly as every training chapter does.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=512, **SPECIALS)
    fast.padding_side = "left"  # batched greedy generation of a decoder-only model
    return fast


def encode_corpus(tokenizer, chapters: list[str]):
    import torch

    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    ids: list[int] = []
    # Chapters are longer than model_max_length; they are cut into windows later.
    for enc in tokenizer.backend_tokenizer.encode_batch(chapters, add_special_tokens=False):
        ids.append(bos)
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


# -------------------------------------------------------------------------- model


def build_model(args, vocab_size: int, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_positions,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def lr_at(step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def evaluate(model, data, args) -> float:
    import torch

    model.eval()
    t = args.context
    starts = range(0, len(data) - t - 1, t)
    losses = []
    with torch.no_grad():
        for i in range(0, len(starts), args.batch):
            x = torch.stack([data[s : s + t] for s in list(starts)[i : i + args.batch]])
            losses.append(model(input_ids=x, labels=x).loss.item())
    model.train()
    return sum(losses) / max(1, len(losses))


def greedy(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[str]:
    import torch

    outs = []
    model.eval()
    with torch.no_grad():
        for prompt in prompts:
            enc = tokenizer(prompt, return_tensors="pt")
            gen = model.generate(
                **enc,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
            outs.append(tokenizer.decode(gen[0], skip_special_tokens=True))
    model.train()
    return outs


def readability(prompts: list[str], texts: list[str]) -> float:
    """Share of distinct words among the generated words (1.0 = no repetition).

    Only the continuation counts, and fewer than 5 generated words per prompt
    scores 0: a collapsed model emits one token (often punctuation) forever.  We
    only require some variety, since a model this small repeats phrases.
    """
    words = []
    for prompt, text in zip(prompts, texts, strict=True):
        words.extend(
            re.findall(r"[A-Za-z]+", text[len(prompt) :] if text.startswith(prompt) else text)
        )
    if len(words) < 5 * len(prompts):
        return 0.0
    return len(set(words)) / len(words)


PROMPTS = ["The king said", "And it came to pass", "In the beginning"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="model folder to (re)write")
    p.add_argument(
        "--deb", type=Path, help=f"an already downloaded {DEB_PACKAGE} {DEB_VERSION} .deb"
    )
    p.add_argument(
        "--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "pypto-demo-model"
    )
    p.add_argument(
        "--extract-only", action="store_true", help="write corpus.txt to --work-dir and stop"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=384)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--max-positions", type=int, default=512)
    p.add_argument("--context", type=int, default=256, help="training sequence length")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--save-dtype", choices=["float16", "bfloat16", "float32"], default="float16")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--sample-every", type=int, default=0, help="print greedy samples every N steps")
    p.add_argument("--min-variety", type=float, default=0.25, help="fail below this word variety")
    return p.parse_args(argv)


def command_line(argv: list[str]) -> str:
    return " ".join(["python", "tools/train_demo_model.py", *argv])


def train(args: argparse.Namespace, argv: list[str]) -> int:
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    deb = args.deb if args.deb is not None else fetch_deb(args.work_dir)
    if not deb.is_file():
        raise BadInputError(f"{deb} does not exist; pass the downloaded .deb or drop --deb")
    deb_sha = hashlib.sha256(deb.read_bytes()).hexdigest()
    text = load_corpus(deb, check_sha=not args.extract_only)
    corpus_sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    log(f"corpus: {deb.name} (sha256 {deb_sha}) -> {len(text.encode())} bytes, sha256 {corpus_sha}")
    if args.extract_only:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        (args.work_dir / "corpus.txt").write_text(text, encoding="utf-8")
        print(corpus_sha)
        return 0

    t_start = time.perf_counter()
    chapters = chapters_of(text)
    tokenizer = train_tokenizer(chapters, args.vocab)
    data = encode_corpus(tokenizer, chapters)
    n_val = len(data) // 100  # the last 1% (end of Revelation) is held out
    train_data, val_data = data[:-n_val], data[-n_val:]
    t_tok = time.perf_counter() - t_start
    log(
        f"tokenizer: vocab {len(tokenizer)}, corpus {len(data)} tokens ({len(text) / len(data):.2f} chars/token), {t_tok:.1f} s"
    )

    model = build_model(args, len(tokenizer), tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: LlamaForCausalLM, {n_params} parameters ({n_params / 1e6:.2f} M)")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(args.seed)
    model.train()
    curve: list[tuple[int, float]] = []
    window: list[float] = []
    t_train = time.perf_counter()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        starts = torch.randint(0, len(train_data) - args.context, (args.batch,), generator=gen)
        x = torch.stack([train_data[s : s + args.context] for s in starts.tolist()])
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        window.append(loss.item())
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            mean = sum(window) / len(window)
            window = []
            curve.append((step + 1, mean))
            elapsed = time.perf_counter() - t_train
            eta = elapsed / (step + 1) * (args.steps - step - 1)
            log(
                f"step {step + 1:5d}/{args.steps}  loss {mean:.3f}  lr {lr_at(step, args):.2e}  {elapsed:6.0f} s  eta {eta:5.0f} s"
            )
        if args.sample_every and (step + 1) % args.sample_every == 0:
            for s in greedy(model, tokenizer, PROMPTS, 24):
                log(f"    sample: {s!r}")
    train_s = time.perf_counter() - t_train
    val_loss = evaluate(model, val_data, args)
    log(
        f"trained {args.steps} steps ({args.steps * args.batch * args.context} tokens) in {train_s:.0f} s; held-out loss {val_loss:.3f}"
    )
    fp32_samples = greedy(model, tokenizer, PROMPTS, 40)

    out = save_folder(model, tokenizer, args)
    reloaded = load_fp32(out)
    samples = greedy(reloaded, tokenizer, PROMPTS, 40)
    for p, s32, s in zip(PROMPTS, fp32_samples, samples, strict=True):
        log(f"--- {p!r}\n  trained fp32 : {s32}\n  saved->fp32  : {s}")
    variety = readability(PROMPTS, samples)
    weights_sha = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    write_card(
        out,
        args=args,
        argv=argv,
        facts={
            "deb_sha": deb_sha,
            "corpus_sha": corpus_sha,
            "corpus_bytes": len(text.encode()),
            "corpus_tokens": len(data),
            "n_params": n_params,
            "tok_s": t_tok,
            "train_s": train_s,
            "curve": curve,
            "val_loss": val_loss,
            "samples": list(zip(PROMPTS, samples, strict=True)),
            "weights_sha": weights_sha,
            "variety": variety,
            "torch": torch.__version__,
        },
    )
    sizes = {f.name: f.stat().st_size for f in sorted(out.iterdir())}
    log(f"wrote {out}: {sizes} (total {sum(sizes.values())} bytes); word variety {variety:.2f}")
    if variety < args.min_variety:
        log(
            f"greedy output is too repetitive (variety {variety:.2f} < {args.min_variety}); train longer"
        )
        return 1
    return 0


def save_folder(model, tokenizer, args: argparse.Namespace) -> Path:
    """Write the folder next to --out and swap it in only when complete."""
    import torch
    from transformers import GenerationConfig

    out: Path = args.out
    tmp = out.parent / f".{out.name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model = model.to(getattr(torch, args.save_dtype))
    # Stored in half precision to halve the size, but meant to run in float32 on
    # CPU: config.json says float32, so from_pretrained(dtype="auto") upcasts.
    model.config.dtype = "float32"
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        max_new_tokens=40,
    )
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    # The generic class name loads on every transformers we support (v5 maps it
    # to its TokenizersBackend); v5's own name would not load on older releases.
    tok_path = tmp / "tokenizer_config.json"
    tok_cfg = json.loads(tok_path.read_text())
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_path.write_text(json.dumps(tok_cfg, indent=2, sort_keys=True) + "\n")
    model.to(torch.float32)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def load_fp32(path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    return model.eval()


def write_card(out: Path, *, args: argparse.Namespace, argv: list[str], facts: dict) -> None:
    f = facts
    curve = "\n".join(f"| {s} | {loss:.3f} |" for s, loss in f["curve"])
    samples = "\n".join(f"- `{p}` → {s!r}" for p, s in f["samples"])
    tokens_seen = args.steps * args.batch * args.context
    text = f"""# pypto demo model (KJV-trained tiny Llama)

A very small causal language model that the pypto demo runs on: a real
`LlamaForCausalLM` (no remote code), trained from scratch on CPU so that its greedy
continuation of a prompt is readable (archaic, Bible-flavoured) English. It is a
test and demo artefact, not a useful language model.

## Architecture

| field | value |
|---|---|
| class | `LlamaForCausalLM` (`model_type: llama`) |
| parameters | {f["n_params"]:,} ({f["n_params"] / 1e6:.2f} M; input and output embeddings tied) |
| hidden / intermediate | {args.hidden} / {args.intermediate} |
| layers / heads / KV heads | {args.layers} / {args.heads} / {args.kv_heads} (grouped-query attention) |
| vocabulary | {args.vocab} (byte-level BPE trained with `tokenizers` on the same text) |
| context | trained on {args.context}-token windows; `max_position_embeddings` {args.max_positions} |
| stored weights | `model.safetensors` in {args.save_dtype}; `config.json` says `dtype: float32`, so `from_pretrained` upcasts on load |
| specials | `<s>` (bos, added in front of every prompt by the tokenizer), `</s>` (eos), `<pad>` (pad); no chat template |

## Data

The King James Version of the Bible (standard text of 1769), as shipped in the
Debian package `{DEB_PACKAGE}` version `{DEB_VERSION}` (bookworm; SWORD module
`engKJV2006eb` by CrossWire Bible Society and eBible.org). Licence of the text:
**public domain** (the package's copyright file and module config say
"Public Domain"; outside the United Kingdom the text is not copyrighted, and in the
UK only the printing of it is restricted by the Crown's letters patent).

The training script fetches it with `apt-get download {DEB_PACKAGE}={DEB_VERSION}`,
reads the .deb with the Python standard library, decodes the SWORD zText module and
removes the OSIS markup (Strong's numbers, footnotes, headings, pilcrows), giving one
paragraph per chapter:

- .deb sha256: `{f["deb_sha"]}`
- plain text: {f["corpus_bytes"]:,} bytes, sha256 `{f["corpus_sha"]}` (checked before training)
- {f["corpus_tokens"]:,} tokens; the last 1% (the end of Revelation) is held out.

## Training

```
{command_line(argv)}
```

Seed {args.seed}, `torch.set_num_threads({args.threads})`, deterministic algorithms on,
AdamW (lr {args.lr:g}, betas 0.9/0.95, weight decay {args.weight_decay:g}), {args.warmup}
warm-up steps then cosine decay to 10%, batch {args.batch} x {args.context} tokens,
{args.steps} steps ({tokens_seen:,} tokens, {tokens_seen / f["corpus_tokens"]:.1f} passes over
the text). Tokenizer training took {f["tok_s"]:.0f} s and model training {f["train_s"] / 60:.1f} min
of wall time with {args.threads} thread(s) on a 2-core machine shared with other jobs (torch
{f["torch"]}; with other jobs running, two OpenMP threads measured 5x slower per step than one).
Held-out loss: **{f["val_loss"]:.3f}**.

| step | mean training loss |
|---|---|
{curve}

## Greedy continuations (40 new tokens, weights loaded as float32)

{samples}

Check them again with `python tools/check_demo_model.py` (loads the folder with
`AutoModelForCausalLM.from_pretrained(path, local_files_only=True)`, which gives float32).

## Files

`model.safetensors` sha256: `{f["weights_sha"]}`

Re-running the command above on the same torch version should give the same
weights; another torch version or CPU may differ in the last bits.
"""
    (out / "README.md").write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))  # tokenizers' trainer
    try:
        return train(args, argv)
    except DemoModelError as err:
        log(f"error: {err}")
        return err.exit_code
    except ImportError as err:
        log(f"error: {err}; install torch, transformers and tokenizers")
        return 3


if __name__ == "__main__":
    sys.exit(main())
