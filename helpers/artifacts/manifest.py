"""Saved graphs: fingerprints, the manifest of each rank, and loading without recompiling.

Saved graphs are named ``{unit}-rank{rank}-{fingerprint}.pt2``; the fingerprint hashes the model
architecture, the engine settings (batch, buckets, tp degree, dtype, device, GQA, quantization),
the unit (part, kind, bucket, width), the rank and the torch version. ``load`` refuses a mismatch
or a file whose sha256 changed, naming what differs; it never recompiles behind the caller's back.

The manifest also records the CPU matmul kernels the rank ran with (``matmul_kernels``, outside the
fingerprint: they decide the last bits of the logits the graphs compute with, not the graphs' code). A
load builds the rank with those kernels again, so it reproduces the saved model bit for bit, or refuses
naming a kernel that cannot run here (``helpers.engine.cpu.kernel_choice.check_recorded``).
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import torch

from ..engine.cpu.kernel_choice import check_recorded
from ..engine.model import Transformer
from .graphs import (ARTIFACTS, ArtifactMismatchError, CorruptArtifactError, Unit, bucket_graphs, check_unit,
                     kinds_of, unit_specs, units_of)

FORMAT_VERSION = 1
TORCH_VERSION = torch.__version__


def fingerprint(fields: dict, spec: dict, artifact: str) -> str:
    key = {**fields, **{f"unit_{k}": v for k, v in spec.items()}, "artifact": artifact}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


def artifact_name(unit: str, rank: int, fp: str) -> str:
    return f"{unit}-rank{rank}-{fp}.pt2"


def manifest_path(directory, rank: int) -> Path:
    return Path(directory) / f"graphs-rank{rank}.json"


def file_sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_graphs(directory, graphs: dict, fields: dict, rank: int, report: list[dict] | None = None,
                kernels: dict | None = None) -> dict:
    """Write this rank's graphs and ``graphs-rank{rank}.json`` (with the rank's matmul ``kernels``); returns
    the manifest."""
    units = units_of(graphs)
    d = Path(directory)
    if d.is_file():  # as transformers-neuronx base.py _save_compiled_artifacts
        raise FileExistsError(f"Artifacts should be saved to a directory. Found existing file: {directory}")
    d.mkdir(parents=True, exist_ok=True)
    seconds = {r["graph"]: r["seconds"] for r in report or []}
    entries = []
    for name, u in units.items():
        fp = fingerprint(fields, u.spec, u.artifact)
        path = d / artifact_name(name, rank, fp)
        if u.artifact == "export":
            torch.export.save(u.program, str(path))
        else:
            shutil.copyfile(u.package, path)
        entries.append({"unit": name, "spec": u.spec, "artifact": u.artifact, "file": path.name,
                        "fingerprint": fp, "sha256": file_sha256(path), "bytes": path.stat().st_size,
                        "build_s": seconds.get(name)})
    manifest = {"format": FORMAT_VERSION, "fields": fields, "graphs": entries, "matmul_kernels": kernels}
    manifest_path(d, rank).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def describe_differences(saved: dict, now: dict) -> list[str]:
    keys = sorted(set(saved) | set(now))
    return [f"{k}: saved {saved.get(k, '(absent)')!r}, now {now.get(k, '(absent)')!r}"
            for k in keys if saved.get(k) != now.get(k)]


def read_manifest(directory, fields: dict, rank: int, verify_files: bool = True) -> dict:
    """This rank's manifest, after checking it was written for exactly this model and engine and
    (``verify_files``) that every graph file is present with the sha256 recorded at save()."""
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"Did not find directory: {directory}.")
    path = manifest_path(d, rank)
    if not path.is_file():
        others = sorted(p.name for p in d.glob("graphs-rank*.json"))
        hint = (f" It holds {', '.join(others)}: saved with another tp_degree?" if others
                else " Nothing there was written by save()/compile().")
        raise FileNotFoundError(f"No saved graphs for rank {rank} in {directory} ({path.name} is missing)."
                                f"{hint} Build without load() and save() again.")
    try:
        manifest = json.loads(path.read_text())
        saved, entries = manifest["fields"], manifest["graphs"]
        by_unit = {e["unit"]: e for e in entries}
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptArtifactError(f"{path} is corrupted ({type(exc).__name__}: {exc}): save() again.") from None
    diffs = describe_differences(saved, fields)
    if diffs:
        raise ArtifactMismatchError(
            f"The graphs saved in {directory} were built for another configuration: " + "; ".join(diffs)
            + ". They cannot be used for this model: build it without load() (a fresh compile) and save() "
            "again, or construct the model with the saved settings.")
    for name, spec in unit_specs(kinds_of(fields)).items():
        e = by_unit.get(name)
        if e is None:
            raise CorruptArtifactError(f"{path} lists no graph {name}: the directory is incomplete; save() again.")
        if e.get("artifact") not in ARTIFACTS:
            raise CorruptArtifactError(f"{path}: graph {name} has unknown artifact kind {e.get('artifact')!r}")
        fp = fingerprint(fields, spec, e["artifact"])
        f = d / artifact_name(name, rank, fp)
        if e.get("fingerprint") != fp or not f.is_file():
            raise CorruptArtifactError(f"No graph file with fingerprint {fp} for {name} (rank {rank}) in {directory} "
                                       f"(the manifest lists {e.get('file')}): the directory was edited after "
                                       "save(); save() again.")
        if verify_files and file_sha256(f) != e["sha256"]:
            raise CorruptArtifactError(f"{f} is corrupted: its sha256 differs from the one recorded at save(). "
                                       "Delete the directory and save() again.")
    check_recorded(manifest.get("matmul_kernels"), f"The model saved in {directory} (rank {rank})")
    return manifest


def recorded_kernels(directory, rank: int) -> dict | None:
    """The matmul kernels rank ``rank`` of the model saved in ``directory`` ran with (None: not recorded)."""
    try:
        return json.loads(manifest_path(directory, rank).read_text()).get("matmul_kernels")
    except (OSError, ValueError, AttributeError):
        return None  # read_manifest, called first, names what is wrong with the file


def load_graphs(directory, tr: Transformer, fields: dict, rank: int, batch: int) -> tuple[dict, list[dict]]:
    """Load every graph this rank needs after verifying fingerprints and sha256 (no compilation)."""
    manifest = read_manifest(directory, fields, rank)
    by_unit = {e["unit"]: e for e in manifest["graphs"]}
    units, report = {}, []
    for name, spec in unit_specs(kinds_of(fields)).items():
        e = by_unit[name]
        path = Path(directory) / e["file"]
        t0 = time.perf_counter()
        try:
            if e["artifact"] == "export":
                ep = torch.export.load(str(path))
                units[name] = Unit(name, spec, "export", ep.module(), program=ep)
            else:
                units[name] = Unit(name, spec, "aoti", torch._inductor.aoti_load_package(str(path)),
                                   package=str(path))
        except Exception as exc:  # a file that hashes right but does not deserialize
            raise CorruptArtifactError(f"Could not load {path}: {type(exc).__name__}: {exc}") from exc
        check_unit(tr, units[name], batch, "loaded")
        report.append({"graph": name, **spec, "artifact": e["artifact"], "seconds": time.perf_counter() - t0,
                       "loaded": True})
    return bucket_graphs(tr, units, kinds_of(fields), batch), report
