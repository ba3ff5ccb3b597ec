// The "Silent errors" tree as plain data: what each row shows and where clicking it goes. Pure: no 'vscode'
// import (src/tree.ts turns these nodes into TreeItems), so the unit tests check it directly.
import { baseName, formatLocation, formatRatio, formatSuspectDetail, formatSuspectLabel, suspectName } from "./format";
import type { Report, ReportUpdated, Suspect } from "./protocol";

/** A source location; `line` is 1-based as in report.json (the editor's line is `line - 1`). */
export interface SourceLocation {
  file: string;
  line: number;
}

export type NodeKind = "suspect" | "class" | "callSite" | "forward" | "module" | "reference" | "evidence" | "info";

export interface SuspectNode {
  kind: NodeKind;
  /** Stable id within one report (TreeItem.id). */
  id: string;
  label: string;
  description?: string;
  tooltip?: string;
  /** Where a click goes (none: the row only shows information). */
  location?: SourceLocation;
  /** ThemeIcon id. */
  icon: string;
  /** Screen-reader label (also what the e2e test reads). */
  ariaLabel: string;
  jobId: string;
  suspect?: Suspect;
  children: SuspectNode[];
}

function location(file: string | null | undefined, line: number | null | undefined): SourceLocation | undefined {
  if (typeof file !== "string" || file === "" || typeof line !== "number" || !Number.isInteger(line) || line < 1) {
    return undefined;
  }
  return { file, line };
}

/** The suspect's class definition, where a click on the suspect opens the editor. */
export function classLocation(s: Suspect): SourceLocation | undefined {
  return location(s.target.file, s.target.line);
}

/** Where the suspect module is called from (the parent's forward). */
export function callSiteLocation(s: Suspect): SourceLocation | undefined {
  return location(s.target.call_file, s.target.call_line);
}

function suspectChildren(jobId: string, s: Suspect): SuspectNode[] {
  const base = `${jobId}/${s.rank}`;
  const kids: SuspectNode[] = [];
  const cls = classLocation(s);
  if (cls !== undefined) {
    kids.push({
      kind: "class", id: `${base}/class`, label: `class ${s.target.class || s.target.module}`,
      description: formatLocation(cls.file, cls.line), tooltip: formatLocation(cls.file, cls.line, true),
      location: cls, icon: "symbol-class", ariaLabel: `class definition ${formatLocation(cls.file, cls.line)}`,
      jobId, suspect: s, children: [],
    });
  }
  const call = callSiteLocation(s);
  if (call !== undefined) {
    kids.push({
      kind: "callSite", id: `${base}/call`, label: "called from", description: formatLocation(call.file, call.line),
      tooltip: formatLocation(call.file, call.line, true), location: call, icon: "call-outgoing",
      ariaLabel: `call site ${formatLocation(call.file, call.line)}`, jobId, suspect: s, children: [],
    });
  }
  const fwd = location(s.target.forward_file, s.target.forward_line);
  if (fwd !== undefined && fwd.file === s.target.file) {
    kids.push({
      kind: "forward", id: `${base}/forward`, label: "forward()", description: formatLocation(fwd.file, fwd.line),
      tooltip: formatLocation(fwd.file, fwd.line, true), location: fwd, icon: "symbol-method",
      ariaLabel: `forward ${formatLocation(fwd.file, fwd.line)}`, jobId, suspect: s, children: [],
    });
  }
  kids.push({
    kind: "module", id: `${base}/module`, label: "module", description: s.target.module, tooltip: s.target.module,
    icon: "symbol-field", ariaLabel: `module ${s.target.module}`, jobId, suspect: s, children: [],
  });
  const refs = s.reference?.modules ?? [];
  kids.push({
    kind: "reference", id: `${base}/reference`, label: "reference", description: refs.length ? refs.join(", ") : "none",
    tooltip: refs.length ? `Compared with the reference module(s) ${refs.join(", ")}` : "No reference module",
    icon: "references", ariaLabel: `reference ${refs.join(", ") || "none"}`, jobId, suspect: s, children: [],
  });
  const inputRatio = s.input_ratio === undefined || s.input_ratio === null ? "" : `, input ratio ${formatRatio(s.input_ratio)}×`;
  kids.push({
    kind: "evidence", id: `${base}/evidence`, label: "evidence",
    description: `error ratio ${formatRatio(s.error_ratio)}×${inputRatio}`, tooltip: s.evidence ?? "",
    icon: "info", ariaLabel: `evidence: ${s.evidence ?? ""}`, jobId, suspect: s, children: [],
  });
  return kids;
}

/** One node per suspect, best rank first; none for a consistent run. */
export function suspectNodes(update: Pick<ReportUpdated, "jobId" | "report">): SuspectNode[] {
  const { jobId, report } = update;
  const suspects = [...(report.suspects ?? [])].sort((a, b) => a.rank - b.rank);
  return suspects.map((s) => {
    const cls = classLocation(s);
    const where = cls !== undefined ? formatLocation(cls.file, cls.line, true) : "source unknown";
    const evidence = s.evidence ? `\n\n${s.evidence}` : "";
    return {
      kind: "suspect",
      id: `${jobId}/${s.rank}`,
      label: `#${s.rank} ${suspectName(s)}`,
      description: formatSuspectDetail(s),
      tooltip: `${s.target.module} (${s.target.class}) — ${where}${evidence}`,
      location: cls,
      icon: s.rank === 1 ? "error" : s.rank === 2 ? "warning" : "info",
      ariaLabel: formatSuspectLabel(s),
      jobId,
      suspect: s,
      children: suspectChildren(jobId, s),
    };
  });
}

/** The line above the tree (TreeView.message): the verdict and what was diagnosed. */
export function treeMessage(update: Pick<ReportUpdated, "report" | "uri"> | undefined): string | undefined {
  if (update === undefined) {
    return undefined;
  }
  const r: Report = update.report;
  const what = update.uri ? ` · ${baseName(decodeURIComponent(update.uri))}` : "";
  switch (r.verdict) {
    case "divergent": {
      const n = r.suspects.length;
      return `Divergent: ${n} suspect${n === 1 ? "" : "s"}, most likely root cause first${what}`;
    }
    case "consistent":
      return `Consistent: no component departs from the reference beyond the threshold (${r.threshold ?? "?"})${what}`;
    case "inputs-differ":
      return `Inputs differ: the token ids differ before the model runs (BOS, chat template?)${what}`;
    default:
      return `${String(r.verdict)}${what}`;
  }
}

/** Finds the suspect a `{jobId, module}` (code lens) or `{rank}` argument names in a report. */
export function findSuspect(report: Report, module?: string, rank?: number): Suspect | undefined {
  return report.suspects.find(
    (s) => (module !== undefined && s.target.module === module) || (rank !== undefined && s.rank === rank),
  );
}
