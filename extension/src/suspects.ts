// The "Silent errors" tree as plain data: what each row shows and where clicking it goes. Pure: no 'vscode'
// import (src/tree.ts turns these nodes into TreeItems), so the unit tests check it directly.
import { COVERAGE_NOT_SENT, COVERAGE_NOT_SENT_WHY, type CoverageKey, type ShownSection, coverage, coverageLine } from "./coverage";
import { baseName, formatLocation, formatRatio, formatSuspectDetail, suspectName } from "./format";
import type {
  CheckRecord, GraphLocalisation, Report, ReportUpdated, Serving, Suspect, SymptomCheck, Trial,
} from "./protocol";

/** A source location; `line` is 1-based as in report.json (the editor's line is `line - 1`). */
export interface SourceLocation {
  file: string;
  line: number;
}

export type NodeKind =
  | "suspect"
  | "class"
  | "callSite"
  | "forward"
  | "module"
  | "reference"
  | "evidence"
  | "info"
  | "serving"
  | "servingCulprit"
  | "servingTrials"
  | "servingTrial"
  | "servingChanges"
  | "servingChange"
  | "verdict"
  | "row"
  | "graphNode"
  | "compilerStage"
  | "coverage"
  | "coverageItem";

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
  /** ThemeColor id of the icon (default: "error" and "warning" icons in the list's error/warning colour). */
  iconColor?: string;
  /** Screen-reader label (also what the e2e test reads). */
  ariaLabel: string;
  jobId: string;
  suspect?: Suspect;
  children: SuspectNode[];
  /** Shown expanded at first (default: the rank-1 suspect only). */
  expanded?: boolean;
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

/** The finding in one line as the report words it (`summary`, ekka_core/report/findings.py), after the kind when
 * it is not a plain module; a report from before `summary` gets its ratio and onset token. */
export function suspectDescription(s: Suspect): string {
  if (!s.summary) return formatSuspectDetail(s);
  const kind = s.kind ?? "module";
  return kind === "module" ? s.summary : `${kind}: ${s.summary}`;
}

/** The rows (request, token position) a "rows" or "non-finite" finding names, one child each. */
function rowNodes(jobId: string, s: Suspect): SuspectNode[] {
  if (s.kind !== "rows" && s.kind !== "non-finite") return [];
  return (s.rows ?? []).map((r, i): SuspectNode => {
    const label = `request ${r.request}, token ${r.position}`;
    const description = s.kind === "non-finite" ? "NaN/Inf where the reference is finite" : `ratio ${formatRatio(r.ratio)}×`;
    return {
      kind: "row", id: `${jobId}/${s.rank}/rows/${i}`, label, description, tooltip: `${s.target.module}: ${label} — ${description}`,
      icon: s.kind === "non-finite" ? "warning" : "debug-stackframe-dot", ariaLabel: `${label}: ${description}`, jobId,
      suspect: s, children: [],
    };
  });
}

/** A "compiled" finding's children: one per graph node whose compiled code departs (a click opens the engine line it
 * was traced from), then the compiler stage whose removal brings it back within noise (the first of
 * `compiler_stages`), or a row saying no single stage tried turns it off (the stages tried from `graph`). */
function compiledNodes(jobId: string, s: Suspect, graph?: GraphLocalisation | null): SuspectNode[] {
  if (s.kind !== "compiled") return [];
  const base = `${jobId}/${s.rank}`;
  const kids = (s.graph_nodes ?? []).map((n, i): SuspectNode => {
    const at = location(n.file, n.line);
    const where = at !== undefined ? formatLocation(at.file, at.line) : "source unknown";
    const full = at !== undefined ? formatLocation(at.file, at.line, true) : "source unknown";
    const label = `graph node ${n.node}`;
    const tooltip = [
      `${n.node} (${n.op}) — ${full}`,
      n.code ? n.code : "",
      n.module ? `traced from module ${n.module}` : "",
      "Its compiled code departs from the same graph run eagerly.",
    ];
    return {
      kind: "graphNode", id: `${base}/graph/${i}`, label, description: `${n.op} · ${where}`,
      tooltip: tooltip.filter(Boolean).join("\n"), location: at, icon: "symbol-operator",
      ariaLabel: `${label}: ${n.op} at ${where}`, jobId, suspect: s, children: [],
    };
  });
  const stage = s.compiler_stages?.[0];
  if (stage !== undefined) {
    const description = `${stage.stage} ${stage.name}`;
    const others = (s.compiler_stages ?? []).slice(1).map((f) => `also: ${f.stage} ${f.name} — ${f.words}`);
    kids.push({
      kind: "compilerStage", id: `${base}/stage`, label: "compiler stage", description,
      tooltip: [stage.words, `error ratio without it ${formatRatio(stage.ratio_without)}×`, ...others].join("\n"),
      icon: "tools", ariaLabel: `compiler stage ${description}: ${stage.words}`, jobId, suspect: s, children: [],
    });
  } else {
    const tried = graph?.tried_toggles ?? [];
    const label = "no single compiler stage turns it off";
    kids.push({
      kind: "compilerStage", id: `${base}/stage`, label,
      tooltip: tried.length ? `Tried:\n${tried.map((t) => `• ${t}`).join("\n")}` : "No compiler stage was found whose removal " +
        "brings it back within noise.",
      icon: "circle-slash", ariaLabel: label, jobId, suspect: s, children: [],
    });
  }
  return kids;
}

