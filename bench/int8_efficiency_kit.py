""".tflite int8 efficiency measured on a host that cannot convert: artefacts packed here, timed there.

Whether small head counts run at the speed of their size is decided on a CPU with int8 dot products
(x86 VNNI or AMX, Arm dotprod), and such a host often has no converter, no package registry and
room for little luggage (a 12-head b16 artefact is 84 MiB). ``pack`` (this checkout, torch) writes a
kit folder: the FC layer that sets LiteRT's int8 rate, exported with the artefacts' recipe, and each
artefact "hollow": its large int8 weight buffers zeroed and compressed away, with the standard
deviation and seed that refill them. XNNPACK's int8 kernels take the same time whatever the weight
values, so a refilled artefact times as its original; to show it, a series given with ``--whole``
travels byte for byte (the same 3-head file as a whole and a refilled series, timed side by side).
``index.json`` holds each file's MACs and the sha256 of the bytes that will be timed.

``time`` (numpy, ai-edge-litert and msgspec only; no torch) rebuilds and checks every file, times all
of them interleaved (medians, each inference started once the previous one's threads are idle) at
each thread count, profiles the chosen ones with LiteRT's own profiler, and writes
``int8_efficiency_kit.{json,md,png}``: efficiency = MACs / latency / the FC layer's MAC rate, and
each series' latency over its largest head count's. Pin the process to cores (``taskset``) for
steady figures.

    .venv/bin/python bench/int8_efficiency_kit.py pack --out kit --whole control \\
        after:3=full/vit_h3_tflite_int8-dynamic.tflite after:12=full/vit_h12_tflite_int8-dynamic.tflite \\
        control:3=full/vit_h3_tflite_int8-dynamic.tflite
    # there, from a checkout (hydra-edge need not be installed: PYTHONPATH=. finds it)
    PYTHONPATH=. taskset -c 2 python3 bench/int8_efficiency_kit.py time kit --out results --profile "after k=3"
    .venv/bin/python bench/int8_efficiency_kit.py render results/int8_efficiency_kit.json --out bench/results/x
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import re
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from hydra_edge.convert.naming import tool_versions
from hydra_edge.errors import HydraEdgeError
from hydra_edge.profiling.arguments import FC_SHAPE, fc_shape, positive_list
from hydra_edge.profiling.report import save_report, subplots
from hydra_edge.profiling.timing import cpu_family, host_cpu, paired_ms

INDEX = "index.json"
HOLLOW_BYTES = 64 * 1024  # default: int8 buffers at least this large travel as (offset, length, std), the weight matrices
SEED = 20241126


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def refill(hollow: bytes, spans: list[list[float]]) -> bytes:
    """The hollow file with each (offset, length, std) span filled with rounded normal int8 values,
    the same bytes on every host (numpy's PCG64 seeded by the span's index)."""
    out = bytearray(hollow)
    for i, (offset, length, std) in enumerate(spans):
        values = np.random.default_rng([SEED, i]).normal(0.0, std, int(length))
        out[int(offset):int(offset) + int(length)] = np.clip(np.rint(values), -127, 127).astype(np.int8).tobytes()
    return bytes(out)


def hollowed(data: bytes, least: int = HOLLOW_BYTES) -> tuple[bytes, list[list[float]]]:
    """``data`` with every int8 weight buffer of at least ``least`` bytes zeroed, and the spans that refill them."""
    from hydra_edge.convert.tflite import tensor_map

    out, spans = bytearray(data), []
    for t in tensor_map(data):
        if t.dtype == np.int8 and t.rows_of is None and t.nbytes >= least:
            spans.append([t.offset, t.nbytes, round(float(t.array(data).std()), 4)])
            out[t.offset:t.offset + t.nbytes] = bytes(t.nbytes)
    return bytes(out), spans


def _item(text: str) -> tuple[str, int, Path]:
    """``SERIES:HEADS=PATH``."""
    try:
        name, path = text.split("=", 1)
        series, heads = name.rsplit(":", 1)
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 _.-]*", series):  # it names the kit's files
            raise ValueError(series)
        return series, int(heads), Path(path)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not SERIES:HEADS=PATH (SERIES: letters, digits, ' ', '_', '.', "
                                         "'-'), e.g. after:3=full/vit_h3.tflite") from None


def pack(args: argparse.Namespace) -> None:
    from int8_efficiency import fc_artefacts

    from hydra_edge.model.config import preset
    from hydra_edge.model.sizes import subnet_size

    labels = [(series, heads) for series, heads, _ in args.items]
    if len(set(labels)) != len(labels) or "fc" in {series for series, _ in labels}:
        raise HydraEdgeError("each SERIES:HEADS once, and no series named fc (the FC layer's own name)")
    missing = set(args.whole) - {series for series, _ in labels}
    if missing:
        raise HydraEdgeError(f"--whole {sorted(missing)}: no such series among the artefacts given")
    for _, _, path in args.items:
        if not path.is_file():
            raise HydraEdgeError(f"{path}: no such file")
        with path.open("rb") as f:
            if f.read(8)[4:8] != b"TFL3":
                raise HydraEdgeError(f"{path}: not a .tflite flatbuffer (no TFL3 identifier); give .tflite artefacts")
    tokens, width_in, width_out = (int(n) for n in args.fc.split("x"))
    try:
        cfg = preset(args.preset, **dict(args.set))
    except TypeError as e:  # a --set key the config does not have
        raise HydraEdgeError(f"--set: {e}") from None
    for _, heads, _ in args.items:
        cfg.check_heads(heads)
    out = Path(args.out)
    if out.exists():
        raise HydraEdgeError(f"{out}: exists; give a new folder for the kit")
    partial = out.with_name(f".{out.name}.partial")  # renamed into place once whole: no half-written kit
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="hydra-kit-") as tmp:
        fc_paths, _, _ = fc_artefacts(tokens, width_in, width_out, Path(tmp), {("tflite", "int8-dynamic")})
        entries = [("fc", 0, fc_paths["tflite int8-dynamic"], 0.0, 0.0)]  # its source is named by its shape below
        for series, heads, path in args.items:
            size = subnet_size(cfg, heads)
            entries.append((series, heads, path, size.gmacs, size.exported_macs / 1e9))
        index: dict[str, Any] = {"preset": args.preset, "fc": {"shape": args.fc, "macs": tokens * width_in * width_out},
                                 "items": []}
        for series, heads, path, gmacs, gmacs_run in entries:
            data = path.read_bytes()
            whole = series in args.whole
            body, spans = (data, []) if whole else hollowed(data, args.hollow_bytes)
            timed = data if whole else refill(body, spans)
            name = f"{series}_h{heads}.tflite.xz".replace(" ", "_")
            (partial / name).write_bytes(lzma.compress(body, preset=1))
            index["items"].append({"series": series, "heads": heads, "gmacs": gmacs, "gmacs_run": gmacs_run,
                                   "file": name, "source": f"FC layer {args.fc}" if series == "fc" else str(path),
                                   "source_sha256": _sha256(data),
                                   "sha256": _sha256(timed), "spans": spans})
            print(f"{name}: {len(data) / 2**20:.1f} MiB, {len(spans)} buffers refilled there, "
                  f"{(partial / name).stat().st_size / 2**20:.2f} MiB packed", flush=True)
    (partial / INDEX).write_text(json.dumps(index, indent=1))
    partial.rename(out)


def _label(item: dict[str, Any]) -> str:
    return "fc" if item["series"] == "fc" else f"{item['series']} k={item['heads']}"


def unpack(kit: Path, work: Path) -> dict[str, Any]:
    """The kit's index, every file rebuilt under ``work`` and checked against its sha256 (item["path"])."""
    try:
        index = json.loads((kit / INDEX).read_text())
        items = index["items"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HydraEdgeError(f"{kit / INDEX}: not a kit's index ({e}); write the kit with this script's pack") from None
    for item in items:
        name = str(item["file"])
        if Path(name).name != name or name.startswith("."):  # a name from the index never leaves the kit folder
            raise HydraEdgeError(f"{kit / INDEX}: file {name!r} is not a name in the kit folder; pack the kit again")
        try:
            data = refill(lzma.decompress((kit / name).read_bytes()), item["spans"])
        except (OSError, lzma.LZMAError, ValueError, TypeError) as e:
            raise HydraEdgeError(f"{kit / name}: cannot be rebuilt ({e}); pack the kit again") from None
        if _sha256(data) != item["sha256"]:
            raise HydraEdgeError(f"{kit / name}: rebuilt bytes do not match the index's sha256; pack the kit again")
        item["path"] = work / name.removesuffix(".xz")
        item["path"].write_bytes(data)
    return index


def time_kit(args: argparse.Namespace) -> dict[str, Any]:
    from op_profile_litert import input_shape

    from hydra_edge.profiling.litert import op_table
    from hydra_edge.runtime.engines import load

    with tempfile.TemporaryDirectory(prefix="hydra-kit-") as tmp:
        index = unpack(Path(args.kit), Path(tmp))
        items = index["items"]
        chosen = {name: next((i for i in items if _label(i) == name), None) for name in args.profile}
        for name, item in chosen.items():
            if item is None:
                raise HydraEdgeError(f"--profile {name!r}: no such artefact in the kit; "
                                     f"choose from {[_label(i) for i in items]}")
        fc = next(i for i in items if i["series"] == "fc")
        inputs = {_label(i): np.random.default_rng(1).standard_normal(input_shape(i["path"]), dtype=np.float32)
                  for i in items}
        rows = []
        for threads in args.threads:
            for rep in range(args.repeats):
                engines = {_label(i): load(i["path"], threads=threads) for i in items}
                fns = {name: (lambda e, x: lambda: e.run(x))(e, inputs[name]) for name, e in engines.items()}
                print(f"{threads} thread(s), repeat {rep + 1}/{args.repeats}: {len(fns)} programs, "
                      f"{args.runs} interleaved runs", flush=True)
                ms = paired_ms(fns, args.runs)
                rate = index["fc"]["macs"] / (ms["fc"] / 1e3) / 1e9
                for i in items:
                    if i is fc:
                        continue
                    largest = max((o for o in items if o["series"] == i["series"]), key=lambda o: o["heads"])
                    latency = ms[_label(i)]
                    rows.append({"series": i["series"], "heads": i["heads"], "threads": threads, "repeat": rep,
                                 "ms": round(latency, 4), "fc_ms": round(ms["fc"], 4), "fc_gmac_per_s": round(rate, 2),
                                 "efficiency": round(i["gmacs"] / (latency / 1e3) / rate, 3),
                                 "efficiency_on_macs_run": round(i["gmacs_run"] / (latency / 1e3) / rate, 3),
                                 "over_largest_latency": round(latency / ms[_label(largest)], 3),
                                 "over_largest_macs": round(i["gmacs"] / largest["gmacs"], 3),
                                 "largest_heads": largest["heads"]})
                del engines, fns
        tables: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in chosen}
        for rep in range(args.repeats):  # interleaved, so that every artefact's profiles see the same host
            for name, item in chosen.items():
                print(f"profiling {name}, repeat {rep + 1}/{args.repeats}", flush=True)
                tables[name].append(op_table(item["path"], inputs[name], 1, args.runs))
        profiles = {name: _profile(runs) for name, runs in tables.items()}
    for i in items:
        i.pop("path", None)
    return {"host": host_cpu(), "cpu_family": cpu_family(), "fc": index["fc"], "runs": args.runs,
            "repeats": args.repeats, "threads": args.threads, "items": items, "rows": rows, "profiles": profiles,
            "tools": tool_versions(("ai-edge-litert", "numpy"))}


