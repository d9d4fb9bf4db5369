"""Training throughput and memory of the sliced HydraViT against a dense ViT of the same shape.

For each precision and each head count k (and the sampled mix: one head count drawn uniformly from the
served ones per step, the dense side running the same draws through dense models of those shapes),
one training step of each side on the same batch: forward + cross-entropy + backward (images/s), and
separately the AdamW step (the sliced model's updates every shared weight whatever k is, as the
paper's training does; the dense model's only its own). Both sides use fused attention (the sliced
model trains with ``scaled_dot_product_attention``; the dense reference is timm's ViT on CUDA when timm
imports, else Hugging Face transformers' ``ViTForImageClassification`` with ``sdpa``). Steps of the two
sides are interleaved (ABBA) so both see the same load; images/s are medians, and each ratio is the
median of the per-step ratios (the mix: summed times over the same draws).

Memory, per side, from the allocator's own events (torch's profiler): what is held between steps
(weights and AdamW moments), the whole step's peak above nothing (held + everything the step
allocates), and the activation part: the forward + backward peak of what is neither held nor a
gradient. The mix's memory is its largest draw's (a step holds one subnetwork's activations). On CUDA
the JSON has ``torch.cuda.max_memory_allocated``'s figure for the same step beside it, as a check.
Writes train_throughput.{json,md,png} under ``--out``.

    .venv/bin/python bench/train_throughput.py --batch 8 --steps 3 --mix-steps 10   # CPU, b16
    .venv/bin/python bench/train_throughput.py --batch 128 --steps 20               # a GPU
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hydra_edge.convert.workers import cores
from hydra_edge.model.config import HydraConfig, preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.profiling.report import save_report, subplots
from hydra_edge.profiling.timing import bf16_flags, host_cpu

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}  # None: no autocast
MIB = 2**20
TIMM_NAMES = {3: "vit_tiny_patch16_224", 6: "vit_small_patch16_224", 12: "vit_base_patch16_224"}
Step = Callable[[], None]


def dense_reference(cfg: HydraConfig, k: int, device: torch.device) -> tuple[nn.Module, str]:
    """A dense ViT shaped like subnetwork k, as a user would otherwise train it: timm's on CUDA when timm
    imports (its fused attention), else transformers' with ``sdpa``; returns (module giving logits, name)."""
    narrow = cfg.narrowed(k)
    if device.type == "cuda":
        try:
            from timm.models.vision_transformer import VisionTransformer as TimmViT
        except ImportError:
            pass
        else:
            model = TimmViT(img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans,
                            num_classes=cfg.num_classes, embed_dim=narrow.embed_dim, depth=cfg.depth, num_heads=k,
                            mlp_ratio=cfg.mlp_ratio)
            shape = preset("b16").narrowed(k) if k in TIMM_NAMES else None
            return model.to(device), f"timm {TIMM_NAMES[k]}" if narrow == shape else "timm VisionTransformer"
    from transformers import ViTConfig, ViTForImageClassification

    hf = ViTForImageClassification(ViTConfig(
        hidden_size=narrow.embed_dim, num_hidden_layers=cfg.depth, num_attention_heads=k,
        intermediate_size=cfg.mlp_ratio * narrow.embed_dim, hidden_act="gelu", hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, layer_norm_eps=cfg.eps, image_size=cfg.img_size,
        patch_size=cfg.patch_size, num_channels=cfg.in_chans, num_labels=cfg.num_classes, qkv_bias=True,
        attn_implementation="sdpa"))
    return _Logits(hf).to(device), "transformers ViTForImageClassification (sdpa)"