/** One node per suspect, best rank first; none for a consistent run. */
export function suspectNodes(update: Pick<ReportUpdated, "jobId" | "report">): SuspectNode[] {
  const { jobId, report } = update;
  const suspects = [...(report.suspects ?? [])].sort((a, b) => a.rank - b.rank);
  return suspects.map((s) => {
    const cls = classLocation(s);
    const where = cls !== undefined ? formatLocation(cls.file, cls.line, true) : "source unknown";
    const finding = s.summary ? `\n\n${s.kind ?? "module"}: ${s.summary}` : "";
    const evidence = s.evidence ? `\n\n${s.evidence}` : "";
    const label = `#${s.rank} ${suspectName(s)}`;
    const description = suspectDescription(s);
    return {
      kind: "suspect",
      id: `${jobId}/${s.rank}`,
      label,
      description,
      tooltip: `${s.target.module} (${s.target.class}) — ${where}${finding}${evidence}`,
      location: cls,
      icon: s.rank === 1 ? "error" : s.rank === 2 ? "warning" : "info",
      ariaLabel: `${label} · ${description}`,
      jobId,
      suspect: s,
      children: [...suspectChildren(jobId, s), ...rowNodes(jobId, s), ...compiledNodes(jobId, s, report.graph)],
    };
  });
}

/** An engine argument's value as the tree shows it (JSON: `true`, `64`, `["none"]`); unset when absent. */
export function formatArgValue(v: unknown): string {
  if (v === undefined || v === null) return "unset";
  if (typeof v === "string") return v;
  try {
    return JSON.stringify(v);
  } catch {
    return String(v);
  }
}

/** Engine arguments in one line, without the model path and seed (the same for every configuration). */
export function formatArgs(args: Record<string, unknown> | null | undefined): string {
  const shown = Object.entries(args ?? {}).filter(([k]) => k !== "model" && k !== "seed");
  return shown.length ? shown.map(([k, v]) => `${k}=${formatArgValue(v)}`).join(", ") : "the engine's defaults";
}

function checkState(c: SymptomCheck): string {
  return `${c.diverges ? "diverges" : "consistent"} (ratio ${formatRatio(c.ratio)}×)`;
}

function checkDetail(c: SymptomCheck): string {
  const first = c.first ? `; first at request ${c.first.request}, token ${c.first.position}` : "";
  const cached = c.cached_tokens ? `; ${c.cached_tokens} prompt tokens from the prefix cache` : "";
  const thr = c.threshold !== undefined ? ` (threshold ${c.threshold})` : "";
  return `${c.label}: ${c.diverges ? "diverges from" : "matches"} the reference at the logits level, ratio ` +
    `${formatRatio(c.ratio)}×${thr}${first}${cached}${c.note ? ` — ${c.note}` : ""}`;
}

/** Seconds as the trial rows show them: one decimal below 10 s ("7.7"), whole seconds from 10 s on ("10"). */
function formatSeconds(s: number): string {
  const r = Math.round(s * 10) / 10;
  return r >= 10 ? String(Math.round(s)) : r.toFixed(1);
}

function mark(diverges: boolean | null | undefined): string {
  return diverges === true ? "diverges ✓" : diverges === false ? "diverges ✗" : "diverges ?";
}

