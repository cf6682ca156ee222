"""pypto-download vs a plain ``snapshot_download``, side by side against one local hub.

Prints (and with --json, emits) two figures:

1. speed: wall time of ``pypto_download.download`` and of ``snapshot_download`` on the
   same repository (alternating, best of --repeat), and their ratio
   (plain / pypto: >= 0.9 means no meaningful overhead);
2. resume: a ``pypto-download`` process is SIGKILLed once ~50% of the repository has
   been sent, then re-run; total bytes sent by the hub over both runs / repository
   size, next to the fraction done at the kill.

Usage: python tools/bench_download.py [--size-mb 200] [--files 20] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from huggingface_hub import snapshot_download

from pypto_download import download
from pypto_testing.hub import LocalHub


def _make_repo(folder: Path, size_mb: int, nfiles: int) -> int:
    folder.mkdir(parents=True)
    per = size_mb * 1024 * 1024 // (nfiles - 2)
    total = 0
    for i in range(nfiles - 2):
        data = os.urandom(per)
        (folder / f"model-{i:05d}-of-{nfiles - 2:05d}.safetensors").write_bytes(data)
        total += len(data)
    for name, body in (
        ("config.json", b'{"model_type": "llama"}'),
        ("tokenizer.json", b"{}" * 1000),
    ):
        (folder / name).write_bytes(body)
        total += len(body)
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-download-"))
    os.environ["HF_HOME"] = str(work / "hf_home")  # no shared cache between arms
    try:
        size = _make_repo(work / "src", args.size_mb, args.files)
        with LocalHub(root=work / "hub") as hub:
            hub.add_repo("bench/model", work / "src")
            times: dict[str, list[float]] = {"pypto": [], "plain": []}
            for r in range(args.repeat):
                for arm in ("plain", "pypto") if r % 2 == 0 else ("pypto", "plain"):
                    dest = work / f"{arm}-{r}"
                    t0 = time.perf_counter()
                    if arm == "plain":
                        snapshot_download(
                            "bench/model",
                            endpoint=hub.endpoint,
                            local_dir=dest,
                            max_workers=args.workers,
                        )
                    else:
                        download(
                            "bench/model",
                            dest,
                            endpoint=hub.endpoint,
                            max_workers=args.workers,
                            progress=False,
                        )
                    times[arm].append(time.perf_counter() - t0)
                    shutil.rmtree(dest)
            best = {k: min(v) for k, v in times.items()}

            # resume after a kill at ~50%
            hub.clear_requests()
            dest = work / "resume"
            code = (
                "from pypto_download import download; "
                f"download('bench/model', {str(dest)!r}, endpoint={hub.endpoint!r}, progress=False, "
                f"max_workers={args.workers})"
            )
            proc = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ))
            while proc.poll() is None and hub.bytes_sent(method="GET") < size * 0.5:
                time.sleep(0.005)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            hub.wait_idle()  # count only what the server finished writing
            first = hub.bytes_sent(method="GET")
            done_files = {r.file_path for r in hub.requests if r.method == "GET" and r.finished and r.status == 200
                          and r.bytes_sent == (work / "src" / (r.file_path or "")).stat().st_size}  # fmt: skip
            done_bytes = sum((work / "src" / p).stat().st_size for p in done_files if p)
            hub.clear_requests()
            t0 = time.perf_counter()
            download(
                "bench/model", dest, endpoint=hub.endpoint, max_workers=args.workers, progress=False
            )
            resume_s = time.perf_counter() - t0
            hub.wait_idle()
            second = hub.bytes_sent(method="GET")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    report = {
        "repo_bytes": size,
        "files": args.files,
        "workers": args.workers,
        "pypto_s": round(best["pypto"], 3),
        "plain_s": round(best["plain"], 3),
        "speed_ratio_plain_over_pypto": round(best["plain"] / best["pypto"], 3),
        "kill_fraction_sent": round(first / size, 3),
        "kill_fraction_complete_files": round(done_bytes / size, 3),
        "resume_run_fraction_sent": round(second / size, 3),
        "total_sent_over_size": round((first + second) / size, 3),
        "resume_s": round(resume_s, 3),
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(f"repository: {size / 2**20:.0f} MiB in {args.files} files, {args.workers} workers")
        print(f"speed: pypto-download {report['pypto_s']}s vs snapshot_download {report['plain_s']}s "
              f"-> ratio (plain/pypto) {report['speed_ratio_plain_over_pypto']} (target >= 0.9)")  # fmt: skip
        print(f"resume: killed at {report['kill_fraction_sent']:.0%} sent "
              f"({report['kill_fraction_complete_files']:.0%} in complete files); resumed run sent "
              f"{report['resume_run_fraction_sent']:.0%}; total sent / size = {report['total_sent_over_size']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
