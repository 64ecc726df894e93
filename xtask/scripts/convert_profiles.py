#!/usr/bin/env python3
"""Convert the seed papers' public profiling data into sluice profiles.

    python3 xtask/scripts/convert_profiles.py --data ../shared/data --out profiles

Reads (paths relative to --data; see ../shared/data/README.md for the snapshot
commits) and writes (relative to --out):

  proteus/profiling/aggregate_profiled.csv
  proteus/traces/model_variants/<family>            -> proteus-cpu.toml
                                                        proteus-pascal.toml
                                                        proteus-ampere.toml
  loki/simulator/profiling/simulator_runtimes.csv
  loki/simulator/traces/model_variants/{traffic_analysis,social_media}/<task>
                                                     -> loki-simulator.toml
  loki/profiling/profiled/runtimes_all.csv           -> loki-1080ti.toml
  infadapter/capacity_result_Feb_21.csv
  infadapter/infadapter_constants.json               -> infadapter-resnet-capacity.toml
                                                        infadapter-resnet-cpu1.toml

Profiles follow host/core/src/profile.rs (format version 1, latency in integer µs
per batch size, p50 <= p95 <= p99, accuracy in [0, 1]); the capacity table
has its own schema, described in its header and in profiles/README.md. Every
choice made here (percentile filling, accuracy normalisation, duplicates) is
documented in profiles/README.md. Standard library only; the output is a pure
function of the input files (byte-identical on every run).
"""

import argparse
import csv
import json
import math
import os
import sys
from collections import OrderedDict

SNAPSHOTS = {
    "proteus": "6967c93",
    "loki": "e6bb80c",
    "infadapter": "398b18f",
}

HEADER = "# sluice model profile (format version 1): latency in µs per batch size, top-1 accuracy.\n"


# --------------------------------------------------------------------------- TOML


def toml_str(s):
    """A TOML basic string."""
    out = ['"']
    for ch in s:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif code < 0x20 or code == 0x7F:
            out.append("\\u%04X" % code)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_float(x):
    if not math.isfinite(x):
        raise ValueError("non-finite float %r" % x)
    r = repr(float(x))
    if "e" in r or "E" in r:
        # TOML accepts 1e-05, but a plain decimal reads better and is exact enough.
        r = ("%.12f" % x).rstrip("0")
        if r.endswith("."):
            r += "0"
    return r


def toml_int_list(xs):
    return "[" + ", ".join(str(int(x)) for x in xs) + "]"


def ms_to_us(ms):
    return int(round(float(ms) * 1000.0))


def s_to_us(s):
    return int(round(float(s) * 1_000_000.0))


def check_model(m, where):
    """The rules of Profile::parse, so that a bad file never gets written."""
    name = m["name"]
    assert name.strip(), where
    assert 0.0 <= m["accuracy"] <= 1.0, (where, name, m["accuracy"])
    b = m["batch_sizes"]
    assert b and b[0] >= 1 and all(y > x for x, y in zip(b, b[1:])), (where, name, b)
    for key in ("p50_us", "p95_us", "p99_us"):
        assert len(m[key]) == len(b), (where, name, key)
    for i in range(len(b)):
        assert m["p50_us"][i] <= m["p95_us"][i] <= m["p99_us"][i], (where, name, b[i])
    if m.get("runs") is not None:
        assert m["runs"] >= 1, (where, name)


def write_profile(path, name, device, source, models, comment):
    names = [m["name"] for m in models]
    assert len(set(names)) == len(names), "duplicate model names in %s" % path
    assert models, "no models for %s" % path
    lines = [HEADER]
    for c in comment:
        lines.append(("# " + c).rstrip() + "\n")
    lines.append("version = 1\n")
    lines.append("name = %s\n" % toml_str(name))
    lines.append("device = %s\n" % toml_str(device))
    lines.append("source = %s\n" % toml_str(source))
    for m in models:
        check_model(m, path)
        lines.append("\n[[model]]\n")
        lines.append("name = %s\n" % toml_str(m["name"]))
        lines.append("accuracy = %s\n" % toml_float(m["accuracy"]))
        lines.append("accuracy_source = %s\n" % toml_str(m["accuracy_source"]))
        lines.append("batch_sizes = %s\n" % toml_int_list(m["batch_sizes"]))
        lines.append("p50_us = %s\n" % toml_int_list(m["p50_us"]))
        lines.append("p95_us = %s\n" % toml_int_list(m["p95_us"]))
        lines.append("p99_us = %s\n" % toml_int_list(m["p99_us"]))
        if m.get("runs") is not None:
            lines.append("runs = %d\n" % m["runs"])
    write_text(path, "".join(lines))
    return len(models)