function trialNode(jobId: string, id: string, label: string, t: Trial, culprit: boolean): SuspectNode {
  const failed = typeof t.error === "string" && t.error !== "";
  const secs = typeof t.seconds === "number" && t.seconds > 0 ? ` · ${formatSeconds(t.seconds)} s` : "";
  const description = failed
    ? `could not run${secs}`
    : `${formatRatio(t.ratio)}× · ${mark(t.diverges)}${secs}${culprit ? " · culprit" : ""}`;
  const outcome = failed
    ? `could not run: ${t.error}`
    : `logits-level ratio ${formatRatio(t.ratio)}× — ${t.diverges ? "diverges" : "matches the reference"}`;
  const graph = t.compiled_graph === "loaded" ? "compiled graph: loaded from vLLM's compile cache"
    : t.compiled_graph === "compiled" ? "compiled graph: compiled in this trial" : "";
  const tooltip = [
    `${label}: ${outcome}${secs ? ` (${secs.slice(" · ".length)})` : ""}`,
    culprit ? "The culprit: the smallest set of served features that makes the difference." : "",
    t.args ? `engine arguments: ${formatArgs(t.args)}` : "",
    graph,
  ];
  return {
    kind: "servingTrial", id: `${jobId}/serving/trials/${id}`, label, description,
    tooltip: tooltip.filter(Boolean).join("\n"),
    icon: failed ? "warning" : t.diverges ? "error" : "pass",
    ariaLabel: `${label}: ${description}`, jobId, children: [],
  };
}

function checkRow(
  jobId: string,
  id: string,
  label: string,
  c: SymptomCheck,
  args?: Record<string, unknown> | null,
): SuspectNode {
  const description = `${formatRatio(c.ratio)}× · ${mark(c.diverges)}`;
  return {
    kind: "servingTrial", id: `${jobId}/serving/trials/${id}`, label, description,
    tooltip: checkDetail(c) + (args ? `\nengine arguments: ${formatArgs(args)}` : ""),
    icon: c.diverges ? "error" : "pass", ariaLabel: `${label}: ${description}`, jobId, children: [],
  };
}

const sameSet = (a: string[], b: string[]) =>
  a.length === b.length && [...a].sort().join("\n") === [...b].sort().join("\n");

/**
 * The "Served configuration" node (above the suspects) of a report with a `serving` section: the served run's
 * symptom check, configuration triage's culprit in words, the configurations it tried, and what Ekka changed to
 * trace. None for a report without one (older reports, targets without a served-configuration check).
 */
export function servingNodes(update: Pick<ReportUpdated, "jobId" | "report">): SuspectNode[] {
  const { jobId } = update;
  const serving: Serving | null | undefined = update.report.serving;
  if (serving === null || typeof serving !== "object") return [];
  const base = `${jobId}/serving`;
  const served = serving.served ?? serving.triage?.served ?? undefined;
  const triage = serving.triage ?? undefined;
  const kids: SuspectNode[] = [];
  const tracedUnder = triage?.traced_under ?? [];
  if (triage?.words) {
    const culprit = triage.culprit ?? [];
    const extra = [
      culprit.length ? `Culprit: ${culprit.join(", ")}.` : "",
      tracedUnder.length ? `The suspects were traced again with ${tracedUnder.join(", ")} as served.` : "",
      triage.untraceable?.length ? `Hooks cannot see into ${triage.untraceable.join(", ")}.` : "",
    ].filter(Boolean);
    kids.push({
      kind: "servingCulprit", id: `${base}/culprit`, label: triage.words,
      tooltip: [triage.words, ...extra].join("\n"), icon: "lightbulb",
      ariaLabel: `configuration triage: ${triage.words}`, jobId, children: [],
    });
  }
  if (triage) {
    const culprit = triage.culprit ?? [];
    const rows: SuspectNode[] = [];
    const servedCheck = triage.served ?? serving.served;
    const baseline = triage.baseline ?? serving.traced;
    if (servedCheck) rows.push(checkRow(jobId, "served", "served configuration", servedCheck, serving.served_args));
    if (baseline) rows.push(checkRow(jobId, "baseline", "traced baseline", baseline, serving.traced_args));
    (triage.trials ?? []).forEach((t, i) => {
      const factors = Array.isArray(t.factors) ? t.factors : [];
      const label = `baseline + ${factors.length ? factors.join(", ") : "nothing"}`;
      rows.push(trialNode(jobId, String(i), label, t, culprit.length > 0 && sameSet(factors, culprit)));
    });
    const keptAsServed = triage.kept_as_served ?? [];
    const ruledOut = Object.entries(triage.ruled_out ?? {}).map(([f, why]) =>
      `${f}: ruled out — ${why}` + (keptAsServed.includes(f) ? "; every trial keeps its served value" : ""));
    const n = triage.trials?.length ?? 0;
    const tried = n ? `${n} trial${n === 1 ? "" : "s"}` : "served and baseline";
    kids.push({
      kind: "servingTrials", id: `${base}/trials`, label: "Configurations tried", description: tried,
      tooltip: ["Configuration triage: the traced baseline with subsets of the served features turned back on.", ...ruledOut].join("\n"),
      icon: "beaker", ariaLabel: `Configurations tried: ${tried}`, jobId, children: rows,
    });
  }
  const changes = serving.changes ?? [];
  if (changes.length) {
    const rows = changes.map((c, i): SuspectNode => {
      const label = `${c.arg}=${formatArgValue(c.traced)} (served: ${formatArgValue(c.served)})`;
      return {
        kind: "servingChange", id: `${base}/changes/${i}`, label, description: c.why, tooltip: `${label} — ${c.why}`,
        icon: "arrow-swap", ariaLabel: `${label} — ${c.why}`, jobId, children: [],
      };
    });
    kids.push({
      kind: "servingChanges", id: `${base}/changes`, label: "Changed for tracing",
      description: `${changes.length} argument${changes.length === 1 ? "" : "s"}`,
      tooltip: "What Ekka changed in the served configuration to trace it" +
        (tracedUnder.length ? ` (the suspects were traced again with ${tracedUnder.join(", ")} as served)` : "") +
        (serving.traced_args ? `\ntraced with: ${formatArgs(serving.traced_args)}` : ""),
      icon: "settings", ariaLabel: `Changed for tracing: ${changes.length} argument${changes.length === 1 ? "" : "s"}`,
      jobId, children: rows,
    });
  }
  const state = served ? checkState(served) : "not checked";
  const label = `Served configuration: ${state}`;
  const r = serving.served_resolved ?? {};
  const resolved = Object.keys(r).length
    ? `\nthe engine resolved: compile mode ${formatArgValue(r.compilation_mode)}, custom ops ${formatArgValue(r.custom_ops)}, ` +
      `prefix caching ${formatArgValue(r.enable_prefix_caching)}, chunk budget ${formatArgValue(r.max_num_batched_tokens)}, ` +
      `up to ${formatArgValue(r.max_num_seqs)} requests per step`
    : "";
  return [{
    kind: "serving", id: base, label, description: formatArgs(serving.served_args),
    tooltip: `${served ? checkDetail(served) : "The served configuration was not checked."}\nserved with: ` +
      `${formatArgs(serving.served_args)}${resolved}${triage?.words ? `\n\n${triage.words}` : ""}`,
    icon: "server-process", ariaLabel: label, jobId, children: kids, expanded: Boolean(triage?.words),
  }];
}

