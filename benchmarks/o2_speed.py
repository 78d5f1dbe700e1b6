"""Forward time, parameters and FLOPs of the D4 square O(2)-subgroup ViT against a timm ViT.

Both models have the same total width D (the O(2) model: D / 8 copies of the regular
representation of D4), the same tokens (256 patches of 16^2 pixels of a 256^2 image, one class
token), depth 6, 3 heads and MLP hidden width 2D. Writes JSON and prints a table.
Usage: ``python benchmarks/o2_speed.py [--device cuda] [--batch 32] [--widths 48 96 192]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import timm
import torch
from torch.utils.flop_counter import FlopCounterMode

import eqvit


def forward_time(model: torch.nn.Module, x: torch.Tensor, repeats: int) -> float:
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    times = []
    with torch.no_grad():
        model(x)
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            model(x)
            sync()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def flops(model: torch.nn.Module, x: torch.Tensor) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return int(counter.get_total_flops())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--widths", type=int, nargs="+", default=[48, 96, 192])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "o2_speed.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    x = torch.randn(args.batch, 3, 256, 256, device=device)
    rows = []
    for width in args.widths:
        o2 = eqvit.create_model("o2vit_square_s", embed_dim=width, num_classes=38).to(device).eval()
        vit = (
            timm.create_model(
                "vit_tiny_patch16_224",
                img_size=256,
                embed_dim=width,
                depth=6,
                num_heads=3,
                mlp_ratio=2.0,
                num_classes=38,
            )
            .to(device)
            .eval()
        )
        row = {"width": width}
        for name, model in (("o2vit_D4", o2), ("timm_vit", vit)):
            row[name] = {
                "forward_s": forward_time(model, x, args.repeats),
                "params": sum(p.numel() for p in model.parameters()),
                "gflops": flops(model, x) / 1e9,
            }
        row["forward_ratio"] = row["o2vit_D4"]["forward_s"] / row["timm_vit"]["forward_s"]
        rows.append(row)
        print(
            f"D={width:4d}  o2vit {row['o2vit_D4']['forward_s'] * 1e3:8.1f} ms {row['o2vit_D4']['gflops']:7.2f} GFLOP "
            f"{row['o2vit_D4']['params']:9d} params | timm {row['timm_vit']['forward_s'] * 1e3:8.1f} ms "
            f"{row['timm_vit']['gflops']:7.2f} GFLOP {row['timm_vit']['params']:9d} params "
            f"| ratio {row['forward_ratio']:.2f}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": str(device), "batch": args.batch, "torch": torch.__version__, "machine": platform.machine()}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
