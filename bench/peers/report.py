#!/usr/bin/env python3
"""results.json of bench/run-peers -> a markdown table of ratios (kvattn / best peer) and PNG
plots. Needs only the standard library and matplotlib, so it also runs on a machine without a GPU:

  python3 bench/peers/report.py RESULTS.json --out DIR   # writes DIR/table.md and DIR/*.png
"""
import argparse
import json
import os
import re
import sys

DECODE_PEERS = ["flashinfer-cuda-core", "flashinfer-tensor-core", "torch-sdpa-fa2", "cudnn", "flex"]
PREFILL_PEERS = ["flashinfer-fa2-ragged", "flashinfer-fa3-ragged", "flashinfer-fa2-paged", "flashinfer-fa3-paged",
                 "torch-sdpa-fa2", "cudnn", "flex"]
LABELS = {"kvattn": "kvattn", "flashinfer-cuda-core": "FI CUDA-core", "flashinfer-tensor-core": "FI tensor-core",
          "torch-sdpa-fa2": "SDPA FA2", "cudnn": "cuDNN", "flex": "Flex",
          "flashinfer-fa2-ragged": "FI fa2 ragged", "flashinfer-fa3-ragged": "FI fa3 ragged",
          "flashinfer-fa2-paged": "FI fa2 paged", "flashinfer-fa3-paged": "FI fa3 paged",
          "kvattn-flat": "kvattn flat", "flashinfer-cascade": "FI cascade",
          "flashinfer-flat-cuda-core": "FI flat CUDA-core", "flashinfer-flat-tensor-core": "FI flat tensor-core"}
CASCADE_PEERS = ["flashinfer-cascade", "flashinfer-flat-cuda-core", "flashinfer-flat-tensor-core"]
FLAT_PATH = {"flashinfer-flat-cuda-core": "CUDA-core", "flashinfer-flat-tensor-core": "tensor-core"}
REL_ERR_OK = 2e-2  # bf16 output: a few units of 2^-8 relative to the largest |out|


def by_case(rows, op):
    """{case id: {impl: row}} in first-seen order."""
    cases = {}
    for r in rows:
        if r.get("op") == op:
            cases.setdefault(r["id"], {})[r["impl"]] = r
    return cases


def metric(r, key):
    if r is None or r.get("error") or r.get(key) is None:
        return None
    return r[key]


def best_peer(impls, peers, key):
    best = None
    for p in peers:
        v = metric(impls.get(p), key)
        if v is not None and (best is None or v > best[1]):
            best = (p, v)
    return best


def fmt(v, digits=0):
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def err_cell(r):
    if r is None:
        return "-"
    if r.get("error"):
        return "failed"
    e = r.get("rel_err")
    if e is None:
        return "-"
    bad = e > REL_ERR_OK or r.get("nonfinite")
    return f"{'**' if bad else ''}{e:.1e}{'**' if bad else ''}"


