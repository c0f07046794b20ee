#!/usr/bin/env python3
"""Draws the plots of docs/benchmarks.md from the raw results in bench/results/ into docs/img/.

Run by hand after adding results (needs matplotlib; on Debian: apt-get install python3-matplotlib, then run it
with /usr/bin/python3):

    /usr/bin/python3 scripts/plot-benchmarks.py [--out docs/img]

Every plotted megactx number is read from a file in bench/results/; the file each plot uses is named in the
SOURCES table below and printed under the plot. Peer numbers (FlashMLA, torch.topk, PyTorch) come from
bench/results/peers-*.json. Nothing here is typed in except the targets, which are the issue's.
"""
import argparse
import glob
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
RESULTS = os.path.join(ROOT, "bench", "results")
COPY_TBPS = 4.23  # measured device-to-device copy rate of the H200 (peers file, "ceilings")

SOURCES = {
    "niah_16k": "cuda-h200-2026-12-04-b9e9b2b-niah-glm-demo-16k-32k-5depths.json",
    "niah_64k": "cuda-h200-2026-12-04-b9e9b2b-niah-glm-demo-64k-128k-4samples.json",
    "niah_256k": "cuda-h200-2026-12-04-b9e9b2b-niah-glm-demo-256k-512k.json",
    "niah_1m": "cuda-h200-2026-12-04-b9e9b2b-niah-glm-demo-1m.json",
    "indexer": "cuda-h200-2026-12-01-3b48524-bench_indexer-decode.json",
    "sparse_mla": "cuda-h200-2026-12-01-3b48524-bench_sparse_mla.json",
    "topk": "cuda-h200-2026-12-01-e916bd9-topk-stash-shift-ab.txt",  # runs "p 1", "p 2" = topk.cu of 02b3bca
    "layer": "cuda-h200-2026-12-01-60e065c-bench_layer.json",
    "model": "cuda-h200-2026-12-01-60e065c-bench_model.json",
    "host_tier": "cuda-h200-2026-12-03-b496a74-bench_model-host-tier.json",
    "peers": "peers-h200-2026-11-29.json",
    "peers_mla": "peers-h200-2026-12-01-8f21dff-sparse_mla.json",
}

# The targets (docs/benchmarks.md, "Targets").
TARGET_SPARSE_MLA_US = {1: 9, 16: 15, 64: 40, 128: 61}
TARGET_INDEXER_FRAC_OF_COPY = 0.80
TARGET_TOPK_64x1M_US = 100
TARGET_LAYER_1M_US = 45
TARGET_HOST_TIER_RATIO = 1.05

OURS, PEER, BOUND, TARGET = "#1f5fa8", "#c0504d", "#7f7f7f", "#2e8b57"


def load_json(key):
    with open(os.path.join(RESULTS, SOURCES[key])) as f:
        return json.load(f)


def ctx_label(n):
    return f"{round(n / 1048576)}M" if n >= 1000000 else f"{round(n / 1024)}K"


def source_note(ax, *keys):
    names = ", ".join(SOURCES[k] for k in keys)
    ax.annotate("bench/results/: " + names, xy=(0, 0), xycoords="figure fraction", xytext=(4, 3),
                textcoords="offset points", fontsize=5.5, color="#555555")