class _Logits(nn.Module):
    """transformers' model called like the others: images in, logits out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=x).logits


class Side:
    """One side of the comparison: the module that serves each head count (one for the sliced model,
    one per k for the dense), each module's AdamW, one training step at a time."""

    def __init__(self, modules: dict[int, nn.Module], calls: dict[int, Callable[[torch.Tensor], torch.Tensor]],
                 compile: bool) -> None:
        self.modules = modules
        self.calls = {k: torch.compile(call) if compile else call for k, call in calls.items()}
        by_module: dict[int, torch.optim.Optimizer] = {}  # the sliced model has one, for every k
        for m in modules.values():
            if id(m) not in by_module:
                by_module[id(m)] = torch.optim.AdamW(m.parameters(), lr=1e-4)
        self.optimizers = {k: by_module[id(m)] for k, m in modules.items()}

    def fwd_bwd(self, k: int, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None) -> None:
        with torch.autocast(x.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = F.cross_entropy(self.calls[k](x), y)
        loss.backward()

    def opt_step(self, k: int) -> None:
        self.optimizers[k].step()

    def zero(self, k: int) -> None:
        self.optimizers[k].zero_grad(set_to_none=True)

    def held_bytes(self, k: int) -> int:
        """Weights and AdamW moments: what this side keeps between steps."""
        moments = sum(t.nbytes for s in self.optimizers[k].state.values() for t in s.values() if torch.is_tensor(t))
        return sum(p.nbytes for p in self.modules[k].parameters()) + moments


def sides(cfg: HydraConfig, heads: list[int], device: torch.device, compile: bool) -> tuple[Side, Side, str]:
    """The sliced model (one module serves every k) and the dense references (one per k)."""
    torch.manual_seed(0)
    hydra = HydraViT(cfg).to(device).train()
    sliced = Side({k: hydra for k in heads}, {k: _Heads(hydra, k) for k in heads}, compile)
    built = {k: dense_reference(cfg, k, device) for k in heads}
    dense = Side({k: m.train() for k, (m, _) in built.items()}, {k: m for k, (m, _) in built.items()}, compile)
    return sliced, dense, ", ".join(sorted({name for _, name in built.values()}))


class _Heads(nn.Module):
    """``hydra(x, heads=k)`` as a module of the images alone, like the dense side (and what
    ``torch.compile`` wraps)."""

    def __init__(self, hydra: HydraViT, k: int) -> None:
        super().__init__()
        self.hydra, self.k = hydra, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hydra(x, heads=self.k)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Step, device: torch.device) -> float:
    _sync(device)
    t = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t