def table(rows, op, key, unit, peers):
    cases = by_case(rows, op)
    if not cases:
        return [], []
    present = [p for p in peers if any(p in c for c in cases.values())]
    head = ["case", "heads", f"kvattn {unit}"] + [f"{LABELS[p]}" for p in present] + \
           ["best peer", "kvattn / best", "kvattn err", "peers' worst err"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|"]
    behind = []
    digits = 0 if key == "GBps" else 1
    for cid, impls in cases.items():
        k = impls.get("kvattn")
        any_row = next(iter(impls.values()))
        name = any_row["case"]
        if op == "prefill":  # the case names repeat across head dims
            name += (f", hd {any_row['head_dim']}" if any_row.get("head_dim") else "") + \
                    (f", {k['kv']}" if k and k.get("kv") else "")
        kv = metric(k, key)
        best = best_peer(impls, present, key)
        ratio = kv / best[1] if kv is not None and best else None
        errs = [impls[p] for p in present if p in impls and impls[p].get("rel_err") is not None]
        worst = max(errs, key=lambda r: r["rel_err"]) if errs else None
        cells = [name, any_row["heads"], fmt(kv, digits)] + [fmt(metric(impls.get(p), key), digits) for p in present] + \
                [LABELS[best[0]] if best else "-", f"**{ratio:.2f}**" if ratio is not None and ratio < 1 else
                 (f"{ratio:.2f}" if ratio is not None else "-"), err_cell(k),
                 f"{err_cell(worst)} ({LABELS[worst['impl']]})" if worst else "-"]
        lines.append("| " + " | ".join(cells) + " |")
        if ratio is not None and ratio < 1:
            behind.append(f"- {name} ({any_row['heads']}): kvattn {fmt(kv, digits)} {unit} = {ratio:.2f}x "
                          f"{LABELS[best[0]]} ({fmt(best[1], digits)} {unit})")
    return lines, behind


SKEW_PAIRS = [("zipf64_h32-8", "b64_l4096_h32-8", "64 Zipf (mean 4k) vs 64 x 4096"),
              ("long32k_63x512_h32-8", None, "1 x 32k + 63 x 512 vs the uniform batch of the same total"),
              ("b64_l4096_p1_h32-8", "b64_l4096_h32-8", "page 1 vs page 16 (64 x 4096)")]


def skew_pairs(cases):
    out = []
    for skewed, uniform, title in SKEW_PAIRS:
        if uniform is None:  # the "(same total)" twin
            uniform = next((cid for cid, im in cases.items()
                            if "same total" in next(iter(im.values()))["case"]), None)
        if skewed in cases and uniform in cases:
            out.append((skewed, uniform, title))
    return out


def skew_table(rows):
    cases = by_case(rows, "decode")
    pairs = skew_pairs(cases)
    if not pairs:
        return []
    impls = ["kvattn"] + DECODE_PEERS
    lines = ["| pair | " + " | ".join(LABELS[i] for i in impls) + " |", "|---|" + "---:|" * len(impls)]
    for skewed, uniform, title in pairs:
        cells = []
        for i in impls:
            a, b = metric(cases[skewed].get(i), "GBps"), metric(cases[uniform].get(i), "GBps")
            cells.append(f"{a / b:.2f} ({a:,.0f} / {b:,.0f})" if a and b else "-")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return lines


def us(r):
    v = metric(r, "ms")
    return None if v is None else v * 1e3


def cascade_table(rows):
    """Shared-prefix decode: times (us) of kvattn's cascade and flat decode, FlashInfer's cascade and
    its best flat decode (CUDA-core or tensor-core), and kvattn's cascade against the fastest peer."""
    cases = by_case(rows, "cascade")
    if not cases:
        return [], []
    head = ["case", "heads", "kvattn cascade us", "kvattn flat us", "kvattn flat / cascade", "FI cascade us",
            "FI flat decode us", "best peer", "best / kvattn cascade (time)", "kvattn err", "others' worst err"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|"]
    behind = []
    for impls in cases.values():
        k, any_row = impls.get("kvattn"), next(iter(impls.values()))
        kc, kf = us(k), us(impls.get("kvattn-flat"))
        flat = [(p, us(impls.get(p))) for p in CASCADE_PEERS[1:] if us(impls.get(p)) is not None]
        fi_flat = min(flat, key=lambda x: x[1]) if flat else None
        peers = [(p, us(impls.get(p))) for p in CASCADE_PEERS if us(impls.get(p)) is not None]
        best = min(peers, key=lambda x: x[1]) if peers else None
        ratio = best[1] / kc if kc and best else None  # above 1: kvattn's cascade is faster
        errs = [impls[p] for p in ["kvattn-flat"] + CASCADE_PEERS if p in impls and impls[p].get("rel_err") is not None]
        worst = max(errs, key=lambda r: r["rel_err"]) if errs else None
        cells = [any_row["case"], any_row["heads"], fmt(kc, 1), fmt(kf, 1),
                 f"{kf / kc:.2f}" if kc and kf else "-", fmt(us(impls.get("flashinfer-cascade")), 1),
                 f"{fmt(fi_flat[1], 1)} ({FLAT_PATH[fi_flat[0]]})" if fi_flat else "-",
                 LABELS[best[0]] if best else "-",
                 (f"**{ratio:.2f}**" if ratio < 1 else f"{ratio:.2f}") if ratio is not None else "-",
                 err_cell(k), f"{err_cell(worst)} ({LABELS[worst['impl']]})" if worst else "-"]
        lines.append("| " + " | ".join(cells) + " |")
        if ratio is not None and ratio < 1:
            behind.append(f"- cascade {any_row['case']} ({any_row['heads']}): kvattn's cascade {kc:,.1f} us = "
                          f"{ratio:.2f}x {LABELS[best[0]]} ({best[1]:,.1f} us)")
    return lines, behind


def write_table(res, path):
    rows, meta = res["rows"], res.get("meta", {})
    out = ["# kvattn side by side with its peers", ""]
    out.append(", ".join(f"{k}: {v}" for k, v in meta.items() if isinstance(v, (str, int, float))))
    out.append("")
    out.append("Ratios are kvattn's figure over the best peer's on the same shape, inputs and page table "
               "(above 1: kvattn ahead; bold: behind). err = max |out - float64 reference| / max |reference|; "
               f"bold above {REL_ERR_OK:g}.")
    d, behind_d = table(rows, "decode", "GBps", "GB/s", DECODE_PEERS)
    if d:
        out += ["", "## Decode (GB/s: K + V read + q + out, over the median time)", ""] + d
    s = skew_table(rows)
    if s:
        out += ["", "## Skewed vs uniform (GB/s ratio, skewed / uniform)", ""] + s
    p, behind_p = table(rows, "prefill", "TFLOPs", "TFLOP/s", PREFILL_PEERS)
    if p:
        out += ["", "## Prefill (TFLOP/s: 4 x visible pairs x Hq x D over the median time)", ""] + p
    c, behind_c = cascade_table(rows)
    if c:
        out += ["", "## Shared-prefix decode, 2-level cascade (median us; ratios of times, above 1: kvattn's "
                "cascade faster)", ""] + c
    behind = behind_d + behind_p + behind_c
    out += ["", "## Where kvattn is behind", ""] + (behind or ["- nowhere in this run"])
    failed = [r for r in rows if r.get("error")]
    if failed:
        out += ["", "## Failed runs", ""] + [f"- {r['op']} {r['case']} {r['heads']} {r['impl']}: {r['error'][:200]}"
                                            for r in failed]
    notes = res.get("notes") or []
    if notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


# ---- plots --------------------------------------------------------------------------------------
UNIFORM = re.compile(r"^b(\d+)_l(\d+)_h(\d+)-(\d+)$")
STYLE = {"kvattn": dict(color="black", lw=2.5, marker="o")}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _uniform_grid(rows):
    """{(heads, batch, kv_len): {impl: GBps}} for the uniform page-16 decode cases."""
    grid = {}
    for r in rows:
        m = UNIFORM.match(r.get("id", ""))
        if r.get("op") == "decode" and m and metric(r, "GBps") is not None:
            grid.setdefault((r["heads"], int(m.group(1)), int(m.group(2))), {})[r["impl"]] = r["GBps"]
    return grid


def _lines(ax, xs_by_impl, xlabel):
    for impl in ["kvattn"] + DECODE_PEERS:
        pts = sorted(xs_by_impl.get(impl, []))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=LABELS[impl],
                    **STYLE.get(impl, dict(marker=".", lw=1.2)))
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.axhline(4800, color="grey", ls=":", lw=0.8)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def plot_decode(rows, out_dir, title):
    grid = _uniform_grid(rows)
    if not grid:
        return []
    plt = _plt()
    files = []
    heads = sorted({k[0] for k in grid}, key=lambda h: [int(x) for x in h.split("/")])
    for along, other, name in (("batch", "kv_len", "decode_batch.png"), ("kv_len", "batch", "decode_kvlen.png")):
        idx_along, idx_other = (1, 2) if along == "batch" else (2, 1)
        # Only panels with at least two points along the x axis, and only columns holding one.
        panels = [(h, o) for h in heads for o in sorted({k[idx_other] for k in grid})
                  if len({k[idx_along] for k in grid if k[0] == h and k[idx_other] == o}) >= 2]
        if not panels:
            continue
        others = sorted({o for _, o in panels})
        cols = len(others)
        fig, axes = plt.subplots(len(heads), cols, figsize=(4.2 * cols, 3.4 * len(heads)), squeeze=False)
        for hi, h in enumerate(heads):
            for oi, o in enumerate(others):
                ax = axes[hi][oi]
                if (h, o) not in panels:
                    ax.set_visible(False)
                    continue
                pts = {}
                for k, impls in grid.items():
                    if k[0] == h and k[idx_other] == o:
                        for impl, v in impls.items():
                            pts.setdefault(impl, []).append((k[idx_along], v))
                _lines(ax, pts, along)
                ax.set_title(f"heads {h}, {other} {o}", fontsize=10)
                if oi == 0:
                    ax.set_ylabel("GB/s")
        handles, labels = next(a for row in axes for a in row if a.get_visible()).get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9)
        fig.suptitle(f"Paged decode, bf16, head dim 128, page 16: GB/s vs {along} (dotted: 4.8 TB/s) {title}",
                     fontsize=11)
        fig.tight_layout(rect=(0, 0.06, 1, 0.95))
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    return files