def _profile(repeats: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Op tables of one artefact profiled several times: per op type the median ms over the repeats and
    their range, and each repeat's total (how much one profile can be trusted on this host)."""
    totals = [sum(r["ms"] for r in table) for table in repeats]
    per_op: dict[str, list[float]] = {}
    operators = {}
    for table in repeats:
        for r in table:
            per_op.setdefault(r["op"], []).append(r["ms"])
            operators[r["op"]] = r["operators"]
    total = float(sum(np.median(v) for v in per_op.values()))
    ops = [{"op": op, "ms": round(float(np.median(v)), 4), "range": [round(min(v), 4), round(max(v), 4)],
            "share": round(float(np.median(v)) / total, 4), "operators": operators[op]} for op, v in per_op.items()]
    return {"total_ms": round(total, 4), "repeat_totals_ms": [round(t, 4) for t in totals],
            "ops": sorted(ops, key=lambda o: -o["ms"])}


def medians(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per series, head count and thread count: the median over repeats of latency and efficiency."""
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in report["rows"]:
        groups.setdefault((r["series"], r["heads"], r["threads"]), []).append(r)
    out = []
    for (series, heads, threads), rs in groups.items():
        row = {"series": series, "heads": heads, "threads": threads}
        for key in ("ms", "fc_gmac_per_s", "efficiency", "efficiency_on_macs_run", "over_largest_latency",
                    "over_largest_macs"):
            row[key] = float(np.median([r[key] for r in rs]))
            row[f"{key}_range"] = (min(r[key] for r in rs), max(r[key] for r in rs))
        out.append(row)
    return out


def markdown(report: dict[str, Any]) -> str:
    rows = medians(report)
    heads = sorted({r["heads"] for r in rows})
    fc = report["fc"]
    lines = ["# .tflite int8 efficiency, artefacts timed from a kit\n",
             f"Host: {report['host']}; {report['cpu_family']}. Tools: "
             + ", ".join(f"{k} {v}" for k, v in report["tools"].items()) + ".\n",
             f"FC rate: one fully-connected layer {fc['shape']} exported with the .tflite artefacts' recipe. "
             f"Every program of a thread count timed interleaved, {report['runs']} runs after 3 warm-ups, median; "
             f"the whole repeated {report['repeats']} times (cells: median of the repeats, range in the per-artefact "
             f"table). Efficiency = subnetwork MACs / latency / FC rate of the same repeat. Large int8 weight buffers "
             f"were refilled with random values of their own spread (kit ``--whole`` series travelled byte for byte).\n",
             "| series | threads | FC rate GMAC/s | " + " | ".join(f"k={k}" for k in heads)
             + " | k_min / k_max latency | k_min / k_max MACs |", "|---" * (len(heads) + 5) + "|"]
    for series, threads in sorted({(r["series"], r["threads"]) for r in rows}, key=lambda s: (s[1], s[0])):
        by_k = {r["heads"]: r for r in rows if (r["series"], r["threads"]) == (series, threads)}
        low = by_k[min(by_k)]
        lines.append(f"| {series} | {threads} | {low['fc_gmac_per_s']:.1f} | "
                     + " | ".join(f"{by_k[k]['efficiency']:.2f}" if k in by_k else "" for k in heads)
                     + f" | {low['over_largest_latency']:.3f} | {low['over_largest_macs']:.3f} |")
    lines += ["", "| series | heads | threads | ms | ms range | efficiency | range | on MACs run | latency / largest |",
              "|---" * 9 + "|"]
    lines += [f"| {r['series']} | {r['heads']} | {r['threads']} | {r['ms']:.2f} | {r['ms_range'][0]:.2f}-"
              f"{r['ms_range'][1]:.2f} | {r['efficiency']:.3f} | {r['efficiency_range'][0]:.3f}-"
              f"{r['efficiency_range'][1]:.3f} | {r['efficiency_on_macs_run']:.3f} | {r['over_largest_latency']:.3f} |"
              for r in sorted(rows, key=lambda r: (r["threads"], r["series"], r["heads"]))]
    profiles = report["profiles"]
    if profiles:
        ops = list(dict.fromkeys(o["op"] for p in profiles.values() for o in p["ops"]))
        cells = {(name, o["op"]): o for name, p in profiles.items() for o in p["ops"]}
        counts = sorted({len(p["repeat_totals_ms"]) for p in profiles.values()})
        lines += ["", f"LiteRT's own op profile, 1 thread: each operator's median over the runs, summed by op type, "
                  f"the median of {'/'.join(map(str, counts))} profile(s) (ms per inference, the profiles' range, "
                  "share, operators):\n",
                  "| op | " + " | ".join(f"{n} ms | range | share | n" for n in profiles) + " |",
                  "|---" * (1 + 4 * len(profiles)) + "|"]
        for op in ops:
            lines.append(f"| {op} | " + " | ".join(
                f"{c['ms']:.3f} | {c['range'][0]:.3f}-{c['range'][1]:.3f} | {c['share']:.1%} | {c['operators']}"
                if (c := cells.get((n, op))) else "- | - | - | 0"
                for n in profiles) + " |")
        lines.append("| **total** | " + " | ".join(
            f"**{p['total_ms']:.2f}** | {min(p['repeat_totals_ms']):.2f}-{max(p['repeat_totals_ms']):.2f} | 100% | "
            f"{sum(o['operators'] for o in p['ops'])}" for p in profiles.values()) + " |")
    lines += ["", *(f"- {_label(i)}: `{i['source']}` (sha256 {i['source_sha256'][:12]}…)" for i in report["items"])]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any]) -> Any:
    rows = medians(report)
    threads = sorted({r["threads"] for r in rows})
    fig, axes = subplots(1, len(threads), figsize=(6 * len(threads), 4), squeeze=False)
    for ax, t in zip(axes[0], threads):
        for series in sorted({r["series"] for r in rows if r["threads"] == t}):
            pts = sorted((r["heads"], r["efficiency"]) for r in rows if (r["series"], r["threads"]) == (series, t))
            every = [k for k, _ in pts] == list(range(pts[0][0], pts[-1][0] + 1))  # a line only through measured counts
            ax.plot(*zip(*pts), marker="o", ls="-" if every else "none", label=series)
        ax.axhline(0.60, color="grey", lw=0.8, ls=":")
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set(title=f"{t} thread{'s' if t > 1 else ''}", xlabel="heads", ylabel="efficiency (MAC rate / FC rate)",
               ylim=(0, max([1.2, *(1.1 * r["efficiency"] for r in rows)])))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(textwrap.fill(report["host"], 100), fontsize=8)
    return fig


def _override(text: str) -> tuple[str, int]:
    """``KEY=INT``."""
    key, _, value = text.partition("=")
    if not key or not value.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=INT, e.g. depth=2")
    return key, int(value)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    k = sub.add_parser("pack", help="write a kit (this checkout, with torch)")
    k.add_argument("items", nargs="+", type=_item, help="SERIES:HEADS=PATH of a .tflite artefact")
    k.add_argument("--out", required=True)
    k.add_argument("--preset", default="b16", help="the model preset the artefacts were made from (their MACs)")
    k.add_argument("--set", action="append", default=[], type=_override, metavar="KEY=INT",
                   help="a preset field the artefacts' model overrode, e.g. depth=2 (repeatable)")
    k.add_argument("--hollow-bytes", type=int, default=HOLLOW_BYTES,
                   help="int8 weight buffers at least this large travel hollow (refilled there)")
    k.add_argument("--fc", default=FC_SHAPE, type=fc_shape, help="FC layer tokens x in x out")
    k.add_argument("--whole", action="append", default=[], help="a series that travels byte for byte (repeatable)")
    t = sub.add_parser("time", help="time a kit (numpy and ai-edge-litert only)")
    t.add_argument("kit")
    t.add_argument("--out", required=True)
    t.add_argument("--threads", default="1", type=positive_list)
    t.add_argument("--runs", type=int, default=21)
    t.add_argument("--repeats", type=int, default=3)
    t.add_argument("--profile", action="append", default=[],
                   help="a label (\"SERIES k=HEADS\") to profile by op type (repeatable)")
    r = sub.add_parser("render", help="write the .md and .png again from a results .json (e.g. one fetched from a host)")
    r.add_argument("results", type=Path)
    r.add_argument("--out", required=True)
    args = p.parse_args()
    try:
        if args.command == "pack":
            pack(args)
        elif args.command == "render":
            save_report(Path(args.out), args.results.stem, json.loads(args.results.read_text()), markdown, plot)
        else:
            save_report(Path(args.out), "int8_efficiency_kit", time_kit(args), markdown, plot)
    except HydraEdgeError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
