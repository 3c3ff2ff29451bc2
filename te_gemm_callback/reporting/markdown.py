"""report.md: an analysed run's report as GitHub-flavoured Markdown, every outside string escaped; it starts with
:data:`MD_MARKER`, and an existing report.md without it is the user's, never overwritten."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from te_gemm_callback.files.jsonio import text_kind, write_text
from te_gemm_callback.printable import plain
from te_gemm_callback.reporting import projection_tables
from te_gemm_callback.reporting.capture_tables import capture_share, top_gemm_rows
from te_gemm_callback.reporting.report_tables import (
    job_head,
    plan_line,
    replay_own_line,
    speedup_rows,
    speedup_title,
    withheld_reasons,
)

if TYPE_CHECKING:
    from te_gemm_callback.analysis.runs import RunReport
    from te_gemm_callback.analysis.verdicts import Report

# The first line of every report.md we write, an HTML comment (renderers show nothing of it).
MD_MARKER_PREFIX = "<!-- te-gemm-callback report.md"
MD_MARKER = (f"{MD_MARKER_PREFIX}: written from this run folder (the callback's report, te-gemm report or "
             "te_gemm_callback.report); every report replaces it, so edits here are lost -->")
MD_KIND = text_kind("te-gemm report.md", MD_MARKER_PREFIX.encode())

# Characters with a meaning anywhere in a line of GFM (a lone ">" is text), then at the start of one.
_INLINE = re.compile(r"([\\`*_\[\]<|~&$])")
_LEADING = re.compile(r"^(?:([#+=>-])|(\d+)([.)]))")
# How the figures a report draws are titled in report.md (gemm_<mode>: one per bench mode; speedups: its own).
FIGURE_TITLES = {"step_split": "Step time split",
                 "ranks": "Per-rank step: GEMM, exposed communication, rest"}
TOP_GEMMS = 10


def md_escape(text: Any, line_start: bool = False) -> str:
    """``text`` shown literally on one line; with ``line_start``, also what would open a heading or a list."""
    s = _INLINE.sub(r"\\\1", plain(" ".join(str(text).split())))
    if line_start:
        s = _LEADING.sub(lambda m: "\\" + m.group(1) if m.group(1) else m.group(2) + "\\" + m.group(3), s)
    return s


def md_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], right: Iterable[int] = ()) -> list[str]:
    """A GFM table, every cell escaped; ``right``: the columns aligned right."""
    right = set(right)
    out = ["| " + " | ".join(md_escape(c) for c in columns) + " |",
           "| " + " | ".join("---:" if i in right else ":---" for i in range(len(columns))) + " |"]
    for row in rows:
        cells = [md_escape(c) for c in row] + [""] * (len(columns) - len(row))
        out.append("| " + " | ".join(cells[:len(columns)]) + " |")
    return out


def code_block(lines: Iterable[str], lang: str = "") -> list[str]:
    """A fenced code block, its fence longer than any run of backticks in ``lines``."""
    body = [plain(ln) for ln in lines]
    runs = [len(r) for ln in body for r in re.findall(r"`+", ln)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return [fence + lang, *body, fence]


def link_target(path: Path, root: Path) -> str:
    """``path`` as a relative, percent-encoded link from a file in ``root``."""
    try:
        rel = os.path.relpath(path, root)
    except ValueError:  # another drive (Windows): the name, since our files lie in root
        rel = Path(path).name
    return quote(Path(rel).as_posix())


def _verdicts(rr: RunReport) -> list[str]:
    rep, out = rr.report, ["## Verdicts", ""]
    if (own := replay_own_line(rep)) is not None:
        out += [md_escape(own, line_start=True), ""]
    for a in rep.recipes:
        if a.recipe == "BF16":
            continue
        out.append(f"- **{md_escape(a.recipe)}**: {md_escape(a.verdict)}")
        # A list item's text is a line of its own to Markdown: "- # x" would be a heading in it.
        out += [f"  - {md_escape(e, line_start=True)}" for e in a.evidence]
    for r, why in rep.skipped.items():
        out.append(f"- **{md_escape(r)}**: not available here — {md_escape(why)}")
    if not any(a.recipe != "BF16" for a in rep.recipes) and not rep.skipped:
        out.append("- only BF16 was measured")
    if rr.plan is not None:
        out += ["", md_escape(plan_line(rr.plan), line_start=True)]
    return out


def _speedups(rr: RunReport) -> list[str]:
    s = speedup_rows(rr.report)
    rows = [[*row, a.verdict] for row, a in zip(s.rows, rr.report.recipes)]
    rows += [[r, "not run", *[""] * (len(s.columns) - 2), "not available here"] for r in s.skipped]
    return ["## Speedups", "", md_escape(s.title, line_start=True), "",
            *md_table([*s.columns, "verdict"], rows, right=range(1, len(s.columns))), "",
            md_escape(s.explained + ".", line_start=True)]


def _capture(rr: RunReport) -> list[str]:
    cap = rr.job
    cols, rows, more = top_gemm_rows(cap, TOP_GEMMS)
    what = f"{cap.meta.get('device', '?')}: {len(cap.records)} GEMM records over {len(cap.steps)} captured step(s)"
    share = capture_share(cap)
    out = ["## Capture: top GEMMs by time", "", md_escape(what + (f"; {share}" if share else ""), line_start=True),
           ""]
    if more:
        rows.append([f"... {more} more", "", "", "", "", ""])
    if not any(r.times_ms for r in cap.records):
        out += ["Not timed (no per-call GEMM times): the GEMMs with the most FLOPs per step.", ""]
    return out + md_table(cols, rows, right=(4, 5)) + _capture_conditions(cap)


def _capture_conditions(cap: Any) -> list[str]:
    """What a reader of the capture's numbers should know about its steps."""
    m = cap.meta
    lines = []
    if m.get("compiled"):
        mods = ", ".join(m.get("compiled_modules") or []) or "the model"
        lines.append(f"torch.compile: {mods}; shapes from their eager forward on the instrumented steps, step times "
                     "from the compiled code")
    if m.get("steady_state") and not str(m["steady_state"]).startswith("reached"):
        lines.append(f"steady state {m['steady_state']}")
    if m.get("cupti_owner"):
        timed = "CUDA events" if m.get("gemm_time_source") == "cuda_events" else "nothing"
        lines.append(f"{m['cupti_owner']} held CUPTI during the capture: GEMMs timed by {timed}, no kernel timeline")
    lines += _event_pair_notes(m.get("event_pairs") or {})
    kinds = [s.kind for s in cap.steps]
    if kinds and "clean" not in kinds:
        lines.append(f"no clean step was captured (steps: {', '.join(kinds)}): training ended inside the window, or "
                     "it was too short; the step time includes the capture's instruments")
    return ["", *[f"- {md_escape(x)}" for x in lines]] if lines else []