/** The verdict's words, icon and colour: inconclusive is a warning (it has not looked), not an error. */
const VERDICTS: Record<Report["verdict"], { label: string; icon: string; color: string }> = {
  divergent: { label: "Divergent", icon: "bug", color: "list.errorForeground" },
  "inputs-differ": { label: "Inputs differ", icon: "error", color: "list.errorForeground" },
  inconclusive: { label: "Inconclusive", icon: "warning", color: "list.warningForeground" },
  consistent: { label: "Consistent", icon: "pass", color: "testing.iconPassed" },
};

/** The first row: the verdict and how much was compared (the server's `coverageLine`, coverage.py `coverage_line`). */
export function verdictNode(update: Pick<ReportUpdated, "jobId" | "report" | "headline" | "coverageLine">): SuspectNode {
  const { jobId, report } = update;
  const v = VERDICTS[report.verdict] ?? { label: String(report.verdict), icon: "question", color: "list.warningForeground" };
  const label = `Verdict: ${v.label.toLowerCase()}`;
  const description = coverageLine(update);
  const why = report.verdict === "inconclusive"
    ? ["The diagnosis could not observe what a verdict needs:", ...(report.missing ?? []).map((m) => `• ${m}`)]
    : [];
  const head = update.headline ?? v.label;
  return {
    kind: "verdict", id: `${jobId}/verdict`, label, description,
    tooltip: [description === undefined ? head : `${head} — ${description}`, ...why].join("\n"), icon: v.icon,
    iconColor: v.color, ariaLabel: description === undefined ? label : `${label}: ${description}`, jobId, children: [],
  };
}

const SECTION_ICONS: Record<CoverageKey, { icon: string; color?: string }> = {
  missing: { icon: "warning", color: "list.warningForeground" },
  checks: { icon: "checklist" },
  conventions: { icon: "symbol-numeric" },
  unchecked: { icon: "circle-slash" },
  notes: { icon: "note" },
};

const CHECK_ICONS: Record<CheckRecord["status"], { icon: string; color?: string }> = {
  agrees: { icon: "pass", color: "testing.iconPassed" },
  diverges: { icon: "error", color: "list.errorForeground" },
  inconclusive: { icon: "question", color: "list.warningForeground" },
  skipped: { icon: "dash" },
};

