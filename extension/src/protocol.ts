// TypeScript side of the contracts in DESIGN.md ("Contracts other tools rely on") and server/protocol.py.
// Types and names only: no 'vscode' import.

/** Server commands (LSP workspace/executeCommand). */
export const SERVER_DIAGNOSE_COMMAND = "ekka.server.diagnose";
export const SERVER_CANCEL_COMMAND = "ekka.server.cancel";
export const SERVER_CLEAR_COMMAND = "ekka.server.clear";

/** Client command the server's code lenses invoke, with `{jobId, module}`. */
export const SHOW_DIVERGENCE_COMMAND = "ekka.showDivergence";
/** Client command of the release-bisection code lenses, with `{jobId, symbol?}`: the report's `bisect` diffs. */
export const SHOW_RELEASE_DIFF_COMMAND = "ekka.showReleaseDiff";

/** Custom notifications (server → client). */
export const REPORT_UPDATED_NOTIFICATION = "ekka/reportUpdated";
export const JOB_STATE_NOTIFICATION = "ekka/jobState";

/** LSP error code RequestFailed: `ekka.server.diagnose` answers it (with `data.jobId`) while a job runs. */
export const REQUEST_FAILED = -32803;

export type Verdict = "divergent" | "consistent" | "inputs-differ";

export interface SuspectTarget {
  module: string;
  class: string;
  file?: string | null;
  line?: number | null;
  forward_file?: string | null;
  forward_line?: number | null;
  call_file?: string | null;
  call_line?: number | null;
}

export interface Suspect {
  rank: number;
  target: SuspectTarget;
  reference?: { modules: string[] };
  /** null: an enclosing module that was not itself compared. */
  error_ratio: number | null;
  input_ratio?: number | null;
  onset_token: number | null;
  onset_phase?: string | null;
  evidence?: string;
}

export interface SeriesPoint {
  component: string;
  class: string;
  error_ratio: number | null;
  input_ratio: number | null;
}

export interface HeatMap {
  /** Decoder layers (module paths), one row each. */
  layers: string[];
  /** Token positions, one column each. */
  positions: number[];
  /** ratios[layer][position]; null where that layer has no value at that position. */
  ratios: (number | null)[][];
}

export interface Plots {
  /** Compared components in execution order. */
  series: SeriesPoint[];
  /** Index into `series` of the first sustained divergence, or null. */
  change_point: number | null;
  threshold: number;
  heatmap: HeatMap;
}

/** One compared position of a symptom check (logits level). */
export interface PositionRatio {
  request: number;
  position: number;
  ratio: number;
  token_matches_reference?: boolean;
}

/** A symptom check: one engine run's logits against the reference (ekka_core/contracts/serving.py). */
export interface SymptomCheck {
  label: string;
  ratio: number | null;
  diverges: boolean;
  threshold?: number;
  positions?: PositionRatio[];
  first?: PositionRatio | null;
  cached_tokens?: number;
  same_dtype?: number | null;
  note?: string;
  rerouted_tokens?: number;     // MoE: tied tokens the second noise floor routed to their next expert
}

/** One engine argument the traced run sets differently from the served configuration. */
export interface ConfigChange {
  arg: string;
  served: unknown;
  traced: unknown;
  why: string;
}

/** One configuration triage tried: the traced baseline plus the served `factors`. */
export interface Trial {
  factors: string[];
  args?: Record<string, unknown>;
  /** null: the configuration could not run (`error` says why). */
  ratio: number | null;
  diverges: boolean | null;
  seconds?: number;
  error?: string | null;
}

export interface Triage {
  served?: SymptomCheck | null;
  baseline?: SymptomCheck | null;
  differing?: Record<string, { served: unknown; baseline: unknown }>;
  ruled_out?: Record<string, string>;
  trials?: Trial[];
  culprit?: string[];
  direction?: string;
  words?: string;
  traced_under?: string[];
  untraceable?: string[];
}

/** report.json `serving`: the served configuration, its symptom check, what tracing changed, triage. */
export interface Serving {
  served_args?: Record<string, unknown> | null;
  served_resolved?: Record<string, unknown> | null;
  served?: SymptomCheck | null;
  traced?: SymptomCheck | null;
  traced_args?: Record<string, unknown> | null;
  changes?: ConfigChange[] | null;
  triage?: Triage | null;
}

/** One symbol whose source differs between the last good and the first bad release. */
export interface BisectChange {
  symbol: string;
  kind?: string;
  status?: string;
  file_good?: string | null;
  line_good?: number | null;
  file_bad?: string | null;
  line_bad?: number | null;
  unified_diff?: string;
}

/** report.json `bisect`, schema "ekka.bisect/1" (ekka_core/bisect). */
export interface Bisect {
  schema?: string;
  outcome?: string;
  last_good?: string | null;
  first_bad?: string | null;
  tried?: { label: string; verdict: string; top_suspect?: string | null; seconds?: number }[];
  suspect?: { module?: string; class?: string; file?: string | null; line?: number | null } | null;
  changes?: BisectChange[];
  custom_ops?: string[];
  note?: string;
  fix?: { last_bad?: string; first_good?: string; changes?: BisectChange[]; note?: string } | null;
}

/** `OUTDIR/report.json`, schema "ekka.report/1". */
export interface Report {
  schema: string;
  verdict: Verdict;
  suspects: Suspect[];
  threshold?: number;
  dtype?: string;
  checked?: number;
  notes?: string[];
  plots?: Plots;
  inputs_differ?: unknown[];
  serving?: Serving | null;
  bisect?: Bisect | null;
}

/** Payload of `ekka/reportUpdated`. */
export interface ReportUpdated {
  jobId: string;
  report: Report;
  paths?: { json?: string; md?: string; html?: string } | null;
  out_dir?: string | null;
  uri?: string | null;
}

export type JobStateName = "queued" | "running" | "done" | "failed" | "cancelled";
export const FINAL_STATES: readonly JobStateName[] = ["done", "failed", "cancelled"];

/** Payload of `ekka/jobState` (the server's job record). */
export interface JobState {
  jobId: string;
  state: JobStateName;
  stage: string | null;
  percent?: number;
  message?: string;
  uri?: string | null;
  out_dir?: string | null;
  pid?: number | null;
  exit_code?: number | null;
  error?: { message: string; fix?: string | null; exit_code: number } | null;
  verdict?: Verdict | null;
}

export function isFinal(state: JobStateName): boolean {
  return FINAL_STATES.includes(state);
}

/** Argument of `ekka.server.diagnose` as the extension sends it. */
export interface DiagnoseArgs {
  uri: string;
  /** EKKA_* variables for the engine (tests and benchmarks only, e.g. EKKA_INJECT_BUG). */
  env?: Record<string, string>;
}