def _event_pair_notes(pairs: Mapping[str, Any]) -> list[str]:
    """What a reader of event-timed GEMMs should know (``meta.event_pairs``)."""
    out = []
    if only := pairs.get("dispatch_steps_only"):
        shown = ", ".join(only[:6]) + (f" and {len(only) - 6} more" if len(only) > 6 else "")
        out.append(f"{shown}: timed on the dispatch-mode steps only (a slow host, the GPU waiting between GEMMs): "
                   "the least certain GEMM times here")
    if pairs.get("dropped"):
        out.append(f"{pairs['dropped']} event pair(s) dropped: their GPU gate gave up before the host launched "
                   "the GEMM (the host synchronized inside the bracket); those steps have no GEMM total")
    if pairs.get("lead") and "spin" in pairs["lead"]:
        some = "some event pairs" if "gate" in pairs["lead"] else "event pairs"
        out.append(f"{some} behind a 50 us spin, not the GPU gate (no gate could be built: see the log): a host "
                   "slower than that adds its launch time to small GEMMs' times")
    if pairs.get("below_floor"):
        out.append(f"{pairs['below_floor']} GEMM call(s) shorter than the event pairs' floor (~1 us): not timed")
    return out


def _figures(files: Mapping[str, Path], root: Path, rep: Report) -> list[str]:
    out = []
    # speedups.png's title is the figure's own: without a replay it shows no predicted step.
    titles = {**FIGURE_TITLES, "speedups": speedup_title(rep)}
    for key, path in files.items():
        if Path(path).suffix.lower() == ".png":
            title = md_escape(f"GEMM time per step by precision ({key[5:]} microbenchmarks)" if key.startswith("gemm_")
                              else titles.get(key, key))
            out += ["", f"**{title}**", "", f"![{title}]({link_target(path, root)})"]
    return ["## Figures", *out] if out else []


