"""The export stage: checkpoint -> verified .mlpackage (or .aimodel: export.format=coreai, coreai.py) + report,
published atomically, logged to MLflow.

`export_checkpoint` is the one way to export; the export app (`python -m sweeplab.export`) and the training app
(`export=coreml`, through `export_after_training`) both call it. Order of work:
load the trained model -> pick the layout -> convert -> describe -> save into a temp dir beside the target ->
verify that saved package -> write the report -> rename into place (an existing export only with overwrite=true)
-> log package and report to the MLflow run. Any failure before the rename leaves nothing at the target.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from sweeplab.core import interrupts
from sweeplab.core.errors import UserError, environment_error
from sweeplab.core.records import JobRun
from sweeplab.export import readiness, verify
from sweeplab.export import report as reporting
from sweeplab.export.ane import to_ane_layout
from sweeplab.export.convert import convert, describe, nonfinite_constants
from sweeplab.export.options import SUFFIXES, ExportOptions, options_from_config
from sweeplab.export.reference import load_program
from sweeplab.families import ExportSpec, get_family, resolve
from sweeplab.tracking import mlflow_store, runs

log = logging.getLogger(__name__)

PACKAGE_SUFFIX = ".mlpackage"
ARTIFACT_DIR = "coreml"  # a Core AI export's: "coreai"


@dataclass
class ExportResult:
    package: Path
    report: dict
    report_json: Path
    report_md: Path


# --- where the checkpoint and the package are ----------------------------------------------------
def checkpoint_from_run(run_id: str, tracking_uri: str | None) -> tuple[str, dict[str, float], str]:
    """(checkpoint path, final val/* metrics, tracking URI) of an MLflow run, from its `checkpoint` tag."""
    uri = mlflow_store.resolve_uri(tracking_uri)
    # an unreachable server or a missing sqlite file fails here, in seconds, naming the store
    mlflow_store.open_existing_store(uri)
    run = mlflow_store.read_run(uri, run_id, "run_id")
    checkpoint = JobRun.from_run(run).checkpoint
    if not checkpoint:
        raise UserError(f"run_id={run_id}: the run has no `checkpoint` tag (did it finish with a validation?)")
    return checkpoint, _val_metrics(run.metrics), uri


def _val_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in sorted(metrics.items()) if k.startswith("val/")}


def _checkpoint_metrics(states: Mapping) -> dict[str, float]:
    """The best score the checkpoint's ModelCheckpoint recorded (what there is without MLflow); `states`: the
    checkpoint's callback states, as loaded (and checked) with the model."""
    for state in states.values():
        if isinstance(state, dict) and state.get("monitor") and state.get("best_model_score") is not None:
            return {str(state["monitor"]): float(state["best_model_score"])}
    return {}


def package_path(options: ExportOptions, family: str, checkpoint: Path, out: str | Path | None) -> Path:
    """`out` as given (a .mlpackage or .aimodel path, as the format writes, or a directory to put <name>.<suffix>
    in); default <run dir>/export/."""
    name = (options.name or f"{family}-{options.variant}").removesuffix(options.suffix) + options.suffix
    if out is None:
        run_dir = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
        return run_dir / "export" / name
    out = Path(out)
    return out if out.suffix == options.suffix else out / name


def report_paths(package: Path) -> tuple[Path, Path]:
    """<name>.<format>.report.json and .md beside the package: named by format, so a Core ML and a Core AI export
    of one model into one folder keep both reports (the second overwrote the first's)."""
    formats = {suffix: fmt for fmt, suffix in SUFFIXES.items()}
    stem = package.name.removesuffix(package.suffix) if package.suffix in formats else package.name
    named = f"{stem}.{formats.get(package.suffix, 'export')}"
    return package.with_name(f"{named}.report.json"), package.with_name(f"{named}.report.md")


# --- metadata ------------------------------------------------------------------------------------
def _metadata(loaded, options: ExportOptions, run_id: str | None, metrics: Mapping[str, float]) -> dict[str, str]:
    alpha = loaded.model.alpha_values() if hasattr(loaded.model, "alpha_values") else {}
    return {
        "sweeplab.family": loaded.family,
        "sweeplab.variant": options.variant,
        "sweeplab.checkpoint": str(loaded.path),
        "sweeplab.global_step": str(loaded.global_step),
        "sweeplab.run_id": run_id or "",
        "sweeplab.config": json.dumps(loaded.hparams, sort_keys=True, default=str),
        "sweeplab.alpha": json.dumps(alpha, sort_keys=True),
        "sweeplab.metrics": json.dumps(dict(metrics), sort_keys=True),
    }


def _io_descriptions(kind: ExportSpec, vocab_size: int, extras: Mapping[str, tuple]) -> tuple[dict[str, str], dict[str, str]]:
    inputs = {
        "input_ids": f"token ids, int32 (B, S), 0 <= id < {vocab_size}",
        "attention_mask": "1 for real tokens, 0 for padding, int32 (B, S)",
        **{name: description for name, (_, description) in extras.items()},
    }
    return inputs, {kind.output: kind.summary}


def _extra_inputs(loaded, kind: ExportSpec, batch_size: int, rng: np.random.Generator) -> dict[str, tuple[np.ndarray, str]]:
    """{name: (a value, description)} of the inputs the family's export module takes after the token inputs."""
    if kind.extra_inputs is None:
        return {}
    return resolve(kind.extra_inputs, f"family {loaded.family}", "export.extra_inputs")(loaded.model_config, batch_size, rng)


def _modules(loaded, options: ExportOptions):
    """(the module converted, `loaded` holding the standard-layout module the package stands for): the family's
    export `module` (the decoder's generation step) or the model; with layout=ane its Neural-Engine layout."""
    family = get_family(loaded.family)
    if family.export.module is not None:
        step = resolve(family.export.module, f"family {loaded.family}", "export.module")(loaded.model).eval()
        loaded = replace(loaded, model=step)
    try:
        return (to_ane_layout(loaded.model, family) if options.layout == "ane" else loaded.model), loaded
    except ValueError as exc:
        raise UserError(f"export.layout=ane: {exc}") from None


# --- the stage -----------------------------------------------------------------------------------
def export_checkpoint(
    checkpoint: str | Path,
    options: ExportOptions,
    out: str | Path | None = None,
    *,
    expect_family: str | None = None,
    run_id: str | None = None,
    tracking_uri: str | None = None,
    metrics: Mapping[str, float] | None = None,
) -> ExportResult:
    """Export one checkpoint as `options` say; raises UserError (one line) for every expected failure."""
    if not options.enabled:
        raise UserError("export.format=none: nothing to export (use export=coreml)")
    if out is not None:  # an unwritable target fails before the checkpoint is read
        check_writable_target(Path(out).parent if Path(out).suffix == options.suffix else Path(out))
    # deferred: families.loading imports tasks, so Lightning (seconds); `import sweeplab.export` (plan, job) stays light
    from sweeplab.callbacks.faults import pause_in
    from sweeplab.families.loading import load_model

    loaded = load_model(checkpoint, expect_family=expect_family)
    kind, seq_len = _export_shape(loaded, checkpoint, options)
    vocab_size = int(loaded.model_config.vocab_size)
    target = package_path(options, loaded.family, loaded.path, out)
    json_path, md_path = report_paths(target)
    if target.exists() and not options.overwrite:
        raise UserError(f"{target} exists; pass export.overwrite=true to replace it")
    metrics = dict(metrics) if metrics is not None else _checkpoint_metrics(loaded.callback_states)
    cases = _cases(loaded, kind, options, vocab_size, options.seq_lens or [seq_len])  # bad real_data fails here
    extras = _extra_inputs(loaded, kind, options.batch_size, np.random.default_rng(options.seed))
    module, loaded = _modules(loaded, options)
    with _staging(target) as staging:  # made first: an unwritable target fails before the conversion's minutes
        log.info("exporting %s (%s) to %s", loaded.path, options.variant, target)
        pause_in("export")  # reliability tests: a signal lands in the export (a no-op unless asked for)
        staged = staging / target.name
        verify_and_report, write_report = _convert_and_save(
            loaded, module, kind, options, seq_len, vocab_size, cases, extras, staged, target, run_id, metrics)
        report = _verify_and_publish(verify_and_report, write_report, staging, staged, target, json_path, md_path)

    if run_id:
        _log_to_mlflow(run_id, tracking_uri, target, json_path, md_path, report)
    log.info("exported %s: %s", target, report["summary"])
    return ExportResult(target, report, json_path, md_path)


def _export_shape(loaded, checkpoint: str | Path, options: ExportOptions) -> tuple[ExportSpec, int]:
    """The family's export spec and the sequence length to convert at; a family without an export, or a length past
    the model's context, is a UserError."""
    kind = get_family(loaded.family).export
    if kind is None:
        raise UserError(f"checkpoint {checkpoint}: no Core ML export for the {loaded.family} family")
    context = int(getattr(loaded.model_config, kind.context))
    seq_len = options.seq_len or (max(options.seq_lens) if options.seq_lens else context)
    if max(options.seq_lens or [seq_len]) > context:
        raise UserError(f"export.seq_len={max(options.seq_lens or [seq_len])} is longer than the model's {kind.context}={context}")
    return kind, seq_len


def _convert_and_save(loaded, module, kind: ExportSpec, options: ExportOptions, seq_len: int, vocab_size: int,
                      cases: list[verify.Case], extras: Mapping[str, tuple], staged: Path, target: Path,
                      run_id: str | None, metrics: Mapping[str, float]):
    """Convert, describe and save the package at `staged`; returns (verify_and_report, write_report) of its format."""
    examples = {k: v for k, (v, _) in extras.items()}
    description = options.description or (
        f"{loaded.family} ({options.variant}) from {loaded.path.name}, step {loaded.global_step}, by sweeplab")
    metadata = _metadata(loaded, options, run_id, metrics)
    if options.format == "coreai":  # everything above is shared; the converter, the checks and the report are not
        from sweeplab.export import coreai

        converted = coreai.convert(module, kind.output, options, seq_len, vocab_size, examples, cases)
        interrupts.check()
        # the asset carries no absolute path of this machine: the checkpoint by name (the report has the path)
        metadata["sweeplab.checkpoint"] = loaded.path.name
        coreai.save(converted, staged, target, author=options.author, description=description,
                    version=options.version or str(loaded.global_step), metadata=metadata)

        def verify_and_report() -> dict:
            return coreai.verify_and_report(staged, target, loaded, options, converted, kind, seq_len, cases,
                                            run_id, module, examples, vocab_size)

        return verify_and_report, coreai.write_report
    options = with_auto_fp32_layers(options, module, kind.output, seq_len, vocab_size, cases, extras)
    converted = convert(module, kind.output, options, seq_len, vocab_size, examples)
    interrupts.check()  # a stop requested during the conversion (which cannot look at it): nothing is published
    inputs_text, outputs_text = _io_descriptions(kind, vocab_size, extras)
    describe(converted.mlmodel, author=options.author, description=description,
             version=options.version or str(loaded.global_step), metadata=metadata,
             inputs=inputs_text, outputs=outputs_text)
    save_package(converted.mlmodel, staged, target)

    def verify_and_report() -> dict:
        report = _verify_and_report(staged, target, loaded, options, converted, kind, seq_len, cases, run_id)
        report["readiness"] = _readiness(staged, module, kind.output, options, seq_len, vocab_size, cases, extras)
        return report

    return verify_and_report, reporting.write


def _verify_and_publish(verify_and_report, write_report, staging: Path, staged: Path, target: Path,
                        json_path: Path, md_path: Path) -> dict:
    """Verify the staged package and write its report; publish both only if it passed (a failure leaves the
    failed report beside the target and nothing at it). Returns the report."""
    try:
        report = verify_and_report()
    except UserError as exc:  # name the package the user asked for, not the staging copy
        raise UserError(str(exc).replace(str(staged), str(target))) from None
    staged_json, staged_md = report_paths(staged)
    write_report(report, staged_json, staged_md)
    failed_json, failed_md = (p.with_name(p.name.replace(".report.", ".failed-report.")) for p in (json_path, md_path))
    if report["status"] != "passed":
        os.replace(staged_json, failed_json)
        os.replace(staged_md, failed_md)
        raise UserError(f"{target.name}: verification failed ({report['failure']}); nothing published, see {failed_md}")
    interrupts.check()  # nor during the save or the checks
    _publish(staging, staged, target, (staged_json, json_path), (staged_md, md_path))
    for stale in (failed_json, failed_md):  # an earlier failed attempt's report no longer applies
        stale.unlink(missing_ok=True)
    return report


@contextlib.contextmanager
def _staging(target: Path) -> Iterator[Path]:
    """A temp directory beside `target` for the package and its reports, removed when the export ends; the folders
    made for it go too unless the export published into them, so a failed export leaves no empty folder behind."""
    made = [p for p in (target.parent, *target.parent.parents) if not p.exists()]  # innermost first
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    except OSError as exc:
        _remove_empty(made)
        raise UserError(f"cannot write the package into {target.parent}: {exc.strerror or exc}") from None
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_empty(made)


def check_writable_target(folder: Path) -> None:
    """Can a package be written into `folder` (made if missing)? A temp dir made and removed in its nearest existing
    folder answers with the OS's reason (read-only, full, not ours); nothing is left behind either way."""
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(existing))
        os.rmdir(tempfile.mkdtemp(prefix=".sweeplab-write-check.", dir=existing))
    except OSError as exc:
        raise UserError(f"cannot write the package into {folder}: {existing}: {exc.strerror or exc}") from None


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # holds something (the published package), or is gone: keep it and its parents
            return


def save_package(mlmodel, path: Path, shown: Path) -> None:
    """`mlmodel.save(path)`; a full or unwritable disk is one UserError naming `shown` (the package the user asked
    for). coremltools copies its package with shutil.copytree, which gathers every failed file into one shutil.Error
    of (source, destination, reason text) without an errno: the first reason is the one shown."""
    try:
        mlmodel.save(str(path))
    except shutil.Error as exc:
        failures = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
        reason = str(failures[0][2]) if failures and len(failures[0]) == 3 else str(exc)
        found = re.match(r"\[Errno (\d+)\] ([^:]+)", reason)
        raise UserError(f"cannot save {shown}: {found.group(2) if found else reason}") from None
    except OSError as exc:
        if (os_error := environment_error(exc)) is None:
            raise
        raise UserError(f"cannot save {shown}: {os_error.strerror}") from None


def _cases(loaded, kind: ExportSpec, options: ExportOptions, vocab_size: int, seq_lens: list[int]) -> list[verify.Case]:
    """Random and real token inputs; each case gets values of its own for the family's extra inputs."""
    if not options.verify:
        return []
    cases = verify.random_cases(vocab_size, options.batch_size, seq_lens, options.n_random, options.seed)
    if options.real_data and options.n_real:
        cases += verify.real_cases(loaded.family, options.real_data, vocab_size, options.batch_size, seq_lens, options.n_real)
    rng = np.random.default_rng(options.seed + 1)
    for case in cases:
        case.extra = {name: value for name, (value, _) in _extra_inputs(loaded, kind, options.batch_size, rng).items()}
    return cases


def _readiness(staged: Path, module, output: str, options: ExportOptions, seq_len: int, vocab_size: int,
               cases: list[verify.Case], extras: Mapping[str, tuple]) -> dict:
    """The ANE readiness report (readiness.py). An fp16 export gets an fp32 twin, converted and saved beside the
    staged package (the staging directory goes when the export ends): the true values for the fp16 range check, and
    the reference for the per-layer fp16 against fp32 difference."""
    if not options.readiness:
        return {"skipped": "export.readiness=false"}
    program = load_program(staged)
    twin = None
    if options.precision == "fp16":
        twin_options = replace(options, precision="fp32", compression="none", fp32_layers=None)
        twin_path = staged.with_name("fp32-twin" + PACKAGE_SUFFIX)
        examples = {name: value for name, (value, _) in extras.items()}
        save_package(convert(module, output, twin_options, seq_len, vocab_size, examples).mlmodel, twin_path, twin_path)
        twin = load_program(twin_path)
    placement = readiness.compute_plan_placement(staged)
    return readiness.readiness(program, twin, cases, options.verify_tolerance, placement)


def with_auto_fp32_layers(options: ExportOptions, module, output: str, seq_len: int, vocab_size: int,
                          cases: list[verify.Case], extras: Mapping[str, tuple] | None = None) -> ExportOptions:
    """`options`, with `fp32_layers=auto` replaced by the layers `auto_fp32_layers` chooses."""
    if options.fp32_layers != "auto":
        return options
    chosen = auto_fp32_layers(module, output, options, seq_len, vocab_size, cases, extras)
    return replace(options, fp32_layers=chosen)


def auto_fp32_layers(module, output: str, options: ExportOptions, seq_len: int, vocab_size: int,
                     cases: list[verify.Case], extras: Mapping[str, tuple] | None = None) -> list[str]:
    """`export.fp32_layers=auto`: a plain fp16 conversion and its readiness report (with the fp32 twin) first, in a
    directory of its own; the layers that report flags (readiness.fp32_candidates) are kept in fp32 in the export,
    whose own readiness report then says what is left. One pass: a layer that only overflows once its producer is
    kept in fp32 is named by that second report, not chosen here."""
    if not cases:
        raise UserError("export.fp32_layers=auto needs calibration inputs to find the layers: use export.verify=true")
    plain = replace(options, fp32_layers=None, compression="none", readiness=True)
    with tempfile.TemporaryDirectory(prefix="sweeplab-fp32-auto-") as scratch:
        staged = Path(scratch) / ("fp16" + PACKAGE_SUFFIX)
        extras = extras or {}  # the family's extra float inputs (the decoder's embedding), as the export passes them
        convert(module, output, plain, seq_len, vocab_size, {k: v for k, (v, _) in extras.items()}).mlmodel.save(str(staged))
        chosen = readiness.fp32_candidates(_readiness(staged, module, output, plain, seq_len, vocab_size, cases, extras))
    log.info("export.fp32_layers=auto: %s", ", ".join(chosen) if chosen else "no layer flagged; all fp16")
    return chosen


def _verify_and_report(staged: Path, target: Path, loaded, options, converted, kind, seq_len, cases, run_id) -> dict:
    program = load_program(staged)
    start = time.perf_counter()
    weights = program.weights()
    verification: dict = {
        "definition": verify.ERROR_MEASURES,
        "numerics": "reference evaluator: float32 arithmetic inside each op, outputs rounded to the program's dtypes",
        "trained_weights": verify.check_weights(weights, loaded.model, options.weight_tolerance),
        "nonfinite_constants": nonfinite_constants(program.constants()),
    }
    expected = []
    if options.verify:
        expected = verify.torch_outputs(loaded.model, cases)
        verification["reference"] = verify.compare_cases(
            program.run, kind.output, cases, expected, options.verify_tolerance
        )
    else:
        verification["reference"] = {"skipped": "export.verify=false"}
    verification["seconds"] = time.perf_counter() - start
    on_device = (
        verify.on_device(staged, kind.output, cases, expected, options.verify_tolerance)
        if cases
        else {"skipped": "export.verify=false"}
    )
    placement = verify.placement(staged)

    failures = _failures(verification, on_device)
    reference = verification["reference"]
    ops = reporting.op_histogram(program.function)
    weight_file = Path(program.weights_dir) / "weight.bin"
    summary = (
        f"rel_err {reference['rel_err']:.2e} (tolerance {reference['tolerance']:.0e})"
        if "skipped" not in reference
        else "not verified"
    )
    return {
        "package": str(target),
        "status": "failed" if failures else "passed",
        "failure": "; ".join(failures),
        "summary": summary,
        "variant": options.variant,
        "source": {
            "family": loaded.family,
            "checkpoint": str(loaded.path),
            "global_step": loaded.global_step,
            "run_id": run_id,
        },
        "options": asdict(options),
        "conversion": {
            "tracer": converted.tracer,
            "fallback_reason": converted.fallback_reason,
            "trace_s": converted.trace_s,
            "convert_s": converted.convert_s,
            "compress_s": converted.compress_s,
            "deployment_target": options.deployment_target,
            "specification_version": program.spec.specificationVersion,
            "seq_len": seq_len,
            "versions": _versions(),
        },
        "interface": reporting.interface(program.spec),
        "ops": ops,
        "weights": {
            "by_dtype": reporting.stored_weights(program.function),
            "package_bytes": reporting.package_bytes(staged),
            "weight_file_bytes": weight_file.stat().st_size if weight_file.is_file() else 0,
        },
        "verification": verification,
        "on_device": on_device,
        "placement": placement,
        "notes": reporting.notes(options, ops),
    }


def _failures(verification: dict, on_device: dict) -> list[str]:
    """What makes the export fail, one phrase each."""
    failures = []
    reference = verification["reference"]
    if "skipped" not in reference and not reference["passed"]:
        failures.append(
            f"rel_err {reference['rel_err']:.3g} > tolerance {reference['tolerance']:.3g}"
            if reference["nonfinite"] == 0
            else f"{reference['nonfinite']} NaN/Inf in the outputs"
        )
    if not verification["trained_weights"]["passed"]:
        failures.append(f"checkpoint tensors not in the package: {verification['trained_weights']['missing'][:3]}")
    if verification["nonfinite_constants"]:
        failures.append(f"non-finite constants: {verification['nonfinite_constants'][:3]}")
    if "skipped" not in on_device and not on_device["passed"]:
        failures.append(on_device.get("error") or f"Core ML prediction rel_err {on_device['rel_err']:.3g}")
    return failures


def _versions() -> dict[str, str]:
    import coremltools as ct
    import numpy as np

    return {"coremltools": ct.__version__, "torch": torch.__version__, "numpy": np.__version__}


def _publish(staging: Path, staged: Path, target: Path, *reports: tuple[Path, Path]) -> None:
    """Rename the verified package (and its reports) into place; an old export moves aside first, then goes."""
    if target.exists():
        os.replace(target, staging / "previous.mlpackage")
    os.replace(staged, target)
    for source, destination in reports:
        os.replace(source, destination)


def _log_to_mlflow(run_id: str, tracking_uri: str | None, package: Path, json_path: Path, md_path: Path, report: dict) -> None:
    try:
        uri = mlflow_store.resolve_uri(tracking_uri)
        artifact_dir = report.get("format", ARTIFACT_DIR)
        runs.log_artifacts(uri, run_id, [package, json_path, md_path], artifact_dir)
        verification = report["verification"]
        reference = verification["reference"] if "reference" in verification else verification["runtime"]  # Core AI's
        figures = {"package_mb": report["weights"]["package_bytes"] / 1e6}
        if "skipped" not in reference:
            figures |= {"rel_err": reference["rel_err"], "max_abs_err": reference["max_abs_err"]}
        verdict = None
        if "skipped" not in report.get("readiness", {"skipped": ""}):
            runs.log_dict(uri, run_id, report["readiness"],
                          f"{ARTIFACT_DIR}/{package.name.removesuffix(PACKAGE_SUFFIX)}.readiness.json")
            figures |= readiness.metrics(report["readiness"])
            verdict = report["readiness"]["verdict"][:5000]
        variant = report["variant"]
        mlflow_store.write(uri, run_id, JobRun(export_figures={(variant, k): v for k, v in figures.items()},
                                               export_verdicts={variant: verdict} if verdict is not None else None))
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"exported {package}, but logging it to MLflow run {run_id} failed: {first[:200]}") from None


def export_after_training(
    export_cfg: Mapping | None,
    ckpt_path: str,
    out_dir: Path,
    mlflow_run_id: str | None,
    tracking_uri: str | None,
) -> Path | None:
    """The training app's hook: export the job's best checkpoint into `out_dir` when `export=coreml`.

    Returns the package path, or None for `export=none`. Final validation metrics come from the MLflow run.
    """
    options = options_from_config(export_cfg)
    if not options.enabled:
        return None
    metrics = None
    if mlflow_run_id:
        try:
            metrics = _val_metrics(mlflow_store.read_run(mlflow_store.resolve_uri(tracking_uri), mlflow_run_id).metrics)
        except Exception as exc:  # metadata only: the export goes on with the checkpoint's own best score
            log.warning("could not read the metrics of MLflow run %s: %s", mlflow_run_id, exc)
    result = export_checkpoint(
        ckpt_path, options, out_dir, run_id=mlflow_run_id, tracking_uri=tracking_uri, metrics=metrics
    )
    return result.package


__all__ = [
    "ExportResult",
    "checkpoint_from_run",
    "export_after_training",
    "export_checkpoint",
    "options_from_config",
    "package_path",
    "report_paths",
]