def write_text(path, text):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def read_variants(path):
    """A model-variant list: lines `variant,normalized_acc` (percent, or a fraction)."""
    out = OrderedDict()
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            name, acc = line.rsplit(",", 1)
            out[name.strip()] = acc.strip()
    return out


def pct_to_unit(text):
    """'96.48648649' (percent) -> 0.9648648649, rounded to 10 decimals."""
    return round(float(text) / 100.0, 10)


# --------------------------------------------------------------------------- Proteus

PROTEUS_DEVICES = OrderedDict(
    [
        (
            "onnxruntime_cpu",
            (
                "proteus-cpu",
                "cpu: ONNX Runtime on CPU (Proteus's Accel label `onnxruntime_cpu`; "
                "the CPU model is not recorded in the data)",
            ),
        ),
        (
            "onnxruntime_gpu_pascal",
            (
                "proteus-pascal",
                "gpu: ONNX Runtime on an NVIDIA Pascal-generation GPU (Proteus's Accel label "
                "`onnxruntime_gpu_pascal`; the card is not recorded in the data)",
            ),
        ),
        (
            "onnxruntime_gpu_ampere",
            (
                "proteus-ampere",
                "gpu: ONNX Runtime on an NVIDIA Ampere-generation GPU (Proteus's Accel label "
                "`onnxruntime_gpu_ampere`; the card is not recorded in the data)",
            ),
        ),
    ]
)