function coverageItem(jobId: string, section: ShownSection, i: number): SuspectNode {
  const { label, text } = section.items[i];
  const id = `${jobId}/coverage/${section.key}/${i}`;
  const line = label ? `${label}: ${text}` : text;
  const node: SuspectNode = {
    kind: "coverageItem", id, label: label || text, description: label ? text : undefined, tooltip: line,
    icon: section.key === "missing" ? "eye-closed" : section.key === "unchecked" ? "circle-outline" : "info",
    ariaLabel: line, jobId, children: [],
  };
  const check = section.checks?.[i];
  if (check !== undefined) {
    const { icon, color } = CHECK_ICONS[check.status] ?? { icon: "info" };
    node.icon = icon;
    node.iconColor = color;
    if (check.missing?.length) node.tooltip = [line, ...check.missing.map((m) => `• ${m}`)].join("\n");
  }
  const departure = section.conventions?.[i];
  if (departure !== undefined) {
    node.icon = "symbol-numeric";
    node.suspect = departure;
    node.location = classLocation(departure);
    node.tooltip = `${departure.target.module} (${departure.target.class}) — ${text}` +
      (departure.evidence ? `\n\n${departure.evidence}` : "");
  }
  return node;
}

/** One node per coverage section the server sent (coverage.ts: its titles and texts as they came), its items as
 * children: "Not observed", "Checks", "Departures from the reference's rounding", "Not checked (N)", "Notes". An
 * older server sends none: one "Coverage not sent by this server" node (key "notes") says so. */
export function coverageNodes(update: Pick<ReportUpdated, "jobId" | "report" | "coverage">): Map<CoverageKey, SuspectNode> {
  const { jobId, report } = update;
  const out = new Map<CoverageKey, SuspectNode>();
  const sections = coverage(update);
  if (sections === undefined) {
    out.set("notes", {
      kind: "coverage", id: `${jobId}/coverage/not-sent`, label: COVERAGE_NOT_SENT, tooltip: COVERAGE_NOT_SENT_WHY,
      icon: "info", ariaLabel: COVERAGE_NOT_SENT, jobId, children: [],
    });
    return out;
  }
  for (const section of sections) {
    const n = section.items.length;
    const { icon, color } = SECTION_ICONS[section.key] ?? { icon: "info" };
    const description = section.key === "unchecked" ? undefined : `${n}`;
    out.set(section.key, {
      kind: "coverage", id: `${jobId}/coverage/${section.key}`, label: section.title, description,
      tooltip: section.items.map(({ label, text }) => (label ? `${label}: ${text}` : text)).join("\n"),
      icon, iconColor: color, ariaLabel: description ? `${section.title}: ${description}` : section.title, jobId,
      children: section.items.map((_, i) => coverageItem(jobId, section, i)),
      // what was not observed never folds; the checks unfold when one of them could not look
      expanded: section.key === "missing" || (section.key === "checks" && report.verdict === "inconclusive"),
    });
  }
  return out;
}

/** The whole tree's roots: the verdict, what was not observed, the served configuration (when the report has one),
 * the suspects, then the rest of the coverage (checks, departures from the rounding, not checked, notes). */
export function treeNodes(
  update: Pick<ReportUpdated, "jobId" | "report" | "headline" | "coverage" | "coverageLine">,
): SuspectNode[] {
  const sections = coverageNodes(update);
  const pick = (...keys: CoverageKey[]) => keys.flatMap((k) => sections.get(k) ?? []);
  return [verdictNode(update), ...pick("missing"), ...servingNodes(update), ...suspectNodes(update),
    ...pick("checks", "conventions", "unchecked", "notes")];
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
      const n = (r.suspects ?? []).length;
      return `Divergent: ${n} suspect${n === 1 ? "" : "s"}, most likely root cause first${what}`;
    }
    case "consistent":
      return `Consistent: no component departs from the reference beyond the threshold (${r.threshold ?? "?"})${what}`;
    case "inputs-differ":
      return `Inputs differ: the token ids differ before the model runs (BOS, chat template?)${what}`;
    case "inconclusive":
      return `Inconclusive: the diagnosis could not observe what a verdict needs (see Not observed)${what}`;
    default:
      return `${String(r.verdict)}${what}`;
  }
}

/** Finds the suspect a `{jobId, module}` (code lens) or `{rank}` argument names in a report. */
export function findSuspect(report: Report, module?: string, rank?: number): Suspect | undefined {
  return (report.suspects ?? []).find(
    (s) => (module !== undefined && s.target.module === module) || (rank !== undefined && s.rank === rank),
  );
}