def plot_skew(rows, out_dir, title):
    cases = by_case(rows, "decode")
    pairs = skew_pairs(cases)
    if not pairs:
        return []
    plt = _plt()
    impls = [i for i in ["kvattn"] + DECODE_PEERS if any(i in cases[c] for p in pairs for c in p[:2])]
    fig, axes = plt.subplots(1, len(pairs), figsize=(5.2 * len(pairs), 3.8), squeeze=False)
    for ax, (skewed, uniform, ptitle) in zip(axes[0], pairs):
        xs = range(len(impls))
        a = [metric(cases[skewed].get(i), "GBps") or 0 for i in impls]
        b = [metric(cases[uniform].get(i), "GBps") or 0 for i in impls]
        ax.bar([x - 0.2 for x in xs], a, 0.4, label="skewed", color="tab:red")
        ax.bar([x + 0.2 for x in xs], b, 0.4, label="uniform twin", color="tab:blue")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([LABELS[i] for i in impls], rotation=30, ha="right", fontsize=8)
        ax.set_title(ptitle, fontsize=9)
        ax.set_ylabel("GB/s")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Skewed vs uniform decode batches (32/8 heads) {title}", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    path = os.path.join(out_dir, "decode_skew.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def plot_prefill(rows, out_dir, title):
    """TFLOP/s vs KV length per request, a panel per (head dim, causal); soft-capped cases left out."""
    pts = {}  # (head_dim, causal) -> label -> [(kv_len, TFLOPs)]
    for r in rows:
        if r.get("op") == "prefill" and metric(r, "TFLOPs") is not None and r.get("batch") and not r.get("soft_cap"):
            label = LABELS.get(r["impl"], r["impl"]) + (f" ({r['kv']})" if r["impl"] == "kvattn" and r.get("kv") else "")
            key = (r.get("head_dim", 128), bool(r.get("causal")))
            pts.setdefault(key, {}).setdefault(label, []).append((r["kv_tokens"] / r["batch"], r["TFLOPs"]))
    if not pts:
        return []
    plt = _plt()
    keys = sorted(pts)
    cols = min(3, len(keys))
    nrows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 3.8 * nrows), squeeze=False)
    for n, key in enumerate(keys):
        ax = axes[n // cols][n % cols]
        for label, p in sorted(pts[key].items()):
            p.sort()
            style = STYLE["kvattn"] if label.startswith("kvattn") else dict(marker=".", lw=1.2)
            ax.plot([x[0] for x in p], [x[1] for x in p], label=label, **style)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("KV length per request")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.set_title(f"head dim {key[0]}, {'causal' if key[1] else 'non-causal'}", fontsize=10)
        ax.legend(fontsize=7)
    for n in range(len(keys), nrows * cols):
        axes[n // cols][n % cols].set_visible(False)
    fig.suptitle(f"Prefill, bf16: TFLOP/s vs sequence length {title}", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path = os.path.join(out_dir, "prefill.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results")
    ap.add_argument("--out", default=None, help="output folder (default: the results' folder)")
    args = ap.parse_args()
    with open(args.results) as f:
        res = json.load(f)
    out = args.out or os.path.dirname(os.path.abspath(args.results))
    os.makedirs(out, exist_ok=True)
    write_table(res, os.path.join(out, "table.md"))
    meta = res.get("meta", {})
    title = f"({meta.get('gpu', '?')}, {meta.get('date', '')})"
    files = [os.path.join(out, "table.md")]
    try:
        for fn in (plot_decode, plot_skew, plot_prefill):
            files += fn(res["rows"], out, title)
    except ImportError as e:
        print(f"report: no plots ({e})", file=sys.stderr)
    print("report: wrote " + ", ".join(os.path.basename(p) for p in files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
