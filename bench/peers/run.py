#!/usr/bin/env python3
"""The Python half of bench/run-peers (read that script first): measures the peers on the cases
kvattn exported, checks every output against a float64 reference, writes OUT/results.json after
each case (so a run cut short still leaves its rows), then OUT/table.md and the plots.

  python3 bench/peers/run.py --out OUT --decode-io DIR --decode-json FILE [--prefill auto|builtin|off ...]
                             [--cascade-io DIR --cascade-json FILE]
  python3 bench/peers/run.py --build-only --decode-list FILE --prefill-list FILE --cascade-list FILE  # JIT only
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cascade  # noqa: E402
import decode  # noqa: E402
import kvio  # noqa: E402
import prefill  # noqa: E402
import report  # noqa: E402


def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:  # noqa: BLE001
        return ""


def meta_info(fi, exp):
    p = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    m = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
         "gpu": p.name if p else "no GPU (smoke test)", "sms": p.multi_processor_count if p else None,
         "driver": sh(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines()[0:1],
         "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
         "cudnn": torch.backends.cudnn.version(), "flashinfer": getattr(fi, "__version__", None) if fi else None,
         "kvattn": exp.manifest.get("kvattn_version") if exp else None,
         "commit": os.environ.get("KVATTN_COMMIT") or sh(["git", "rev-parse", "--short", "HEAD"]) or None}
    m["driver"] = m["driver"][0] if m["driver"] else None
    try:
        import triton
        m["triton"] = triton.__version__
    except ImportError:
        pass
    return m


def log_row(r):
    t = f"{r['ms'] * 1e3:9.1f} us" if r.get("ms") is not None else " " * 12
    if r.get("GBps") is not None:
        rate = f"{r['GBps']:7,.0f} GB/s"
    elif r.get("TFLOPs") is not None:
        rate = f"{r['TFLOPs']:7.1f} TF/s"
    else:
        rate = " " * 12
    e = f"err {r['rel_err']:.1e}" if r.get("rel_err") is not None else ""
    if r.get("vs_kvattn_max_abs") is not None:
        e += f" |d kvattn| {r['vs_kvattn_max_abs']:.1e}"
    if r.get("error"):
        e = "FAILED " + r["error"][:160]
    print(f"{r['op']:7} {r['case'][:30]:30} {r['heads']:>5} {r['impl']:27} {t} {rate} {e}", flush=True)


def kvattn_rows_by_key(path):
    """The kvattn --json output as {case id: row}; {} when absent or unreadable. (Names and heads
    alone collide: the prefill cases of head dims 64 and 128 share both.)"""
    if not path or not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            return {r.get("id") or (r["case"], r["heads"]): r for r in json.load(f)}
    except (ValueError, KeyError, TypeError):
        return {}


def load_json(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def flashinfer_keys(dcases, pcases, ccases=()):
    """jit_warmup module keys for decode cases (head dim 128 unless the case says), prefill cases
    and cascade cases."""
    keys = set(cascade.flashinfer_keys(ccases))
    for c in dcases:
        hd = int(c.get("head_dim_qk") or 128)
        keys |= {f"decode:{hd}", f"fa2:{hd}"}  # CUDA-core decode; the tensor-core path runs fa2 prefill
    keys |= {f"{b}:{hd}" + (":softcap" if cap else "") for b, hd, cap in prefill.flashinfer_modules(pcases)}
    return sorted(keys)


def build_only(args):
    """--build-only: compile the FlashInfer modules the listed cases need, and nothing else."""
    import importlib

    if args.no_flashinfer:
        print("# --build-only with --no-flashinfer: nothing to build", flush=True)
        return 0

    import jit_warmup

    print(f"# flashinfer {importlib.import_module('flashinfer').__version__}", flush=True)  # missing: fail here

    dcases = load_json(args.decode_list, []) if args.decode_list else []
    pcases = load_json(args.prefill_list, []) if args.prefill_list and args.prefill != "off" else []
    if args.prefill == "builtin" and not pcases:
        pcases = prefill.builtin_cases(args.quick)
    ccases = load_json(args.cascade_list, []) if args.cascade_list else []
    keys = flashinfer_keys(dcases, pcases, ccases)
    print(f"# --build-only: {len(dcases)} decode, {len(pcases)} prefill and {len(ccases)} cascade cases need "
          f"{len(keys)} modules: {' '.join(keys)}", flush=True)
    if keys:
        jit_warmup.build(keys, log=lambda m: print(m, flush=True))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="folder for results.json, table.md and the plots (needed unless --build-only)")
    ap.add_argument("--decode-io", help="the folder `kvattn bench decode --save-io` wrote")
    ap.add_argument("--decode-json", help="the --json output of the same kvattn run")
    ap.add_argument("--prefill", choices=["auto", "builtin", "off"], default="auto",
                    help="auto: kvattn's prefill export, else the shapes of its --json rows, else none; "
                         "builtin: without either, the peers alone on prefill.builtin_cases()")
    ap.add_argument("--prefill-io", help="the folder `kvattn bench prefill --save-io` wrote")
    ap.add_argument("--prefill-json", help="the --json output of `kvattn bench prefill`")
    ap.add_argument("--cascade-io", help="the folder `kvattn bench cascade --save-io` wrote")
    ap.add_argument("--cascade-json", help="the --json output of the same kvattn run")
    ap.add_argument("--iters", type=int, default=30, help="timed runs per decode and cascade shape (as kvattn bench)")
    ap.add_argument("--iters-prefill", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="fewer built-in prefill shapes")
    ap.add_argument("--skip-flex", action="store_true", help="no FlexAttention (it compiles per shape)")
    ap.add_argument("--skip-dense", action="store_true", help="no SDPA/cuDNN/Flex rows")
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--no-prefill-reference", action="store_true", help="skip the float64 prefill check")
    ap.add_argument("--ref-rows", type=int, default=256,
                    help="query rows the float64 prefill reference is computed for, spread over each case "
                         "(plus each request's first and last row; kvio.sample_rows)")
    ap.add_argument("--build-only", action="store_true",
                    help="only compile the FlashInfer modules that the cases of --decode-list/--prefill-list need")
    ap.add_argument("--decode-list", help="with --build-only: `kvattn bench decode --list --json` output")
    ap.add_argument("--prefill-list", help="with --build-only: `kvattn bench prefill --list --json` output")
    ap.add_argument("--cascade-list", help="with --build-only: `kvattn bench cascade --list --json` output")
    ap.add_argument("--note", action="append", default=[], help="a line for the table's notes")
    ap.add_argument("--deadline", type=float, default=None,
                    help="a Unix time after which no new case starts (the rest are listed as not run)")
    args = ap.parse_args()
    if args.build_only:
        return build_only(args)
    if not args.out:
        ap.error("--out is required")
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    notes = list(args.note)

    fi = None
    if not args.no_flashinfer:
        try:
            import flashinfer as fi
        except Exception as e:  # noqa: BLE001
            notes.append(f"FlashInfer not measured: import failed: {type(e).__name__}: {e}")
            print(notes[-1], flush=True)
    flex = None
    if not args.skip_flex and not args.skip_dense:
        try:
            flex = decode.Flex()
        except Exception as e:  # noqa: BLE001
            notes.append(f"FlexAttention not measured: {type(e).__name__}: {e}")

    exp = None
    if args.decode_io:
        if os.path.exists(os.path.join(args.decode_io, "manifest.json")):
            exp = kvio.Export(args.decode_io)
        else:
            notes.append(f"decode: no export in {args.decode_io} (did kvattn bench decode --save-io fail?)")
    res = {"meta": meta_info(fi, exp), "notes": notes, "rows": []}
    results_path = os.path.join(args.out, "results.json")

    def save():
        res["meta"]["wall_s"] = round(time.time() - t_start, 1)
        with open(results_path + ".tmp", "w") as f:
            json.dump(res, f, indent=1)
        os.replace(results_path + ".tmp", results_path)

    print("# " + ", ".join(f"{k} {v}" for k, v in res["meta"].items() if v is not None), flush=True)
    import warnings
    warnings.filterwarnings("ignore")

    # ---- which cases: decode from the export, prefill as --prefill says (prefill.py) ----
    dcases = [c for c in exp.cases if c.get("op") == "decode"] if exp is not None else []
    if exp is not None:
        kv_rows = kvattn_rows_by_key(args.decode_json)
        if args.decode_json and not kv_rows:
            notes.append(f"kvattn's --json output {args.decode_json} is missing or unreadable; "
                         "kvattn's decode timings come from the export's manifest")
        for c in dcases:
            c["row"] = kv_rows.get(c["id"], kv_rows.get((c["case"], c["heads"]), c.get("row", {})))
    pcases, pexp = [], None
    if args.prefill != "off":
        if args.prefill_io and os.path.exists(os.path.join(args.prefill_io, "manifest.json")):
            pexp = kvio.Export(args.prefill_io)
            prow = kvattn_rows_by_key(args.prefill_json)
            for c in pexp.cases:
                if c.get("op") == "prefill" and c.get("alibi"):
                    notes.append(f"prefill {c.get('id')}: peers skipped, ALiBi (no peer runs it here)")
                elif c.get("op") == "prefill":
                    c["row"] = prow.get(c.get("id"), c.get("row", {}))
                    pcases.append(c)
        elif args.prefill_json and os.path.exists(args.prefill_json):
            with open(args.prefill_json) as f:
                pcases, skipped = prefill.cases_from_rows(json.load(f))
            notes.append("prefill: no export from kvattn bench prefill (--save-io): the peers ran on its "
                         "shapes with generated inputs; kvattn's prefill outputs are not cross-checked")
            notes += [f"prefill {cid}: peers skipped, {why}" for cid, why in skipped]
        elif args.prefill == "builtin":
            pcases = prefill.builtin_cases(args.quick)
            notes.append("prefill: built-in shapes, peers only (no kvattn prefill in this run)")
    if pcases and not args.no_prefill_reference:
        notes.append(f"prefill errors vs float64 are over {args.ref_rows} query rows spread over each case plus "
                     "each request's first and last row, all heads (bench/peers/prefill.py); |d kvattn| over all rows")
    ccases, cexp = [], None
    if args.cascade_io:
        if os.path.exists(os.path.join(args.cascade_io, "manifest.json")):
            cexp = kvio.Export(args.cascade_io)
            crow = kvattn_rows_by_key(args.cascade_json)
            if args.cascade_json and not crow:
                notes.append(f"kvattn's --json output {args.cascade_json} is missing or unreadable; "
                             "kvattn's cascade timings come from the export's manifest")
            for c in cexp.cases:
                if c.get("op") == "cascade":
                    c["row"] = crow.get(c.get("id"), c.get("row", {}))
                    ccases.append(c)
        else:
            notes.append(f"cascade: no export in {args.cascade_io} (did kvattn bench cascade --save-io fail?)")
    for other in (pexp, cexp):  # a run without decode: kvattn's version from another export
        if res["meta"].get("kvattn") is None and other is not None:
            res["meta"]["kvattn"] = other.manifest.get("kvattn_version")
    res["cases"] = {"decode": len(dcases), "prefill": len(pcases), "cascade": len(ccases)}
    res["kvattn_raw"] = {}  # kvattn's own --json output, whole
    for op, path in (("decode", args.decode_json), ("prefill", args.prefill_json), ("cascade", args.cascade_json)):
        if path and os.path.exists(path):
            try:
                with open(path) as f:
                    res["kvattn_raw"][op] = json.load(f)
            except ValueError:
                pass

    # ---- FlashInfer's kernels, compiled before anything is timed ----
    if fi is not None and (dcases or pcases or ccases):
        import jit_warmup
        keys = flashinfer_keys(dcases, pcases, ccases)
        res["meta"]["flashinfer_jit_s"] = round(jit_warmup.build(keys, log=lambda m: print(m, flush=True)), 1)

    def out_of_time(op, case):
        """Past --deadline: list the case as not run, keep kvattn's own timing for it (unchecked)."""
        if args.deadline is None or time.time() < args.deadline:
            return False
        res.setdefault("not_run", []).append(f"{op} {case['id']}")
        kr = case.get("row") or {}
        if kr:
            r = decode.base_row(case, "kvattn") if op == "decode" else cascade.base_row(case, "kvattn") \
                if op == "cascade" else prefill.base_row(case, "kvattn", case.get("kv", "ragged"))
            r.update({k: kr[k] for k in ("ms", "GBps", "TFLOPs", "pct_of_4800", "plan_us", "speedup") if k in kr})
            r["note"] = "peers not run (out of time); output not checked"
            res["rows"].append(r)
        return True

    # ---- decode ----
    for case in dcases:
        if out_of_time("decode", case):
            continue
        try:
            res["rows"] += decode.run_case(exp, case, args, fi, flex, log_row)
        except Exception as e:  # noqa: BLE001 - keep the other cases
            traceback.print_exc()
            notes.append(f"decode {case['id']}: {type(e).__name__}: {e}"[:400])
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        save()

    # ---- prefill ----
    for c in pcases:
        if out_of_time("prefill", c):
            continue
        try:
            res["rows"] += prefill.run_case(c, args, fi, flex, log_row, exp=pexp)
        except Exception as ex:  # noqa: BLE001
            traceback.print_exc()
            notes.append(f"prefill {c['id']}: {type(ex).__name__}: {ex}"[:400])
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        save()

    # ---- cascade (shared prefix) ----
    for c in ccases:
        if out_of_time("cascade", c):
            continue
        try:
            res["rows"] += cascade.run_case(cexp, c, args, fi, log_row)
        except Exception as ex:  # noqa: BLE001
            traceback.print_exc()
            notes.append(f"cascade {c['id']}: {type(ex).__name__}: {ex}"[:400])
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        save()

    if res.get("not_run"):
        notes.append(f"out of time (--deadline): not run: {', '.join(res['not_run'])}")
    save()
    report.write_table(res, os.path.join(args.out, "table.md"))
    title = f"({res['meta'].get('gpu')}, {res['meta'].get('date')})"
    for fn in (report.plot_decode, report.plot_skew, report.plot_prefill):
        try:
            fn(res["rows"], args.out, title)
        except Exception as e:  # noqa: BLE001 - plots are optional
            print(f"plot {fn.__name__}: {type(e).__name__}: {e}", flush=True)
    print(f"# done in {time.time() - t_start:.0f} s: {results_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