def _trace(files: Mapping[str, Path], root: Path) -> list[str]:
    if "trace" not in files:
        return []
    return ["## Kernel timeline", "",
            f"[{md_escape(Path(files['trace']).name)}]({link_target(files['trace'], root)}): the capture's kernels on "
            "a timeline; open it in <https://ui.perfetto.dev> or chrome://tracing (load the file there)."]


def _checks(rr: RunReport) -> list[str]:
    rep = rr.report
    lines = [f"- check: {md_escape(w)}" for w in rep.warnings]
    lines += [f"- warning: {md_escape(rep.meta[k])}" for k in rr.host_bound_notes if rep.meta.get(k)]
    return ["## Checks and warnings", "",
            "What the report's checks found and will not state as a result; read it before any figure it touches.",
            "", *lines] if lines else []


def _notes(rr: RunReport) -> list[str]:
    from rich.text import Text
    rep, meta = rr.report, rr.report.meta
    labelled = (("Instrument cost", "step_note"), ("Instrument cost", "job_step_note"), ("Framework", "framework_note"),
                ("Clock", "clock_note"), ("GEMM duty", "duty_note"), ("Timing", "timing"), ("Prediction", "prediction"),
                ("No prediction", "no_replay"))
    shown = {meta.get(k) for k in rr.host_bound_notes}  # already among the warnings (_checks)
    lines = [f"- {label}: {md_escape(meta[k])}" for label, k in labelled if meta.get(k) and meta[k] not in shown]
    lines += [f"- n/a: {md_escape(why)}" for why in withheld_reasons(rep)]
    if rr.bench is not None:
        from te_gemm_callback.reporting.bench_tables import run_summary  # loads torch: not at this import
        lines.append(f"- Microbenchmark: {md_escape(Text.from_markup(run_summary(rr.bench)).plain)}")
    return ["## Notes", "", *lines] if lines else []


def _job_capture(root: Path) -> Path:
    """The capture the report's job was read from, as analyze_run picks it: the first outside sweep/."""
    paths = sorted(root.rglob("gemm_capture.json"))
    main = [p for p in paths if "sweep" not in p.relative_to(root).parts]
    return (main or paths or [root / "gemm_capture.json"])[0]


def _bench_commands(rr: RunReport, root: Path) -> list[str]:
    q = shlex.quote
    capture, bench_json = q(str(_job_capture(root))), q(str(root / "bench.json"))
    again = f"te-gemm report {q(str(root))}"
    if rr.bench is None:
        return ["No bench.json here: microbenchmark the job's shapes (on the machine the job ran on) for predictions "
                "and GEMM speedups, then report again:", "",
                *code_block([f"te-gemm bench --capture {capture} --json {bench_json}", again], "sh")]
    m = rr.bench.meta
    # The recipes asked for: those measured and those this host could not run (a GPU host may).
    ran = m["precisions"] if isinstance(m.get("precisions"), list) else rr.bench.precisions
    precisions = list(dict.fromkeys(str(p) for p in [*ran, *rr.bench.skipped]))
    modes = [mode for mode in (m.get("modes") or ["autocast"]) if isinstance(mode, str)]
    opts = [f"--precisions {q(','.join(precisions))}"] if precisions else []
    if m.get("gemm_duty") is not None and m.get("backend") == "te":
        opts.append(f"--gemm-duty {m['gemm_duty']:g}")
    if m.get("visits"):
        opts.append(f"--visits {int(m['visits'])}")
    if m.get("flush_l2"):
        opts.append("--flush-l2")
    if len(m.get("visits_per_device") or []) > 1:
        opts.append(f"--devices {len(m['visits_per_device'])}")
    # --modes always: the bench file --json replaces would otherwise pick them; --no-cache: measured again.
    cmd = " ".join(["te-gemm bench --capture", capture, *opts, "--modes", q(",".join(modes)), "--no-cache",
                    "--json", bench_json])
    return ["Measure the microbenchmarks again (on the machine the job ran on), then make the report again:", "",
            *code_block([cmd, again], "sh")]