def convert_proteus(data, out, report):
    root = os.path.join(data, "proteus")
    csv_rel = "proteus/profiling/aggregate_profiled.csv"
    rows = read_csv(os.path.join(data, csv_rel))

    # Families and their normalized accuracies, as Proteus's simulator reads them.
    var_dir = os.path.join(root, "traces", "model_variants")
    family_of, variant_acc = {}, {}
    for fam in sorted(os.listdir(var_dir)):
        p = os.path.join(var_dir, fam)
        if not os.path.isfile(p):
            continue
        for name, acc in read_variants(p).items():
            family_of[name] = fam
            variant_acc[name] = float(acc)

    # (accel, model) -> {batch: row}; a repeated (model, accel, batch) row keeps
    # the later one, as a loader that keys rows by those three columns would.
    table = OrderedDict()
    duplicates = []
    raw_acc, norm_acc = {}, {}
    for r in rows:
        key = (r["Accel"], r["Model"])
        b = int(r["batchsize"])
        per = table.setdefault(key, {})
        if b in per:
            duplicates.append("%s %s batch %d" % (r["Model"], r["Accel"], b))
        per[b] = r
        raw_acc[r["Model"]] = r["Accuracy"]
        norm_acc[r["Model"]] = r["Normalized_Accuracy"]

    # Family bests, for the accuracy_source text.
    best_raw = {}
    for model, fam in family_of.items():
        if model in raw_acc:
            if fam not in best_raw or float(raw_acc[model]) > float(raw_acc[best_raw[fam]]):
                best_raw[fam] = model

    filled_single = 0
    counts = {}
    for accel, (stem, device) in PROTEUS_DEVICES.items():
        models = []
        for (a, model), per in table.items():
            if a != accel:
                continue
            fam = family_of.get(model)
            if fam is None:
                report.append("proteus: %s (%s) is in no model_variants family: skipped" % (model, accel))
                continue
            csv_norm = float(norm_acc[model])
            if abs(csv_norm - variant_acc[model]) > 1e-6:
                raise SystemExit(
                    "proteus: %s: Normalized_Accuracy %s in the CSV but %s in traces/model_variants/%s"
                    % (model, norm_acc[model], variant_acc[model], fam)
                )
            sizes = sorted(per)
            p50, p95, p99, trials = [], [], [], []
            for b in sizes:
                r = per[b]
                median = ms_to_us(r["50th_pct"])
                if r["90th_pct"].strip():
                    tail = ms_to_us(r["90th_pct"])
                else:
                    tail = median
                    filled_single += 1
                p50.append(median)
                p95.append(tail)
                p99.append(tail)
                trials.append(int(r["Trials"]) if r["Trials"].strip() else None)
            runs = None if any(t is None for t in trials) else min(trials)
            best = best_raw[fam]
            models.append(
                {
                    "name": model,
                    "accuracy": pct_to_unit(norm_acc[model]),
                    "accuracy_source": (
                        "Proteus artifact (commit %s), %s, column Normalized_Accuracy = %s: "
                        "the %s family's accuracy as %% of its best variant %s "
                        "(same figure as traces/model_variants/%s). Raw Accuracy column: %s "
                        "(the family's own task metric, in %%)."
                        % (
                            SNAPSHOTS["proteus"],
                            csv_rel,
                            norm_acc[model],
                            fam,
                            best,
                            fam,
                            raw_acc[model],
                        )
                    ),
                    "batch_sizes": sizes,
                    "p50_us": p50,
                    "p95_us": p95,
                    "p99_us": p99,
                    "runs": runs,
                }
            )
        source = (
            "converted by xtask/scripts/convert_profiles.py from the Proteus artifact (commit %s), "
            "%s, rows with Accel = %s. Units ms -> µs (rounded). p50_us = 50th_pct; "
            "p95_us = p99_us = 90th_pct, the highest percentile the source reports (so the tails are "
            "understated); where 90th_pct is empty (the CNN families on GPU, Trials empty) "
            "p50 = p95 = p99 = 50th_pct, the only figure given (it equals avg_latency there). "
            "accuracy = Normalized_Accuracy / 100 (per family, best variant = 1.0). "
            "See profiles/README.md." % (SNAPSHOTS["proteus"], csv_rel, accel)
        )
        comment = [
            "Converted from the Proteus artifact (commit %s): %s, Accel = %s." % (SNAPSHOTS["proteus"], csv_rel, accel),
            "Generated by xtask/scripts/convert_profiles.py; do not edit by hand (see profiles/README.md).",
            "accuracy is Proteus's normalized accuracy (fraction of the best variant of the same family),",
            "not a top-1 figure comparable across families. Families: "
            + ", ".join(sorted(set(family_of[m["name"]] for m in models))) + ".",
        ]
        n = write_profile(os.path.join(out, stem + ".toml"), stem, device, source, models, comment)
        counts[stem + ".toml"] = n
    if duplicates:
        report.append("proteus: repeated rows (the later kept): " + "; ".join(duplicates))
    report.append("proteus: %d batch-size rows had no 90th_pct: p50 = p95 = p99 = 50th_pct there" % filled_single)
    return counts


# --------------------------------------------------------------------------- Loki

LOKI_APPS = ("traffic_analysis", "social_media")


def loki_accuracies(data):
    """model -> (normalized accuracy text, 'app/task') from the simulator's variant lists."""
    base = os.path.join(data, "loki", "simulator", "traces", "model_variants")
    acc = {}
    for app in LOKI_APPS:
        app_dir = os.path.join(base, app)
        for task in sorted(os.listdir(app_dir)):
            p = os.path.join(app_dir, task)
            if not os.path.isfile(p):
                continue  # backup_* folders: superseded lists, not read by the simulator
            for name, a in read_variants(p).items():
                where = "%s/%s" % (app, task)
                if name in acc and abs(float(acc[name][0]) - float(a)) > 1e-9:
                    raise SystemExit("loki: %s has accuracy %s in %s but %s in %s" % (name, a, where, *acc[name]))
                acc.setdefault(name, (a, where))
    return acc