def save(fig, out_dir, name):
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {os.path.relpath(path, ROOT)} ({os.path.getsize(path) // 1024} KB)")


def plot_indexer(out_dir):
    """Batch-1 decode: indexer scores, scores + top-2048, against the copy floor, the 80% target and PyTorch."""
    d = load_json("indexer")
    rows = [r for r in d["results"] if r["kernel"] == 2 and r["batch"] == 1 and r["queries_per_seq"] == 1]
    by_kind = {}
    for r in rows:
        by_kind.setdefault(r["kind"], {})[r["context"]] = r["us"]
    ctx = sorted(by_kind["decode_graph"])
    floor = [132 * L / (COPY_TBPS * 1e6) for L in ctx]
    peers = json.load(open(os.path.join(RESULTS, SOURCES["peers"])))["pytorch_one_layer_decode_batch1_ms"]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.plot(ctx, [by_kind["decode_topk_fused_graph"][L] for L in ctx], "o-", color=OURS,
            label="megactx scores + top-2048 (fused select)")
    ax.plot(ctx, [by_kind["decode_graph"][L] for L in ctx], "s--", color=OURS, alpha=0.6,
            label="megactx scores alone")
    ax.plot(ctx, [f / TARGET_INDEXER_FRAC_OF_COPY for f in floor], ":", color=TARGET, lw=2,
            label="target: 80% of copy rate")
    ax.plot(ctx, floor, "-", color=BOUND, label="copy floor (132 B/key at 4.23 TB/s)")
    ax.plot(peers["context"], [ms * 1000 for ms in peers["indexer_bf16"]], "^-", color=PEER,
            label="PyTorch bf16 indexer + torch.topk")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ctx)
    ax.set_xticklabels([ctx_label(L) for L in ctx])
    ax.set_xlabel("context (keys)")
    ax.set_ylabel("µs per decode step (one layer)")
    ax.set_title(f"Indexer + top-2048, batch 1, CUDA graph (H200, {d['date'][:10]}, {d['commit']})", fontsize=9)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    source_note(ax, "indexer", "peers")
    save(fig, out_dir, "indexer-decode-b1.png")


def plot_sparse_mla(out_dir):
    """Sparse MLA decode µs per batch: megactx, FlashMLA (two runs), target."""
    d = load_json("sparse_mla")
    ours = {r["n"]: r["us"] for r in d["results"]
            if r["mode"] == "decode" and r["kv"] == "fp8" and r["n_head"] == 64 and r["n"] in TARGET_SPARSE_MLA_US}
    peers = json.load(open(os.path.join(RESULTS, SOURCES["peers"])))["flashmla_sparse_decode_fp8"]
    side = json.load(open(os.path.join(RESULTS, SOURCES["peers_mla"])))
    batches = sorted(TARGET_SPARSE_MLA_US)
    x = range(len(batches))
    w = 0.2
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.bar([i - 1.5 * w for i in x], [ours[b] for b in batches], w, color=OURS, label=f"megactx ({d['commit']})")
    ax.bar([i - 0.5 * w for i in x], [side["flashmla_decode_us"][side["batch"].index(b)] for b in batches], w,
           color=PEER, label=f"FlashMLA ({side['date']})")
    ax.bar([i + 0.5 * w for i in x], [peers["us"][peers["batch"].index(b)] for b in batches], w, color=PEER,
           alpha=0.55, label=f"FlashMLA ({json.load(open(os.path.join(RESULTS, SOURCES['peers'])))['date']})")
    ax.bar([i + 1.5 * w for i in x], [TARGET_SPARSE_MLA_US[b] for b in batches], w, color=TARGET, label="target")
    for i, b in zip(x, batches):
        ax.annotate(f"{ours[b]:.1f}", (i - 1.5 * w, ours[b]), ha="center", va="bottom", fontsize=6.5)
    ax.set_xticks(list(x))
    ax.set_xticklabels([f"batch {b}" for b in batches])
    ax.set_ylabel("µs per decode step")
    ax.set_title(f"Sparse MLA decode, FP8 KV, 64 heads, top-2048, CUDA graph (H200, {d['date'][:10]})",
                 fontsize=9)
    ax.grid(True, axis="y", alpha=0.25)
    ax.legend(fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    source_note(ax, "sparse_mla", "peers_mla", "peers")
    save(fig, out_dir, "sparse-mla-decode.png")


def read_bench_topk_text(path, sections):
    """Median µs per shape from bench_topk's printed tables, averaged over the named '=== name' sections."""
    cur, acc = None, {}
    line_re = re.compile(r"^(?:decode )?(\d+ x \S+(?: [a-z0-9.% ]+?)?)\s+\d+\s+\d+\s+([\d.]+)\s+[\d.]+\s+\d+ ok$")
    with open(path) as f:
        for line in f:
            if line.startswith("=== "):
                cur = line[4:].strip()
                continue
            m = line_re.match(line.rstrip())
            if m and cur in sections:
                acc.setdefault(m.group(1).strip(), []).append(float(m.group(2)))
    return {k: sum(v) / len(v) for k, v in acc.items()}


def plot_topk(out_dir):
    """Top-2048 per call: megactx against torch.topk and the read floor, on the shapes torch.topk was timed."""
    ours = read_bench_topk_text(os.path.join(RESULTS, SOURCES["topk"]), {"p 1", "p 2"})
    torch = json.load(open(os.path.join(RESULTS, SOURCES["peers"])))["torch_topk_fp32_k2048_graph_us"]
    shapes = ["1 x 128K", "1 x 1M", "64 x 128K", "64 x 1M"]
    size = {"128K": 131072, "1M": 1048576}

    def floor(shape):
        rows, n = shape.split(" x ")
        return int(rows) * size[n] * 4 / (COPY_TBPS * 1e6)

    x = range(len(shapes))
    w = 0.27
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.bar([i - w for i in x], [ours[s] for s in shapes], w, color=OURS, label="megactx (topk.cu of 02b3bca)")
    ax.bar(list(x), [torch[s] for s in shapes], w, color=PEER, label="torch.topk")
    ax.bar([i + w for i in x], [floor(s) for s in shapes], w, color=BOUND, label="one read of the scores at 4.23 TB/s")
    ax.axhline(TARGET_TOPK_64x1M_US, color=TARGET, ls=":", lw=2, label="target for 64 x 1M: 100 µs")
    for i, s in zip(x, shapes):
        ax.annotate(f"{ours[s]:.1f}", (i - w, ours[s]), ha="center", va="bottom", fontsize=6.5)
        ax.annotate(f"{torch[s]:g}", (i, torch[s]), ha="center", va="bottom", fontsize=6.5)
    ax.set_yscale("log")
    ax.set_xticks(list(x))
    ax.set_xticklabels([s.replace(" x ", " × ") + " fp32" for s in shapes])
    ax.set_ylabel("µs per call (CUDA graph)")
    ax.set_title("Exact top-2048 over score rows (H200, 2026-12-01)", fontsize=9)
    ax.grid(True, axis="y", which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    source_note(ax, "topk", "peers")
    save(fig, out_dir, "topk.png")


def plot_layer(out_dir):
    """One DSA layer's decode step at batch 1: the parts, against the floor and the 1M target."""
    d = load_json("layer")
    parts = ["  cache writes", "  indexer scores + top-2048", "  sparse MLA"]
    labels = ["cache writes", "indexer scores + top-2048", "sparse MLA"]
    colors = ["#9dc3e6", OURS, "#f4b183"]
    ctxs = sorted({r["context"] for r in d["results"]})
    get = {(r["context"], r["step"]): r for r in d["results"]}
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    names = []
    for i, L in enumerate(ctxs):
        left = 0.0
        for p, lab, c in zip(parts, labels, colors):
            v = get[(L, p)]["us_median"]
            ax.barh(i, v, left=left, color=c, label=lab if i == 0 else None)
            left += v
        whole = get[(L, "full layer (writes+indexer+mla)")]
        ax.plot([whole["us_median"]], [i], "k|", ms=18)
        ax.annotate(f"{whole['us_median']:.1f} µs as one graph", (whole["us_median"], i), xytext=(6, -3),
                    textcoords="offset points", fontsize=7)
        ax.plot([whole["floor_us"]], [i], marker="v", color=BOUND, ms=8, ls="none",
                label="floor (bytes at 4.23 TB/s)" if i == 0 else None)
        names.append(f"full layer, {ctx_label(L)}")
    ax.axvline(TARGET_LAYER_1M_US, color=TARGET, ls=":", lw=2, label="target at 1M: 45 µs")
    ax.set_yticks(range(len(ctxs)))
    ax.set_yticklabels(names)
    ax.set_xlabel("µs (the parts each timed alone; the tick is the whole step as one graph)")
    ax.set_xlim(0, 125)
    ax.set_title(f"One DSA layer, decode, batch 1, cold L2 (H200, {d['date'][:10]}, {d['commit']})", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, axis="x", alpha=0.25)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    source_note(ax, "layer")
    save(fig, out_dir, "dsa-layer-decode.png")


def plot_model(out_dir):
    """glm52-shape model: decode step and prefill rate against context, IndexShare against every layer full."""
    d = load_json("model")
    series = {}
    for r in d["results"]:
        if r.get("decode_batch", 1) != 1:
            continue
        name = "IndexShare (1 full + 3 shared layers)" if r["n_full"] < r["n_layers"] else "every layer full"
        series.setdefault(name, []).append(r)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(7.2, 3.6))
    for name, rs in series.items():
        rs.sort(key=lambda r: r["context"])
        c = OURS if name.startswith("IndexShare") else PEER
        x = [r["context"] for r in rs]
        a1.plot(x, [r["decode_graph_ms_median"] for r in rs], "o-", color=c, label=name)
        a2.plot(x, [r["prefill_tok_s"] / 1000 for r in rs], "o-", color=c, label=name)
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        xs = sorted({r["context"] for r in d["results"]})
        a.set_xticks(xs)
        a.set_xticklabels([ctx_label(L) for L in xs])
        a.set_xlabel("context")
        a.grid(True, alpha=0.25)
    a1.set_ylim(0, None)
    a2.set_ylim(0, None)
    a1.set_ylabel("ms per decode step (CUDA graph)")
    a2.set_ylabel("prefill, 1000 tokens/s")
    a1.legend(fontsize=7)
    a1.set_title("decode, batch 1", fontsize=8)
    a2.set_title("prefill, a 4096-token chunk ending at the context", fontsize=8)
    fig.suptitle(f"glm52-shape (4 layers, FP8 weights and KV) (H200, {d['date'][:10]}, {d['commit']})", fontsize=9)
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    source_note(a1, "model")
    save(fig, out_dir, "model-glm52-shape.png")


def plot_host_tier(out_dir):
    """Decode step with the latent cache mostly in the host tier against all resident, per context and batch."""
    d = load_json("host_tier")
    runs = d["runs"]  # name -> bench_model rows of one process: resident rows (kv_host_blocks 0), then tiered
    colors = [OURS, "#6a9fd4", PEER]
    fig, axes = plt.subplots(1, 2, figsize=(7.6, 3.9))
    for ax, batch in zip(axes, (1, 8)):
        cases = sorted({r["context"] for rs in runs.values() for r in rs if r["decode_batch"] == batch})
        width = 0.8 / (len(runs) + 1)
        for i, case in enumerate(cases):
            resident = [r["decode_graph_ms_median"] for rs in runs.values() for r in rs
                        if r["kv_host_blocks"] == 0 and r["context"] == case and r["decode_batch"] == batch]
            ax.bar(i, resident[0], width, color=BOUND, label="all resident")
            ax.plot([i - 0.4, i + 0.4 + width * len(runs)], [resident[0] * TARGET_HOST_TIER_RATIO] * 2, "--",
                    color=TARGET, lw=1, label=f"target {TARGET_HOST_TIER_RATIO}× resident")
            for j, (name, rs) in enumerate(runs.items()):
                own = {r["kv_host_blocks"] > 0: r["decode_graph_ms_median"] for r in rs
                       if r["context"] == case and r["decode_batch"] == batch}
                if True not in own:
                    continue
                x = i + (j + 1) * width
                ax.bar(x, own[True], width, color=colors[j % len(colors)], label=name.split(":")[0])
                ax.annotate(f"{own[True] / own[False]:.2f}×", (x, own[True]), ha="center", va="bottom", fontsize=6)
        ax.set_xticks([i + width * len(runs) / 2 for i in range(len(cases))])
        ax.set_xticklabels([ctx_label(c) for c in cases])
        ax.set_xlabel("context")
        ax.set_ylabel("ms per decode step (CUDA graph)")
        ax.set_title(f"batch {batch}", fontsize=8)
        ax.grid(True, axis="y", alpha=0.25)
    handles, labels = [], []
    for ax in axes:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    fig.legend(handles, labels, fontsize=6.5, loc="lower center", ncol=3, frameon=False, bbox_to_anchor=(0.5, 0.03))
    fig.suptitle(f"host KV tier, glm52-shape (4 layers, FP8), decode; ratio to the same run's resident step "
                 f"(H200, {d['date'][:10]}, {d['commit']})", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.12, 1, 0.96))
    source_note(axes[0], "host_tier")
    save(fig, out_dir, "host-tier-decode.png")


def plot_model_history(out_dir):
    """Decode step at 1M over every bench_model result with batch-1 rows at 1M, in run order."""
    pts = []
    for path in glob.glob(os.path.join(RESULTS, "cuda-h200-*bench_model*.json")):
        m = re.search(r"cuda-h200-\d{4}-\d\d-\d\d-([0-9a-f]{7})-", os.path.basename(path))
        if not m:
            continue
        d = json.load(open(path))
        for r in d.get("results", []):
            if r.get("context") == 1048575 and r.get("decode_batch", 1) == 1 and r.get("n_experts") == 4:
                full = r["n_full"] == r["n_layers"]
                ms = r.get("decode_graph_ms_median") or r.get("decode_ms_median")
                pts.append((d["date"], m.group(1), full, ms, r.get("decode_graph_ms_median") is not None))
    pts.sort()
    fig, ax = plt.subplots(figsize=(7.2, 3.6))
    for full, c, name in ((False, OURS, "IndexShare"), (True, PEER, "every layer full")):
        p = [q for q in pts if q[2] == full]
        ax.plot(range(len(p)), [q[3] for q in p], "o-", color=c, ms=3.5, label=name)
        if not full:
            ticks = p
    ax.set_xticks(range(len(ticks)))
    ax.set_xticklabels([q[1] + ("" if q[4] else "*") for q in ticks], rotation=70, fontsize=6)
    ax.set_ylim(0, None)
    ax.set_ylabel("ms per decode step at 1M")
    ax.set_title("glm52-shape decode at 1M, batch 1, by results file in run order (H200; * = no CUDA graph)",
                 fontsize=9)
    ax.grid(True, alpha=0.25)
    ax.legend(fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    ax.annotate("bench/results/cuda-h200-*-bench_model*.json (commit from the file name)", xy=(0, 0),
                xycoords="figure fraction", xytext=(4, 3), textcoords="offset points", fontsize=5.5, color="#555555")
    save(fig, out_dir, "model-decode-history.png")


def plot_niah(out_dir):
    """The demo model's passkey retrieval on the H200 against the context length, with the issue's targets."""
    keys = ("niah_16k", "niah_64k", "niah_256k", "niah_1m")
    rows = sorted((r["length"], r["accuracy"], r["total"]) for k in keys for r in load_json(k)["per_length"])
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    xs = range(len(rows))
    ax.plot(xs, [100 * r[1] for r in rows], "o-", color=OURS, label="glm-demo, megactx eval niah (bf16 KV)")
    for x, r in zip(xs, rows):
        ax.annotate(f"{100 * r[1]:.0f}% of {r[2]}", (x, 100 * r[1]), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=7)
    target = [99 if r[0] <= 32768 else 95 if r[0] == 131072 else 90 if r[0] >= 1048000 else None for r in rows]
    ax.plot([x for x, t in zip(xs, target) if t], [t for t in target if t], "_", color=TARGET, ms=18, mew=2,
            label="target (≥ 99% to 32K, ≥ 95% at 128K, ≥ 90% at 1M)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([ctx_label(r[0]) for r in rows])
    ax.set_ylim(0, 110)
    ax.set_ylabel("passkeys retrieved, %")
    ax.set_xlabel("context length (tokens)")
    ax.set_title("Needle in a haystack, demo model, H200", fontsize=9)
    ax.grid(True, alpha=0.25)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    source_note(ax, *keys)
    save(fig, out_dir, "niah-glm-demo-h200.png")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "img"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for f in SOURCES.values():
        if not os.path.exists(os.path.join(RESULTS, f)):
            sys.exit(f"plot-benchmarks: missing bench/results/{f}")
    plot_indexer(args.out)
    plot_sparse_mla(args.out)
    plot_topk(args.out)
    plot_layer(args.out)
    plot_model(args.out)
    plot_host_tier(args.out)
    plot_model_history(args.out)
    plot_niah(args.out)


if __name__ == "__main__":
    main()