def allocations(fn: Step, device: torch.device) -> list[tuple[int, int, int]]:
    """(ptr, bytes, +1 allocated / -1 freed) of every allocation ``fn`` makes on ``device``, in order:
    the allocator's own reports through torch's profiler (c10's CPU allocator, CUDA's caching one)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, profile_memory=True) as prof:
        fn()
        _sync(device)
    events: list[Any] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == device.type:
            events.append(node)
    events.sort(key=lambda n: n.start_time_ns)
    return [(n.extra_fields.ptr, abs(n.extra_fields.alloc_size), 1 if n.extra_fields.alloc_size > 0 else -1)
            for n in events]


def peaks(events: list[tuple[int, int, int]], kept: set[int]) -> tuple[int, int]:
    """Peak of everything allocated, and peak of what is not left allocated at a pointer in ``kept``
    (the gradients): (all, all but the gradients)."""
    survivors: dict[int, int] = {}  # ptr -> index of its live allocation
    for i, (ptr, _, sign) in enumerate(events):
        if sign > 0:
            survivors[ptr] = i
        else:
            survivors.pop(ptr, None)
    grads = {i for ptr, i in survivors.items() if ptr in kept}
    live = rest = peak = peak_rest = 0
    for i, (_, size, sign) in enumerate(events):
        live += sign * size
        rest += 0 if i in grads else sign * size
        peak, peak_rest = max(peak, live), max(peak_rest, rest)
    return peak, peak_rest


def memory(side: Side, k: int, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None) -> dict[str, float]:
    """One step's memory, once AdamW's moments exist: MiB held between steps, the whole step's peak and
    the forward + backward activation part (neither held nor a gradient)."""
    if not side.optimizers[k].state:  # a head count timed only within the mix: its moments made first
        side.fwd_bwd(k, x, y, dtype)
        side.opt_step(k)
    side.zero(k)
    held = side.held_bytes(k)
    cuda = x.device.type == "cuda"
    if cuda:  # the usual CUDA figure too, as a check: the counter's rise over this step
        torch.cuda.reset_peak_memory_stats(x.device)
        before = torch.cuda.memory_allocated(x.device)
    fwd_bwd = allocations(lambda: side.fwd_bwd(k, x, y, dtype), x.device)
    grads = [p.grad for p in side.modules[k].parameters() if p.grad is not None]
    grad_bytes = sum(g.nbytes for g in grads)
    peak, activations = peaks(fwd_bwd, {g.data_ptr() for g in grads})
    opt_peak, _ = peaks(allocations(lambda: side.opt_step(k), x.device), set())
    side.zero(k)
    out = {"held_mib": held / MIB, "grads_mib": grad_bytes / MIB,
           "peak_mib": (held + max(peak, grad_bytes + opt_peak)) / MIB, "activations_mib": activations / MIB}
    if cuda:
        out["cuda_max_allocated_mib"] = (held + torch.cuda.max_memory_allocated(x.device) - before) / MIB
    return out


def measure(sliced: Side, dense: Side, configs: list[str], draws: list[int], x: torch.Tensor, y: torch.Tensor,
            dtype: torch.dtype | None, steps: int) -> list[dict[str, Any]]:
    """Timed steps of both sides, interleaved; a config is a head count or "mix" (the ``draws``)."""
    device, batch = x.device, len(x)
    fixed = [int(c) for c in configs if c != "mix"]
    warm = sorted(set(fixed) | (set(draws) if "mix" in configs else set()))
    for side in (sliced, dense):
        for k in warm:  # first calls (kernel choice, AdamW's moments) untimed
            side.fwd_bwd(k, x, y, dtype)
            if k in fixed:
                side.opt_step(k)
            side.zero(k)
    times: dict[tuple[str, str, str], list[float]] = {}
    for rep in range(max(steps if fixed else 0, len(draws) if "mix" in configs else 0)):
        for config in configs:
            if (config == "mix" and rep >= len(draws)) or (config != "mix" and rep >= steps):
                continue
            k = draws[rep] if config == "mix" else int(config)
            for name, side in (("sliced", sliced), ("dense", dense))[::1 if rep % 2 else -1]:
                times.setdefault((config, name, "fwd_bwd"), []).append(timed(lambda: side.fwd_bwd(k, x, y, dtype), device))
                if config != "mix":
                    times.setdefault((config, name, "opt"), []).append(timed(lambda: side.opt_step(k), device))
                side.zero(k)
    rows = []
    for config in configs:
        fb = {name: times[config, name, "fwd_bwd"] for name in ("sliced", "dense")}
        if config == "mix":  # every draw once: images over summed time, on the same draws
            rate = {name: batch * len(t) / sum(t) for name, t in fb.items()}
            ratio = sum(fb["dense"]) / sum(fb["sliced"])
        else:
            rate = {name: batch / statistics.median(t) for name, t in fb.items()}
            ratio = statistics.median(d / s for s, d in zip(fb["sliced"], fb["dense"]))
        row: dict[str, Any] = {"heads": config, "sliced_img_s": rate["sliced"], "dense_img_s": rate["dense"],
                               "fwd_bwd_ratio": ratio, "steps": len(fb["sliced"])}
        if config != "mix":
            opt = {name: statistics.median(times[config, name, "opt"]) for name in ("sliced", "dense")}
            row |= {"sliced_opt_ms": 1e3 * opt["sliced"], "dense_opt_ms": 1e3 * opt["dense"]}
        rows.append(row)
    return rows


def bench(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    cfg = preset(args.preset)
    configs = [c.strip() for c in args.heads.split(",")]
    rng = random.Random(args.seed)
    draws = [rng.choice(cfg.heads) for _ in range(args.mix_steps)] if "mix" in configs else []
    fixed = sorted({int(c) for c in configs if c != "mix"})
    largest = max(draws, default=0)
    heads = sorted(set(fixed) | set(draws))
    if args.compile:  # one graph per head count (k is a constant in each): all of them, not dynamo's default 8
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, len(heads))
    sliced, dense, reference = sides(cfg, heads, device, args.compile)
    torch.manual_seed(1)
    x = torch.randn(args.batch, cfg.in_chans, cfg.img_size, cfg.img_size, device=device)
    y = torch.randint(0, cfg.num_classes, (args.batch,), device=device)
    load_before = os.getloadavg()[0]
    rows = []
    for precision in args.precision.split(","):
        dtype = PRECISIONS[precision]
        print(f"{precision}: timing {', '.join(configs)} (mix draws: {draws})", flush=True)
        measured = measure(sliced, dense, configs, draws, x, y, dtype, args.steps)
        mem_heads = sorted(set(fixed) | ({largest} if draws else set()))
        mem = {(k, name): memory(side, k, x, y, dtype) for k in mem_heads
               for name, side in (("sliced", sliced), ("dense", dense))}
        for row in measured:
            k = largest if row["heads"] == "mix" else int(row["heads"])
            row = {"precision": precision, **row, "memory_heads": k,
                   "sliced_memory": mem[k, "sliced"], "dense_memory": mem[k, "dense"]}
            row["peak_ratio"] = row["sliced_memory"]["peak_mib"] / row["dense_memory"]["peak_mib"]
            row["activation_ratio"] = (row["sliced_memory"]["activations_mib"]
                                       / max(row["dense_memory"]["activations_mib"], 1e-9))
            rows.append(row)
            print({k: v for k, v in row.items() if not k.endswith("_memory")}, flush=True)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "host": host_cpu(), "bf16_flags": bf16_flags(), "torch": torch.__version__,
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "model": f"{args.preset} preset ({cfg.depth} blocks, {cfg.img_size} px, head width {cfg.head_dim})",
        "dense_reference": reference, "batch": args.batch, "steps": args.steps, "mix_draws": draws,
        "compile": args.compile, "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "rows": rows,
    }


def markdown(report: dict[str, Any]) -> str:
    lines = []
    for r in report["rows"]:
        s, d = r["sliced_memory"], r["dense_memory"]
        opt = (f"{r['sliced_opt_ms']:.1f} | {r['dense_opt_ms']:.1f}" if "sliced_opt_ms" in r else "- | -")
        lines.append(f"| {r['precision']} | {r['heads']} | {r['sliced_img_s']:.2f} | {r['dense_img_s']:.2f} | "
                     f"**{r['fwd_bwd_ratio']:.2f}** | {opt} | {s['peak_mib']:.0f} / {d['peak_mib']:.0f} | "
                     f"{r['peak_ratio']:.2f} | {s['activations_mib']:.1f} / {d['activations_mib']:.1f} | "
                     f"**{r['activation_ratio']:.2f}** | {s['held_mib']:.0f} / {d['held_mib']:.0f} |")
    load = report["load_average_1min"]
    return (f"# Training throughput: sliced HydraViT against a dense ViT of the same shape\n\n"
            f"Device: {report['device']}. Host: {report['host']}; bf16 instructions: {report['bf16_flags']}; "
            f"torch {report['torch']}" + (f", {report['threads']} thread(s)" if report["threads"] else "")
            + f"; load average {load[0]:.1f} -> {load[1]:.1f}.\n\n"
            f"Model: {report['model']}, batch {report['batch']}, fused attention on both sides"
            + (", torch.compile" if report["compile"] else "") + f". Dense reference: {report['dense_reference']}. "
            f"Mix: {len(report['mix_draws'])} draws, {', '.join(map(str, report['mix_draws']))}.\n\n"
            "Images/s: forward + loss + backward, median of interleaved steps (mix: all draws, summed); ratio: "
            "sliced over dense, the median of per-step ratios (mix: summed times). AdamW: median ms of the "
            "optimizer step (the sliced model's updates all 12 heads' weights at every k). Memory, from the "
            "allocator's reports (torch's profiler): peak = weights + AdamW moments + the step's peak "
            "allocation; activations = the forward + backward peak of what is neither held nor a gradient "
            "(the sliced model's gradients are full-size: every shared weight gets one); held = weights + "
            "AdamW moments. The mix's memory is its largest draw's.\n\n"
            "| precision | k | sliced img/s | dense img/s | sliced / dense | sliced AdamW ms | dense AdamW ms | "
            "peak MiB sliced / dense | peak ratio | activations MiB sliced / dense | activation ratio | "
            "held MiB sliced / dense |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
            + "\n".join(lines) + "\n")


def plot(report: dict[str, Any]) -> Any:
    """Images/s of both sides per head count and precision, and the throughput and memory ratios."""
    rows = report["rows"]
    labels = [f"{r['precision']}\nk={r['heads']}" for r in rows]
    at = np.arange(len(rows))
    fig, (rate, ratio) = subplots(1, 2, figsize=(12, 4.5))
    rate.bar(at - 0.2, [r["sliced_img_s"] for r in rows], 0.4, label="sliced HydraViT")
    rate.bar(at + 0.2, [r["dense_img_s"] for r in rows], 0.4, label="dense, same shape")
    rate.set(xticks=at, xticklabels=labels, ylabel="images/s (forward + backward)", yscale="log")
    rate.legend(fontsize=8)
    for offset, key, label in ((-0.27, "fwd_bwd_ratio", "images/s"), (0, "activation_ratio", "activation memory"),
                               (0.27, "peak_ratio", "peak memory")):
        ratio.bar(at + offset, [r[key] for r in rows], 0.27, label=label)
    ratio.axhline(0.9, color="k", lw=0.8, ls="--")
    ratio.axhline(1.15, color="r", lw=0.8, ls=":")
    ratio.set(xticks=at, xticklabels=labels, ylabel="sliced / dense",
              title="goal: images/s >= 0.9 (dashed), memory <= 1.15 (dotted)")
    ratio.legend(fontsize=8)
    for ax in (rate, ratio):
        ax.grid(alpha=0.3, axis="y")
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(f"{report['model']}, batch {report['batch']}; {report['device']}; {report['host']}; "
                 f"bf16: {report['bf16_flags']}", fontsize=8)
    return fig


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="auto: CUDA when present")
    p.add_argument("--preset", default="b16", help="b16 (the paper's model) or digits (seconds)")
    p.add_argument("--batch", type=int, default=None, help="images per step (default: 128 on CUDA, 8 on the CPU)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per side and head count")
    p.add_argument("--mix-steps", type=int, default=20, help="draws of the mix (each timed once per side)")
    p.add_argument("--precision", default="fp32,bf16", help="comma-separated: fp32, bf16 (autocast)")
    p.add_argument("--heads", default="3,6,12,mix", help="head counts to time, and 'mix'")
    p.add_argument("--threads", type=int, default=cores(), help="CPU threads (pinned for the whole run)")
    p.add_argument("--seed", type=int, default=0, help="the mix's draws")
    p.add_argument("--compile", action="store_true", help="torch.compile both sides (slow to start)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for train_throughput.*")
    args = p.parse_args(argv)
    if args.batch is None:
        args.batch = 128 if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else 8
    if min(args.batch, args.steps, args.mix_steps, args.threads) < 1:
        p.error("--batch, --steps, --mix-steps and --threads must be >= 1")
    if unknown := set(args.precision.split(",")) - set(PRECISIONS):
        p.error(f"--precision: unknown {', '.join(sorted(unknown))}; choose from {', '.join(PRECISIONS)}")
    served = preset(args.preset).heads
    if bad := [c for c in args.heads.split(",") if c.strip() != "mix" and not (c.strip().isdigit() and int(c) in served)]:
        p.error(f"--heads: {', '.join(bad)} neither a head count the {args.preset} preset serves "
                f"({served[0]}..{served[-1]}) nor 'mix'")
    save_report(Path(args.out), "train_throughput", bench(args), markdown, plot)


if __name__ == "__main__":
    main()