def convert_loki(data, out, report):
    counts = {}
    acc = loki_accuracies(data)
    var_rel = "loki/simulator/traces/model_variants"

    # --- The simulator's runtime table.
    rel = "loki/simulator/profiling/simulator_runtimes.csv"
    rows = read_csv(os.path.join(data, rel))
    by_accel = OrderedDict()
    for r in rows:
        by_accel.setdefault(r["Accel"], OrderedDict()).setdefault(r["Model"], {})[int(r["batchsize"])] = (
            r["50th_pct"],
            r["90th_pct"],
            r["95th_pct"],
        )
    accels = list(by_accel)
    first = by_accel[accels[0]]
    identical = all(by_accel[a] == first for a in accels[1:])
    if not identical:
        raise SystemExit("loki: simulator_runtimes.csv differs between Accel labels; this script assumes it does not")
    models = []
    for model, per in first.items():
        if model not in acc:
            report.append("loki: %s is in %s but in no variant list: skipped" % (model, rel))
            continue
        a, where = acc[model]
        sizes = sorted(per)
        models.append(
            {
                "name": model,
                "accuracy": pct_to_unit(a),
                "accuracy_source": (
                    "Loki artifact (commit %s), %s/%s: normalized accuracy %s (%% of the task's best "
                    "variant, as Loki's simulator reads it)%s"
                    % (
                        SNAPSHOTS["loki"],
                        var_rel,
                        where,
                        a,
                        " - a pseudo-model of the app DAG, not a network" if model in ("source", "sink") else "",
                    )
                ),
                "batch_sizes": sizes,
                "p50_us": [ms_to_us(per[b][0]) for b in sizes],
                "p95_us": [ms_to_us(per[b][2]) for b in sizes],
                "p99_us": [ms_to_us(per[b][2]) for b in sizes],
                "runs": None,
            }
        )
    profiled = set(first)
    for name, (_, where) in sorted(acc.items()):
        if name not in profiled:
            report.append("loki: %s (%s) has an accuracy but no runtimes in %s: not converted" % (name, where, rel))
    source = (
        "converted by xtask/scripts/convert_profiles.py from the Loki artifact (commit %s), %s "
        "(the runtime table of Loki's simulator). Units ms -> µs (rounded). p50_us = 50th_pct, "
        "p95_us = 95th_pct, p99_us = 95th_pct (the source stops at the 95th). The table holds the same "
        "numbers under all three Accel labels (%s), so this is one profile. accuracy = the simulator's "
        "normalized accuracy / 100 from %s/{traffic_analysis,social_media}/<task>. See profiles/README.md."
        % (SNAPSHOTS["loki"], rel, ", ".join(accels), var_rel)
    )
    device = (
        "unrecorded: Loki's simulator runtime table (identical numbers under the Accel labels %s; "
        "the hardware is not recorded in the data)" % ", ".join(accels)
    )
    comment = [
        "Converted from the Loki artifact (commit %s): %s." % (SNAPSHOTS["loki"], rel),
        "Generated by xtask/scripts/convert_profiles.py; do not edit by hand (see profiles/README.md).",
        "Apps (simulator/traces/apps): traffic_analysis = object_detection (yolov5*) -> car_classification",
        "(efficientnet-b*) | facial_recognition (genderNet*) -> sink; social_media = object_detection ->",
        "image_captioning (clip-vit-*). source and sink are the DAG's pseudo-models (1 µs).",
        "accuracy is normalized per task (best variant = 1.0), not top-1.",
    ]
    counts["loki-simulator.toml"] = write_profile(
        os.path.join(out, "loki-simulator.toml"), "loki-simulator", device, source, models, comment
    )

    # --- The measured pipeline profiles on a GTX 1080 Ti.
    rel = "loki/profiling/profiled/runtimes_all.csv"
    rows = read_csv(os.path.join(data, rel))
    per_model = OrderedDict()
    for r in rows:
        assert r["accelerator"] == "1080ti", r
        per_model.setdefault(r["model"], {})[int(r["batch_size"])] = (
            r["50th_pct_runtime"],
            r["90th_pct_runtime"],
            r["95th_pct_runtime"],
        )
    models = []
    for model, per in per_model.items():
        if model.startswith("eb") and model.endswith("_checkpoint_150epochs"):
            variant = "efficientnet-b" + model[2 : -len("_checkpoint_150epochs")]
            how = (
                "accuracy of %s in %s/%s, taken for this checkpoint by name (eb<k>_checkpoint_150epochs = "
                "EfficientNet-B<k> fine-tuned for car classification); the artifact gives no per-model "
                "accuracy for the checkpoint itself, only pipeline accuracies (profiling/profiled/accuracy_all.csv)"
            )
        else:
            variant = model
            how = "accuracy of %s in %s/%s"
        if variant not in acc:
            report.append("loki: %s in %s has no accuracy: skipped" % (model, rel))
            continue
        a, where = acc[variant]
        sizes = sorted(per)
        models.append(
            {
                "name": model,
                "accuracy": pct_to_unit(a),
                "accuracy_source": (
                    "Loki artifact (commit %s): normalized accuracy %s, the %s"
                    % (SNAPSHOTS["loki"], a, how % (variant, var_rel, where))
                ),
                "batch_sizes": sizes,
                "p50_us": [s_to_us(per[b][0]) for b in sizes],
                "p95_us": [s_to_us(per[b][2]) for b in sizes],
                "p99_us": [s_to_us(per[b][2]) for b in sizes],
                "runs": None,
            }
        )
    source = (
        "converted by xtask/scripts/convert_profiles.py from the Loki artifact (commit %s), %s. "
        "Units s -> µs (rounded). p50_us = 50th_pct_runtime, p95_us = p99_us = 95th_pct_runtime "
        "(the source stops at the 95th). accuracy: the simulator's normalized accuracy / 100 "
        "(%s/traffic_analysis/<task>), mapped by name; see profiles/README.md. The vgg16 row of "
        "runtimes_all_vgghardcoded.csv (hand-entered, batch 1 only) is not included."
        % (SNAPSHOTS["loki"], rel, var_rel)
    )
    comment = [
        "Converted from the Loki artifact (commit %s): %s." % (SNAPSHOTS["loki"], rel),
        "Generated by xtask/scripts/convert_profiles.py; do not edit by hand (see profiles/README.md).",
        "The traffic-analysis pipeline's detectors (yolov5*) and car classifiers (eb<k> checkpoints).",
        "accuracy is normalized per task (best variant = 1.0), not top-1.",
    ]
    counts["loki-1080ti.toml"] = write_profile(
        os.path.join(out, "loki-1080ti.toml"),
        "loki-1080ti",
        "gpu: NVIDIA GeForce GTX 1080 Ti (Loki's accelerator label `1080ti`)",
        source,
        models,
        comment,
    )
    report.append(
        "loki: not converted (not per-model latency/accuracy): profiling/profiled/accuracy_all.csv and "
        "simulator/profiling/pipeline_accuracy.csv (pipeline accuracy per detector/classifier pair), "
        "profiling/profiled/branching*.csv (detector multiplicative factors and branch probabilities), "
        "simulator/profiling/aggregate_profiled.csv (byte-identical to Proteus's, converted there)"
    )
    return counts


