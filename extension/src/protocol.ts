// TypeScript side of the contracts in DESIGN.md ("Contracts other tools rely on") and server/protocol.py.
// Types and names only: no 'vscode' import.

/** Server commands (LSP workspace/executeCommand). */
export const SERVER_DIAGNOSE_COMMAND = "ekka.server.diagnose";
export const SERVER_CANCEL_COMMAND = "ekka.server.cancel";
export const SERVER_CLEAR_COMMAND = "ekka.server.clear";

/** Client command the server's code lenses invoke, with `{jobId, module}`. */
export const SHOW_DIVERGENCE_COMMAND = "ekka.showDivergence";

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