# Capture meta fields that say where a capture came from, in the order shown.
PROVENANCE = ("command", "argv", "cwd", "host", "created", "model", "device", "compute_capability", "torch",
              "cuda", "transformer_engine", "python", "adapters", "git_commit", "run_id")


def _provenance(meta: Mapping[str, Any]) -> list[str]:
    fields = dict(prov) if isinstance(prov := meta.get("provenance"), Mapping) else {}
    for key in PROVENANCE:
        if meta.get(key) not in (None, "", []):
            fields.setdefault(key, meta[key])
    command, argv = fields.pop("command", None), fields.pop("argv", None)
    command = command or argv
    lines = [f"- {md_escape(prov, line_start=True)}"] if isinstance(prov, str) else []
    for key, value in fields.items():
        if isinstance(value, (list, tuple)):
            value = ", ".join(map(str, value))
        lines.append(f"- {md_escape(key)}: {md_escape(value)}")
    if command:
        text = shlex.join(map(str, command)) if isinstance(command, (list, tuple)) else str(command)
        lines += ["- command:", "", *["  " + ln for ln in code_block(text.splitlines() or [""], "sh")]]
    return lines


def _commands(rr: RunReport, root: Path) -> list[str]:
    out = ["## Commands", "", "Make this report again from the run folder (no GPU needed):", "",
           *code_block([f"te-gemm report {shlex.quote(str(root))}"], "sh"), "",
           f"or from Python: `te_gemm_callback.report({_py_str(root)})`.", "", *_bench_commands(rr, root)]
    prov = _provenance(rr.job.meta)
    if prov:
        capture = _job_capture(root)
        link = f"[{md_escape(capture.name)}]({link_target(capture, root)})"
        out += ["", f"The job's capture ({link}) records:", "", *prov]
    return out


def _py_str(root: Path) -> str:
    """A Python string literal of the path, fit for a code span (no backtick can end it early)."""
    return plain(repr(str(root))).replace("`", "\\x60")


def _projections(rr: RunReport, files: Mapping[str, Path]) -> list[list[str]]:
    """A section per GPU the run was projected onto, labelled as such."""
    out = []
    for rp in rr.projections:
        head = f"## {'Measured on' if rp.measured else 'Projected onto'} {md_escape(rp.target.name)}"
        what = "." if rp.measured else (". Not measured: public peaks and bandwidths, this run's bench and a "
                                        "quantization traffic model (method and validation: docs/projection.md).")
        lines = [head, "", md_escape(projection_tables.title(rp) + what, line_start=True), "",
                 *md_table(projection_tables.COLUMNS, projection_tables.rows(rp),
                           right=range(1, len(projection_tables.COLUMNS))), "",
                 *[f"- {md_escape(n)}" for n in rp.notes]]
        written = files.get(f"projection_{rp.target.key}")
        if written is not None:
            lines.append(f"- every cell, its band and its basis: [{md_escape(written.name)}]({quote(written.name)})")
        out.append(lines)
    return out


def report_markdown(rr: RunReport, files: Mapping[str, Path], root: str | Path) -> str:
    """report.md's text (no :data:`MD_MARKER`), linking the figures and trace among ``files`` in ``root``."""
    root = Path(root)
    rep = rr.report
    name = root.resolve().name or str(root)
    head = [f"# GEMM report: {md_escape(name)}", "",
            md_escape(f"{rep.meta.get('device') or 'unknown device'}; {job_head(rep)}.", line_start=True)]
    sections = [head, _checks(rr), _verdicts(rr), _speedups(rr), *_projections(rr, files), _capture(rr),
                _figures(files, root, rr.report), _trace(files, root), _notes(rr), _commands(rr, root)]
    return "\n\n".join("\n".join(s) for s in sections if s) + "\n"


def write_report_md(rr: RunReport, path: str | Path, files: Mapping[str, Path], root: str | Path) -> Path:
    """Write report.md atomically, over an existing file only if it is ours (:data:`MD_KIND`, else ValueError)."""
    return write_text(path, f"{MD_MARKER}\n\n{report_markdown(rr, files, root)}", MD_KIND)