# --------------------------------------------------------------------------- InfAdapter

INFADAPTER_CONSTANT_COLUMNS = {
    "REPLICA": "1",
    "HARDWARE": "cpu",
    "BATCH": "1",
    "MAX_ENQUEUED_BATCHES": "1000000",
    "INTRA_OP_PARALLELISM": "1",
}


def convert_infadapter(data, out, report):
    counts = {}
    rel = "infadapter/capacity_result_Feb_21.csv"
    const_rel = "infadapter/infadapter_constants.json"
    rows = read_csv(os.path.join(data, rel))
    with open(os.path.join(data, const_rel), encoding="utf-8") as f:
        consts = json.load(f)

    for r in rows:
        for col, val in INFADAPTER_CONSTANT_COLUMNS.items():
            assert r[col] == val, (col, r)
        assert r["NUM_BATCH_THREADS"] == r["CPU"] == r["INTER_OP_PARALLELISM"], r

    versions = [str(v) for v in consts["model_versions"]]
    mem, saturation = {}, {}
    for r in rows:
        mem.setdefault(r["ARCH"], set()).add(r["MEM"])
        key = (r["ARCH"], int(r["CPU"]))
        saturation.setdefault(key, set()).add(int(r["saturation_tp"]))
    for key, s in saturation.items():
        assert len(s) == 1, ("saturation_tp differs between SLA rows", key, s)

    def acc_source(v):
        return (
            "InfAdapter artifact (commit %s), %s baseline_accuracies[\"%s\"] = %s (ImageNet top-1 of "
            "torchvision's ResNet-%s, as InfAdapter's auto_tuner uses it)"
            % (SNAPSHOTS["infadapter"], const_rel, v, consts["baseline_accuracies"][v], v)
        )

    # --- The capacity table (own schema; not a profile).
    lines = [
        "# InfAdapter capacity table: ResNet-18..152 served by TF Serving on CPU, one replica, batch 1,\n",
        "# for 1..20 CPU cores and four latency SLAs. NOT a sluice model profile (no `version`; the file\n",
        "# name ends in `-capacity`, which host/core/tests/profiles.rs skips); see profiles/README.md.\n",
        "#\n",
        "# Converted by xtask/scripts/convert_profiles.py from the InfAdapter artifact (commit %s):\n"
        % SNAPSHOTS["infadapter"],
        "#   %s (one row per point below, in file order) and\n" % rel,
        "#   %s (accuracy, load time, memory per model).\n" % const_rel,
        "#\n",
        "# Schema (kind = \"capacity\", format = 1):\n",
        "#   [[model]]  name (\"resnet<ARCH>\"), arch, accuracy (0-1), accuracy_source, load_time_s,\n",
        "#              memory (infadapter_constants.json memory_sizes), container_memory (the CSV's MEM).\n",
        "#   point = [ {...}, ... ]  one inline table per CSV row (placed before the [[model]] tables,\n",
        "#                    as TOML requires of root keys):\n",
        "#     model          resnet<ARCH>\n",
        "#     cpus           CPU: cores of the replica (TF Serving inter-op threads = batch threads = cpus,\n",
        "#                    intra-op threads = 1, batch size 1, max enqueued batches 1e6)\n",
        "#     sla_us         SLA, ms -> µs: the p99 latency target of that load test\n",
        "#     capacity_rps   capacity: requests/s the replica sustained for that SLA (as InfAdapter measured it)\n",
        "#     saturation_rps saturation_tp: requests/s at saturation (the same for every SLA of a model/cpus)\n",
        "#     p99_latency_us p99_latency, ms -> µs (rounded), the p99 the CSV records for that run;\n",
        "#                    ABSENT where the CSV cell is empty (9 rows)\n",
        "#     timestamp      the CSV's timestamp (UTC, 2023-02-21)\n",
        "kind = \"capacity\"\n",
        "format = 1\n",
        "name = \"infadapter-resnet-capacity\"\n",
        "device = \"cpu: TF Serving on CPU cores (InfAdapter's testbed; the CPU model is not recorded in the data)\"\n",
        "source = %s\n"
        % toml_str(
            "converted by xtask/scripts/convert_profiles.py from the InfAdapter artifact (commit %s), %s and %s"
            % (SNAPSHOTS["infadapter"], rel, const_rel)
        ),
        "latency_slo_ms = %s  # infadapter_constants.json: the SLO of InfAdapter's experiments\n"
        % consts["latency_slo_ms"],
        "capacity_coef = %s  # infadapter_constants.json: InfAdapter plans with capacity x this\n"
        % toml_float(consts["capacity_coef"]),
    ]
    # Root keys must precede the [[model]] tables, so the points come first.
    lines.append("\npoint = [\n")
    missing = 0
    for r in rows:
        fields = [
            "model = %s" % toml_str("resnet" + r["ARCH"]),
            "cpus = %d" % int(r["CPU"]),
            "sla_us = %d" % ms_to_us(r["SLA"]),
            "capacity_rps = %d" % int(r["capacity"]),
            "saturation_rps = %d" % int(r["saturation_tp"]),
        ]
        if r["p99_latency"].strip():
            fields.append("p99_latency_us = %d" % ms_to_us(r["p99_latency"]))
        else:
            missing += 1
        fields.append("timestamp = %s" % toml_str(r["timestamp"]))
        lines.append("  { " + ", ".join(fields) + " },\n")
    lines.append("]\n")
    for v in versions:
        assert len(mem[v]) == 1, (v, mem[v])
        lines += [
            "\n[[model]]\n",
            "name = %s\n" % toml_str("resnet" + v),
            "arch = %s\n" % v,
            "accuracy = %s\n" % toml_float(consts["baseline_accuracies"][v]),
            "accuracy_source = %s\n" % toml_str(acc_source(v)),
            "load_time_s = %s\n" % toml_float(consts["load_times_s"][v]),
            "memory = %s\n" % toml_str(consts["memory_sizes"][v]),
            "container_memory = %s\n" % toml_str(next(iter(mem[v]))),
        ]
    write_text(os.path.join(out, "infadapter-resnet-capacity.toml"), "".join(lines))
    counts["infadapter-resnet-capacity.toml"] = "%d points, %d models (capacity table)" % (len(rows), len(versions))
    report.append("infadapter: %d of %d rows have no p99_latency: the key is left out there" % (missing, len(rows)))

    # --- A latency profile where one can be derived: one core serves one request at a
    # time (1 inter-op thread, 1 batch thread, batch 1), so the mean service time is
    # 1 / saturation throughput. Only a mean: p50 = p95 = p99.
    models = []
    for v in versions:
        sat = next(iter(saturation[(v, 1)]))
        us = int(round(1_000_000 / sat))
        models.append(
            {
                "name": "resnet" + v,
                "accuracy": float(consts["baseline_accuracies"][v]),
                "accuracy_source": acc_source(v),
                "batch_sizes": [1],
                "p50_us": [us],
                "p95_us": [us],
                "p99_us": [us],
                "runs": None,
            }
        )
    source = (
        "derived by xtask/scripts/convert_profiles.py from the InfAdapter artifact (commit %s), %s: "
        "latency = 1 / saturation_tp of the 1-core replica (one request at a time: 1 inter-op thread, "
        "1 batch thread, batch 1), i.e. a mean service time, not a measured percentile; "
        "p50 = p95 = p99 = that mean. Batch 1 only (InfAdapter profiled no other). "
        "See profiles/README.md." % (SNAPSHOTS["infadapter"], rel)
    )
    comment = [
        "Derived from the InfAdapter artifact (commit %s): %s (CPU = 1 rows)." % (SNAPSHOTS["infadapter"], rel),
        "Generated by xtask/scripts/convert_profiles.py; do not edit by hand (see profiles/README.md).",
        "Mean service time per request on one core (1e6 / saturation_tp µs); the tails are NOT measured.",
        "Capacities for 1..20 cores and each SLA are in infadapter-resnet-capacity.toml.",
    ]
    counts["infadapter-resnet-cpu1.toml"] = write_profile(
        os.path.join(out, "infadapter-resnet-cpu1.toml"),
        "infadapter-resnet-cpu1",
        "cpu: 1 core, TF Serving (InfAdapter's testbed; the CPU model is not recorded in the data)",
        source,
        models,
        comment,
    )
    report.append(
        "infadapter: not converted here: twitter_workload_per_second.txt.gz (an arrival trace, not a profile); "
        "the rest of infadapter_constants.json (planner parameters) is not profile data"
    )
    return counts


# --------------------------------------------------------------------------- main


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data", help="the shared data folder (default ../shared/data)")
    ap.add_argument("--out", default="profiles", help="where to write the profiles (default profiles)")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.data):
        sys.exit("no data folder at %s" % args.data)
    os.makedirs(args.out, exist_ok=True)
    report = []
    counts = OrderedDict()
    counts.update(convert_proteus(args.data, args.out, report))
    counts.update(convert_loki(args.data, args.out, report))
    counts.update(convert_infadapter(args.data, args.out, report))
    try:
        import tomllib  # Python >= 3.11: re-read every file written, as a check
    except ImportError:
        tomllib = None
    for name, n in counts.items():
        if tomllib is not None:
            with open(os.path.join(args.out, name), "rb") as f:
                tomllib.load(f)
        print("wrote %s: %s" % (os.path.join(args.out, name), n if isinstance(n, str) else "%d models" % n))
    for line in report:
        print("note: " + line)


if __name__ == "__main__":
    main()
